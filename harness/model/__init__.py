"""What a case is and what it means: configs, layouts, trees, the oracle, limits and the files that carry them."""
