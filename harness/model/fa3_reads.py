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

At a page size P > 1 the KV cache is paged and the prefix pass's page table
lists pages, not slots: the first ceil(s_b / P) entries of row b are the pages
that hold request b's tokens 0 .. s_b - 1, in order (page j holds tokens
j * P .. j * P + P - 1, so it is the slot of token j * P, divided by P), its
``cache_seqlens`` still s_b tokens. The expand pass reads the cache as pages of
one token whatever P is: its page table holds the draft nodes' KV slots, as at
P = 1. The stand-in table is page-contiguous, as a paged allocator gives: each
request's pages start at a multiple of P, token t at that base + t.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmfuzz.harness.model.config import Config
from vmfuzz.harness.model.readers import kv_slot


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
    """FA3's metadata for one TARGET_VERIFY batch: at topk > 1 the prefix pass (a row per request)
    and the expand pass (a row per (request, draft node), request-major), at topk 1 one causal
    pass; on a replay, padding requests follow the batch's."""

    prefix: Fa3Pass  # at topk 1 the one causal pass: a row per request over its prefix and draft tokens
    expand: Fa3Pass | None  # None: topk 1, no tree to expand
    #: a cuda-graph replay's rows: the batch padded up to the captured graph's bs (None: eager)
    graph_bs: int | None = None
    #: what the replay raised after the capture bound these buffers (None: it ran). Only what the capture
    #: bound is judged then (the rows each buffer spans): a wrong span is the raise's cause, and a
    #: finding that names it says where, which the raise cannot
    raised: Exception | None = None
    #: on a windowed server at topk > 1, the merged pass its windowed layers read: a row per (request,
    #: draft node) over the request's prefix and then the tree nodes that node sees (None: not windowed)
    window: Fa3Pass | None = None
    #: on a ragged chain server, how many draft tokens each request verifies (None: all d)
    verify_lens: tuple[int, ...] | None = None


def table_width(config: Config) -> int:
    """Tokens per row of the stand-in request-to-token table: a full context plus the draft."""
    return config.max_context_len + config.d


def table_slot(pool_slot: int, token: int, config: Config, page_size: int = 1) -> int:
    """The KV slot the stand-in table holds for ``token`` of the request in ``pool_slot``: distinct
    per (request, token) for every token a verify reads, its draft tokens past the context too. At a
    ``page_size`` > 1 each request's slots start on a page boundary, so its tokens fill whole pages
    of their own."""
    first = kv_slot(pool_slot, 0, table_width(config))
    return -(-first // page_size) * page_size + token


def prefix_pages(pool_slot: int, seq_len: int, config: Config, page_size: int) -> list[int]:
    """The pages holding tokens 0 .. ``seq_len`` - 1 of the request in ``pool_slot``, in token order:
    at page size 1 their KV slots."""
    return [table_slot(pool_slot, j * page_size, config, page_size) // page_size
            for j in range(-(-seq_len // page_size))]


#: where the stand-in sliding-window pool's slots start: past every full-pool slot a verify reads, so an id
#: left untranslated is never a sliding-window id
SWA_BASE = 1 << 16


def swa_slot(full_slot: int) -> int:
    """The sliding-window pool's slot for the token in full-pool slot ``full_slot``, in the stand-in hybrid
    pool of a windowed server: a spread-out map, so a translated page id or an untranslated slot shows."""
    return SWA_BASE + 3 * full_slot
