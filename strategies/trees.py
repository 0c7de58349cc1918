"""Draft trees built the way the EAGLE draft stage builds them."""

from __future__ import annotations

from functools import lru_cache

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from vmfuzz.harness.model.config import DraftTree, num_candidates
from vmfuzz.harness.model.trees import deepest, draft
from vmfuzz.strategies._validate import check_int


def draft_trees(topk: int, spec_steps: int, num_draft_tokens: int, *,
                adversarial: bool = True) -> st.SearchStrategy[DraftTree]:
    """Trees from the draft stage's selection over drawn per-candidate costs.

    Costs are small non-negative integers, so zero-cost children tie with their
    parent; with ``adversarial=True`` the tie-break order is drawn too, which
    produces selected nodes whose parent was not selected. Shrinks toward the
    breadth-first tree a hand-written repro gets.

    >>> draft_trees(topk=2, spec_steps=3, num_draft_tokens=6).example()  # doctest: +SKIP
    DraftTree(top_scores_index=(0, 1, 2, 3, 5), parent_list=(-1, 0, 1, 2, 3))
    """
    check_int("topk", topk, low=1)
    check_int("spec_steps", spec_steps, low=1)
    check_int("num_draft_tokens", num_draft_tokens, low=2)
    return _draft_trees(topk, spec_steps, num_draft_tokens, adversarial)


def _digits(value: int, n: int) -> list[int]:
    """``value`` read as ``n`` base-4 digits: one cost (or tie-break rank) in 0..3 each."""
    return [(value >> (2 * i)) & 3 for i in range(n)]


@lru_cache(maxsize=512)
def _draft_trees(topk: int, spec_steps: int, num_draft_tokens: int, adversarial: bool):
    # All n costs (and n tie-break ranks) come from one wide integer draw each:
    # a list of n small integers costs ~2n choices per tree, which dominated
    # generation time. Zero shrinks to all-zero costs, i.e. ids in order: the
    # breadth-first tree.
    n = num_candidates(topk, spec_steps)
    # refused here, where n is counted once (an error is never cached: each bad call raises)
    if num_draft_tokens - 1 > n:
        raise InvalidArgument(f"num_draft_tokens={num_draft_tokens} needs {num_draft_tokens - 1} candidates; "
                              f"topk={topk}, spec_steps={spec_steps} drafts {n}")
    wide = st.integers(0, 4 ** n - 1)
    ties = wide if adversarial else st.just(0)
    drawn = st.builds(lambda c, t: draft(topk, spec_steps, num_draft_tokens, _digits(c, n), _digits(t, n)),
                      wide, ties)
    # The deepest tree the config allows (a chain to depth spec_steps, when d
    # has room): random costs spread the selection over the shallow levels, so
    # the last level -- the walk's bound -- is rarely reached otherwise.
    return st.one_of(drawn, st.just(deepest(topk, spec_steps, num_draft_tokens)))
