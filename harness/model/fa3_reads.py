"""What FlashAttention's topk > 1 target-verify metadata holds, and the stand-in KV slots it reads.

FA3 does not read the tree mask cell by cell. For a topk > 1 verify it splits
each request's attention in two and merges the results: a prefix pass (request
b's d query rows over its s_b prefix tokens, no mask) and an expand pass, one
query row per draft node, each over only the tree nodes that node may see. The
expand pass's per-row KV length and page table are what the backend extracts
from the mask; this module holds both passes' metadata as a target hands it
back (``Fa3Verify``) and the KV slot each (request, token) has in the stand-in
request-to-token table a target builds, so a reader of the wrong request, token
or row shows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.model.config import Config
from harness.model.readers import kv_slot


@dataclass
class Fa3Pass:
    """One attention pass: row r's queries ``cu_seqlens_q[r]:cu_seqlens_q[r+1]`` read its first
    ``cache_seqlens[r]`` entries of ``page_table[r]`` (KV slots); ``cu_seqlens_k`` runs over those."""

    cache_seqlens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    page_table: torch.Tensor
    max_seq_len_q: int


@dataclass
class Fa3Verify:
    """FA3's metadata for one topk > 1 TARGET_VERIFY batch: the prefix pass (a row per request)
    and the expand pass (a row per (request, draft node), request-major); on a replay, padding
    requests follow the batch's."""

    prefix: Fa3Pass
    expand: Fa3Pass
    #: a cuda-graph replay's rows: the batch padded up to the captured graph's bs (None: eager)
    graph_bs: int | None = None


def table_width(config: Config) -> int:
    """Tokens per row of the stand-in request-to-token table: a full context plus the draft."""
    return config.max_context_len + config.d


def table_slot(pool_slot: int, token: int, config: Config) -> int:
    """The KV slot the stand-in table holds for ``token`` of the request in ``pool_slot``: distinct
    per (request, token) for every token a verify reads, its draft tokens past the context too."""
    return kv_slot(pool_slot, token, table_width(config))
