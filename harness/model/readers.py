"""The mask's readers: where attention finds request b's rows after the writer is done.

The writer lays the verify mask out in one place (``layouts``); attention reads it
through its own index arithmetic. Two readers of SGLang 0.5.23 (docs/sglang-target.md, readers):

- the Triton attention backend walks a FULL_MASK through ``mask_indptr``, request
  b's rows being ``mask[indptr[b]:indptr[b+1]]``, in its eager target-verify
  metadata and in its cuda-graph replay, where the step's mask is first copied
  into the backend's own preallocated buffer;
- FlashInfer's cuda-graph verify packs the mask to bits (row b's kv_len_b * d
  cells, LSB first, at byte ``packed_indptr[b]``) into its preallocated
  custom-mask buffer, refusing on the host a batch whose total does not fit;
  its plan is handed each request's query rows, KV rows (the prefix and the
  draft tokens) and KV slots (``expected_plan``).

This module holds what every target hands back from those seams; the embedded
model of the readers is ``vmfuzz.harness.targets.reference.readers``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode


@dataclass
class ReaderView:
    """What the Triton backend's target-verify metadata holds after eager set-up or a replay.

    Request b's mask cells are ``mask[indptr[b]:indptr[b+1]]`` (``indptr`` is
    ``mask_indptr``); its d query rows ``qo_indptr[b]:qo_indptr[b+1]``; its KV
    slots ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``. On a replay the arrays
    run to the captured bs, padding rows included.
    """

    mask: torch.Tensor
    indptr: torch.Tensor  # mask_indptr: at least bs + 1 cell offsets into ``mask``
    #: the graph's batch size when a replay padded the batch up to it (None: eager)
    captured_bs: int | None = None
    qo_indptr: torch.Tensor = field(kw_only=True)
    kv_indptr: torch.Tensor = field(kw_only=True)
    #: the whole buffer the KV gather wrote (None: this target's gather is not driven)
    kv_indices: torch.Tensor | None = field(kw_only=True)
    max_extend_len: int = field(kw_only=True)
    #: what a sliding-window server's backend holds beside these (None: built without a window)
    window: "WindowView | None" = field(default=None, kw_only=True)


@dataclass(frozen=True)
class WindowView:
    """The sliding-window half of the Triton backend's verify metadata, for a server with window ``size``.

    Its sliding-window layers read request b's last min(s_b, size) prefix tokens:
    the KV slots ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``, whose mask cells
    start at column ``kv_offsets[b]`` of each of the request's mask rows. So a
    wrong offset makes those layers read another token's mask column, though the
    full layers read right.
    """

    size: int
    kv_indptr: torch.Tensor | None  # None: the backend made no window metadata, which is wrong here
    #: the whole buffer the window's KV gather wrote (None: this target's gather is not driven)
    kv_indices: torch.Tensor | None
    kv_offsets: torch.Tensor | None


@dataclass(frozen=True)
class PlanRead:
    """One array on the way to FlashInfer's verify plan, as it was handed on.

    ``quantity`` says what it must hold (``expected_plan``'s field: qo_indptr,
    kv_indptr, kv_lens, kv_indices, kv_last_page_len, or custom_mask); ``name``
    is what the code under test calls it there; ``writer`` who produced it.
    """

    writer: str
    name: str
    quantity: str
    values: torch.Tensor


@dataclass
class PackedView:
    """A bit-packed mask: request b's bytes start at ``buffer[indptr[b]]``."""

    buffer: torch.Tensor  # uint8, the whole preallocated packed buffer
    indptr: torch.Tensor  # bs + 1 byte offsets, as the reader will read them
    #: what the plan was handed, upstream first (None: this target does not drive the plan)
    plan: list[PlanRead] | None = field(default=None, kw_only=True)
    #: redzone hits of the plan's KV gather, and the function whose gather it was
    plan_overruns: list = field(default_factory=list, kw_only=True)
    plan_gatherer: str = field(default="", kw_only=True)
    #: (cells handed in, cells handed on) when the plan's mask is a new tensor, not the mask the verify
    #: step handed in (None: handed on in place, or not driven). Growing is the fallback for a mask too
    #: short for the batch; growing one that already covers it copies the whole mask every verify step.
    mask_regrown: tuple[int, int] | None = field(default=None, kw_only=True)
    #: what a later hop raised after the earlier ones handed their arrays on (None: the plan was made).
    #: Those arrays are judged before the raise is passed on: a wrong one is the raise's cause, and a
    #: finding naming the hop that handed it on says where, which the raise cannot.
    raised: Exception | None = field(default=None, kw_only=True)


