"""Primitive strategies built once and shared.

Hypothesis resolves and validates a strategy object on its first draw; a
composite that writes ``st.integers(lo, hi)`` inside ``draw`` pays that for
every example, which made generation the slowest part of a case.
"""

from __future__ import annotations

from functools import lru_cache

from hypothesis import strategies as st

BOOLEANS = st.booleans()


@lru_cache(maxsize=4096)
def integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


@lru_cache(maxsize=64)
def sampled_from(values: tuple) -> st.SearchStrategy:
    return st.sampled_from(values)


def _powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
    out, p = [], 1
    while p <= hi:
        if p >= lo:
            out.append(p)
        p *= 2
    return tuple(out)


@lru_cache(maxsize=4096)
def edgy_integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    """Integers in [lo, hi] weighted to their edges: lo, hi, powers of two, one past them, then anything.

    Uniform draws over a wide range (a captured max_bs up to 256, d up to 16)
    almost never land on the values bugs cluster at: the top of a range, a
    capture size (a power of two), one past a power-of-two tile. Shrinks toward
    ``lo`` (the first branch), as ``integers`` does.
    """
    if hi - lo < 3:
        return integers(lo, hi)
    parts = [st.just(lo), st.just(hi)]
    pow2 = _powers_of_two(lo, hi)
    if pow2:
        parts.append(sampled_from(pow2))
    # One past 2^k is listed apart: the edge a tiled kernel's tail handling lives on.
    above = tuple(p + 1 for p in _powers_of_two(max(2, lo - 1), hi - 1))
    if above:
        parts.append(sampled_from(above))
    parts.append(integers(lo, hi))
    return st.one_of(*parts)
