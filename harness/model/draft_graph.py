"""What a draft-decode cuda graph's static buffers must hold, from the meaning alone.

A draft-decode server (topk ``k``, ``n`` draft steps, context length ``C``,
KV pages of ``P`` tokens) captures graphs for batches of up to ``max_bs``
requests. A replay at bucket ``B`` runs ``B`` requests (``raw_bs`` real ones,
the rest padding at the fill length ``f``), each drafting ``k`` branches:

* per request: its length, its request-pool row, its ``k`` candidate scores
  and tokens, one hidden state;
* per branch: one token id and one position per step's forward;
* per step and branch: one KV slot written (``B·k·n`` slots in all);
* per step ``i`` (``i = 0 .. n-1``, the kernel fills every step's row) the KV
  ids each branch attends: its request's prefix ``s_b`` plus the ``i + 1``
  draft tokens of its own chain, so ``k·Σ_b (s_b + i + 1)`` ids, laid out one
  branch after another, and ``B·k + 1`` offsets into them.

A model with window layers (sliding window ``W``) reads, in those layers, only
the last ``W`` of what a branch attends (``window_reads``): per step row up to
``B·k·W`` ids, and ``B·k + 1`` offsets. On a server whose pool keeps those
layers' KV apart (``window_pool``), each such id, and each window-layer write,
is the window slot of the full slot it stands for (``window_slot``).

The worst a captured graph must hold is the largest bucket with every request
at the context limit (``s_b = C``). Nothing here reads SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd


@dataclass(frozen=True)
class DraftShape:
    """One draft-decode server's numbers."""

    topk: int
    steps: int
    draft_tokens: int
    context_len: int
    page_size: int = 1
    #: the draft model's sliding window (its window layers read the last ``window`` of what a branch attends;
    #: 0: a model with no window layers)
    window: int = 0
    #: the server's KV pool keeps the window layers' KV apart (a hybrid pool, SGLang's ``SWAKVPool``): their
    #: reads and writes then name window slots (``window_slot`` of the full slot), not full ones
    window_pool: bool = False
    #: the server samples its chain drafts for rejection sampling under deterministic inference: each
    #: request's draw is keyed by its own sampling seed, copied into the graph's seed buffer before a replay
    seeded_sampling: bool = False

    @property
    def pages_per_branch(self) -> int:
        """The most KV pages one branch's ``n`` draft slots can straddle."""
        return -(-(self.page_size - 1 + self.steps) // self.page_size)

    @property
    def row_width(self) -> int:
        """Columns of a ``req_to_token`` row the driver gives each request: the context, then room for
        every branch's draft pages past it (the row's own soundness is kv-location-soundness's)."""
        return self.context_len + self.topk * self.pages_per_branch * self.page_size + self.page_size + 4


def kv_ids_needed(shape: DraftShape, seq_lens: list[int], step: int) -> int:
    """KV ids step ``step``'s row must hold: each branch's prefix, then its ``step + 1`` chain tokens."""
    return shape.topk * sum(s + step + 1 for s in seq_lens)


def footprints(shape: DraftShape, bucket: int, hidden: int, seq_lens: list[int] | None = None) -> dict[str, int]:
    """Cells each static buffer needs for a replay at ``bucket`` (``seq_lens``: the bucket's lengths,
    padding included; every request at the context limit when not given). ``kv_indices`` is per step
    row: the largest row, the last step's; ``kv_indptr`` per step row too."""
    k, n = shape.topk, shape.steps
    lens = seq_lens if seq_lens is not None else [shape.context_len] * bucket
    window = {"window_kv_indices": bucket * k * shape.window, "window_kv_indptr": bucket * k + 1} if shape.window else {}
    return window | {
        "input_ids": bucket * k, "positions": bucket * k, "out_cache_loc": bucket * k * n,
        "req_pool_indices": bucket, "seq_lens": bucket, "seq_lens_cpu": bucket,
        "topk_p": bucket * k, "topk_index": bucket * k, "hidden_states": bucket * hidden,
        "kv_indices": max(kv_ids_needed(shape, lens, i) for i in range(n)),
        "kv_indptr": bucket * k + 1,
    }


def window_reads(attended: tuple[int, ...], window: int) -> tuple[int, ...]:
    """What a window layer of a branch reads, given what the branch attends (its prefix, then its own
    chain, oldest first): the last ``window`` of them, in the same order."""
    return tuple(attended[-window:]) if window > 0 else ()


def chain_column(shape: DraftShape, s: int, t: int, i: int) -> int:
    """The row column branch ``t`` of a request of length ``s`` writes at draft step ``i``: one branch after
    another from ``s``, or, for a paged tree (P > 1, topk > 1), in whole pages of its own after the
    prefix's last page (``model.kv_locations``' draft column)."""
    from vmfuzz.harness.model.kv_locations import branch_pages
    k, n, p = shape.topk, shape.steps, shape.page_size
    if p == 1 or k == 1:
        return s + t * n + i
    tail = s % p
    return (s - tail) + t * branch_pages(p, n, tail) * p + tail + i


def branch_read_columns(shape: DraftShape, s: int, t: int, step: int) -> list[int]:
    """The row columns branch ``t`` attends at draft step ``step``: the prefix, then its chain so far."""
    return list(range(s)) + [chain_column(shape, s, t, j) for j in range(step + 1)]


def window_slot(full, slots: int):
    """The window slot of full slot ``full`` (an int or a tensor of them) in a hybrid pool of ``slots`` full
    slots: the sink (0) stays the sink; every other slot moves by a stride coprime with ``slots - 1``, so the map
    is one to one and, as a window sub-pool no larger than the full one keeps its ids, inside the pool (a row
    translated twice still indexes the map: what it then names is wrong, not out of bounds)."""
    span = max(1, slots - 1)
    stride = next(a for a in range(5, span + 6) if gcd(a, span) == 1)
    moved = ((full - 1) * stride + 3) % span + 1 if span > 1 else full
    return moved * (full > 0) if not isinstance(full, int) else (moved if full > 0 else 0)