class PackRefused(AssertionError):
    """The packer's host-side check refused a batch whose packed mask does not fit.

    An AssertionError because that is what SGLang's check raises; a target's
    ``pack_mask`` refuses with an AssertionError of either kind.
    """


def reader_config(config: Config) -> Config:
    """The config a reader sees: the same deployment with its mask read, in FULL_MASK.

    Both readers exist only for read masks on CUDA, where SGLang's default read
    layout is FULL_MASK; a QLEN_ONLY case is run in the layout the readers meet.
    """
    if config.mode == TreeMaskMode.FULL_MASK and config.is_read:
        return config
    return Config(TreeMaskMode.FULL_MASK, config.max_bs, config.max_context_len, config.num_draft_tokens,
                  config.topk, config.spec_steps, True)


def capture_seq_len(config: Config) -> int:
    """seq_len of every request while a cuda graph is captured (SGLang fills 1).

    Capped at the context limit: a deployment whose context is shorter than
    the fill could not have captured at all.
    """
    return min(1, config.max_context_len)


def captured_bs(bs: int, max_bs: int) -> int:
    """The captured graph a batch of ``bs`` replays in: the smallest captured size >= bs.

    Modelled on a typical capture list (1, 2, 4, 8, ... and max_bs itself); a
    replay pads the batch up to it with requests at the fill length.
    """
    size = 1
    while size < bs:
        size *= 2
    return min(size, max_bs)


# -- what the metadata must hold, from the meaning ------------------------------

def pool_slots(rows: int) -> list[int]:
    """The request-pool slot of each request of a batch of ``rows`` (replay padding included).

    Handed out last first, so a reader that takes a request's place in the batch
    for its pool slot gathers another request's KV.
    """
    return list(range(rows - 1, -1, -1))


def kv_slot_stride(max_context_len: int) -> int:
    """Room per pool slot in the stand-in request-to-token table: a power of ten past any token."""
    return 10 ** len(str(max(max_context_len, 1)))


def kv_slot(pool_slot: int, token: int, max_context_len: int) -> int:
    """The KV slot the stand-in request-to-token table holds for ``token`` of the request in ``pool_slot``.

    Distinct per (request, token) and never negative, so a gather of another
    request's slots, of the wrong tokens, or of nothing (stale, negative) shows.
    """
    return (pool_slot + 1) * kv_slot_stride(max_context_len) + token


def kv_slot_table(pool: int, max_context_len: int, device="cpu") -> torch.Tensor:
    """The stand-in request-to-token table itself: row p, column t holds ``kv_slot(p, t, max_context_len)``,
    one row per pool slot, a column per token a request may hold (int32, as SGLang keeps the table)."""
    stride = kv_slot_stride(max_context_len)
    rows = (torch.arange(pool, dtype=torch.int64).unsqueeze(1) + 1) * stride
    return (rows + torch.arange(max(max_context_len, 1), dtype=torch.int64)).to(torch.int32).to(device)


def stale_kv_indices(n: int, device) -> torch.Tensor:
    """What a KV-index buffer holds before the gather: negatives, which no KV slot is."""
    return -1 - torch.arange(n, dtype=torch.int64, device=device)


def _cumsum(lengths) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


@dataclass(frozen=True)
class ExpectedReads:
    """What the metadata must hold for a batch, eager or padded to a captured ``rows``.

    The pointer lists are those of every row at its own length. A padding row
    (index >= ``real``) is a request no one reads the output of: it may be
    empty (its pointer repeats) or its fill length, so long as it starts after
    the last real request and keeps to the buffers, so no real request's cells
    are ever read as its.
    """

    real: int
    rows: int
    seq_lens: tuple[int, ...]  # padded to ``rows``
    d: int
    qo_indptr: list[int]
    kv_indptr: list[int]
    mask_indptr: list[int]
    kv_indices: list[int]  # the real requests' slots, in order
    max_extend_len: int

    def row_lengths(self, pointer: str) -> list[int]:
        """Each row's own length in ``pointer``'s units (query rows, KV tokens, mask cells)."""
        p = getattr(self, pointer)
        return [p[r + 1] - p[r] for r in range(self.rows)]


