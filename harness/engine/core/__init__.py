"""How every room runs one check: isolation, failures, signals, and what a check's process records."""
