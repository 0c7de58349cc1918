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
