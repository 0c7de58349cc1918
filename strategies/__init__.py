"""Hypothesis strategies for verify-mask configurations, batches, draft trees and deployments.

Every public strategy validates its arguments up front (``InvalidArgument`` with
a message naming the argument) and shrinks toward the smallest configuration:
max_bs 1, two draft tokens, topk 1, one step, empty sequences, the simplest tree.
"""

from vmfuzz.strategies.batches import batch_sizes, batches, seq_lens, step_sequences
from vmfuzz.strategies.configs import chain_configs, configs, trivial_configs
from vmfuzz.strategies.trees import draft_trees

__all__ = ["batch_sizes", "batches", "chain_configs", "configs", "draft_trees", "seq_lens", "step_sequences", "trivial_configs"]
