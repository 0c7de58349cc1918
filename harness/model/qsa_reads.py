"""What Qwen's sparse-attention (QSA) backend reads for a TARGET_VERIFY batch.

QSA verifies only chains (topk = 1) and reads no tree mask: each verify row
(request b's draft node x, row b * d + x) attends causally over the first
``sequence_lengths[row]`` tokens of its request, found through
``row_req_pool_indices[row]`` (the request's pool slot) in
``token_slot_table[row]`` (that request's KV slots, token by token). So the
mask's meaning must be in those three: node x sees the prefix and exactly
its ancestors and itself. Its KV slots come from the stand-in request-to-token
table of ``model.fa3_reads`` (``table_slot``).

A cuda-graph replay reads the same three from the buffers its capture bound,
for the batch padded up to the captured graph's bs (``graph_bs``): rows past
the batch's are padding requests', whose reads are discarded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class QsaVerify:
    """QSA's per-row verify metadata, rows request-major (row b * d + x: request b's node x).
    ``graph_bs``: the captured bs of a cuda-graph replay's view (0: eager)."""

    sequence_lengths: torch.Tensor
    row_req_pool_indices: torch.Tensor
    token_slot_table: torch.Tensor
    graph_bs: int = 0