def expected_reads(config: Config, batch: Batch, rows: int | None = None) -> ExpectedReads:
    """Request b reads d query rows, its s_b prefix tokens' KV slots, and d x (s_b + d) mask cells,
    the requests one after another; ``rows`` > bs pads with requests at the fill length."""
    d, real = config.d, batch.bs
    rows = real if rows is None else rows
    seq = tuple(batch.seq_lens) + (capture_seq_len(config),) * (rows - real)
    slots = pool_slots(rows)
    return ExpectedReads(
        real, rows, seq, d,
        qo_indptr=_cumsum([d] * rows),
        kv_indptr=_cumsum(seq),
        mask_indptr=_cumsum([d * (s + d) for s in seq]),
        kv_indices=[kv_slot(slots[b], t, config.max_context_len) for b in range(real) for t in range(seq[b])],
        max_extend_len=d)


def sliding_window(batch: Batch) -> int:
    """The window a batch's sliding-window read is judged with: its median prefix length less one, at
    least 1, so some requests' windows start inside their prefix and others hold the whole of it."""
    return max(1, sorted(batch.seq_lens)[batch.bs // 2] - 1) if batch.bs else 1


@dataclass(frozen=True)
class ExpectedWindow:
    """What a sliding-window read must hold: row r's last min(s_r, size) prefix tokens (``ExpectedReads``'s
    rows; a padding row may be empty or its own length, as there)."""

    real: int
    rows: int
    seq_lens: tuple[int, ...]
    size: int
    window_kv_indptr: list[int]
    window_kv_offsets: list[int]  # the first windowed token of each row, which is its first mask column
    window_kv_indices: list[int]  # the real requests' windowed slots, in order

    row_lengths = ExpectedReads.row_lengths  # the same rows: each one's own length in a pointer's units


def expected_window(want: ExpectedReads, size: int, max_context_len: int) -> ExpectedWindow:
    """Row r reads its tokens [s_r - min(s_r, size), s_r): the last ``size`` of its prefix, or all of it."""
    lens = [min(s, size) for s in want.seq_lens]
    slots = pool_slots(want.rows)
    return ExpectedWindow(
        want.real, want.rows, want.seq_lens, size, window_kv_indptr=_cumsum(lens),
        window_kv_offsets=[s - n for s, n in zip(want.seq_lens, lens)],
        window_kv_indices=[kv_slot(slots[b], t, max_context_len) for b in range(want.real)
                           for t in range(want.seq_lens[b] - lens[b], want.seq_lens[b])])


@dataclass(frozen=True)
class ExpectedPlan:
    """What FlashInfer's cuda-graph verify plan must be handed for a batch (page size 1)."""

    qo_indptr: list[int]
    kv_lens: list[int]
    kv_indptr: list[int]
    kv_indices: list[int]
    kv_last_page_len: list[int]


def plan_kv_span(config: Config) -> int:
    """Tokens a request's KV row can hold in the verify plan: its prefix and the d draft tokens."""
    return config.max_context_len + config.d


def expected_plan(config: Config, batch: Batch) -> ExpectedPlan:
    """Request b reads d query rows and the KV of its s_b prefix tokens and its d draft tokens (pages of
    one token, so each last page holds one), the requests one after another, from its own pool slot."""
    d = config.d
    lens = [s + d for s in batch.seq_lens]
    slots = pool_slots(batch.bs)
    span = plan_kv_span(config)
    return ExpectedPlan(
        qo_indptr=_cumsum([d] * batch.bs), kv_lens=lens, kv_indptr=_cumsum(lens),
        kv_indices=[kv_slot(slots[b], t, span) for b in range(batch.bs) for t in range(lens[b])],
        kv_last_page_len=[1] * batch.bs)
