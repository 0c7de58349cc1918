"""Where each layout puts each request's cells, by arithmetic alone.

Everything here is integer math over ``seq_lens``: no tensor is allocated, so the
same functions answer for a toy batch and for a 1M-token, 1024-request deployment.
The kernel and the oracle both take their cell addresses from here only through
``block_start``/``row_stride``, which keeps "where a request lives" defined once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence


class TreeMaskMode(enum.IntEnum):
    """Mirrors SGLang's ``TreeMaskMode`` values, so an int crosses the boundary unchanged."""

    FULL_MASK = 0
    QLEN_ONLY = 1
    QLEN_ONLY_BITPACKING = 2

    @classmethod
    def parse(cls, name: str) -> "TreeMaskMode":
        try:
            return cls[name]
        except KeyError:
            known = ", ".join(m.name for m in cls)
            raise ValueError(f"unknown layout {name!r} (known: {known})") from None


#: Layouts a preallocated verify mask can take. Bit-packed masks are never
#: preallocated: SGLang's sizing refuses them rather than over-allocate.
PREALLOCATED_LAYOUTS = (TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY)


def row_stride(mode: TreeMaskMode, seq_len: int, d: int) -> int:
    """Cells between the starts of two consecutive draft rows of one request."""
    if mode == TreeMaskMode.FULL_MASK:
        return seq_len + d
    if mode == TreeMaskMode.QLEN_ONLY:
        return d
    return 1


def block_start(mode: TreeMaskMode, prefix_sum: int, b: int, d: int) -> int:
    """First cell of request ``b``'s block; ``prefix_sum`` is s_0 + ... + s_{b-1}."""
    if mode == TreeMaskMode.FULL_MASK:
        return d * prefix_sum + d * d * b
    if mode == TreeMaskMode.QLEN_ONLY:
        return d * d * b
    return d * b


def block_size(mode: TreeMaskMode, seq_len: int, d: int) -> int:
    return d * row_stride(mode, seq_len, d)


def logical_size(mode: TreeMaskMode, seq_lens: Sequence[int], d: int) -> int:
    """Cells a batch occupies: the kernel's writes plus the prefix it leaves to the fill."""
    bs = len(seq_lens)
    return block_start(mode, sum(seq_lens), bs, d)


def worst_case_size(mode: TreeMaskMode, bs: int, d: int, max_context_len: int) -> int:
    """Footprint of ``bs`` requests that each sit at the context limit.

    This is the number a capacity check must guard: any real batch of ``bs``
    requests is at most this large, because every s_b <= max_context_len.
    """
    # Same sum as logical_size([max_context_len] * bs), in O(1): verify-policy asks
    # this for every bs up to 4096 across a production grid.
    return block_start(mode, bs * max_context_len, bs, d)


@dataclass(frozen=True)
class Extent:
    """A half-open cell range ``[start, stop)`` that belongs to one request."""

    request: int
    start: int
    stop: int


def request_extents(mode: TreeMaskMode, seq_lens: Sequence[int], d: int) -> list[Extent]:
    out, prefix = [], 0
    for b, s in enumerate(seq_lens):
        start = block_start(mode, prefix, b, d)
        out.append(Extent(b, start, start + block_size(mode, s, d)))
        prefix += s
    return out


def request_at(mode: TreeMaskMode, seq_lens: Sequence[int], d: int, offset: int) -> int | None:
    """The request whose block would hold cell ``offset``, None when outside every block.

    Used to attribute an out-of-bounds write: the offset is past the buffer, yet
    still inside the block of the request the kernel was writing.
    """
    for ext in request_extents(mode, seq_lens, d):
        if ext.start <= offset < ext.stop:
            return ext.request
    return None
