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


def _pow2_edges(lo: int, hi: int) -> tuple[int, ...]:
    """2^k - 1, 2^k and 2^k + 1 inside [lo, hi]: where block and tile sizes change."""
    out, p = set(), 2
    while p - 1 <= hi:
        out.update(v for v in (p - 1, p, p + 1) if lo <= v <= hi)
        p *= 2
    return tuple(sorted(out))


@lru_cache(maxsize=4096)
def edgy_integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    """Integers in [lo, hi] weighted to their edges: lo, hi, powers of two +- 1, then anything.

    Uniform draws over a wide range (a captured max_bs up to 256, d up to 16)
    almost never land on the values bugs cluster at: the top of a range, a
    capture size, one past a power-of-two tile. Shrinks toward ``lo`` (the
    first branch), as ``integers`` does.
    """
    if hi - lo < 3:
        return integers(lo, hi)
    parts = [st.just(lo), st.just(hi)]
    edges = _pow2_edges(lo, hi)
    if edges:
        # Above 2^k is listed apart from the rest: "one past a tile" is the edge
        # a tiled kernel's tail handling lives on.
        above = tuple(v for v in edges if v > 2 and (v - 1) & (v - 2) == 0)
        if above:
            parts.append(sampled_from(above))
        parts.append(sampled_from(edges))
    parts.append(integers(lo, hi))
    return st.one_of(*parts)
