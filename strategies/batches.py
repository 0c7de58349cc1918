"""Batches against a config: sizes around the captured max_bs, lengths around the context limit."""

from __future__ import annotations

from functools import lru_cache

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.trees import deepest
from vmfuzz.strategies._cached import BOOLEANS
from vmfuzz.strategies._validate import check_int
from vmfuzz.strategies.trees import draft_trees


def _check_config(config) -> Config:
    if not isinstance(config, Config):
        raise InvalidArgument(f"config={config!r} must be a vmfuzz.harness.model.config.Config")
    return config


def batch_sizes(max_bs: int, *, overshoot: int = 8) -> st.SearchStrategy[int]:
    """Batch sizes weighted to the boundary classes around ``max_bs``.

    1, max_bs, max_bs + 1, max_bs - 1, well past max_bs, and anything in
    ``[1, max_bs + overshoot]``. Shrinks toward 1, then toward max_bs, then
    max_bs + 1: a failure that needs an eager batch ends at the smallest one.

    >>> batch_sizes(8).example()  # doctest: +SKIP
    9
    """
    check_int("max_bs", max_bs, low=1)
    check_int("overshoot", overshoot, low=1)
    return _batch_sizes(max_bs, overshoot)


@lru_cache(maxsize=1024)
def _batch_sizes(max_bs: int, overshoot: int):
    return st.one_of(
        st.just(1), st.just(max_bs), st.just(max_bs + 1), st.just(max(1, max_bs - 1)),
        st.integers(2 * max_bs + 1, 2 * max_bs + overshoot),
        st.integers(1, max_bs + overshoot),
    )


def seq_lens(config: Config, bs: int) -> st.SearchStrategy[tuple[int, ...]]:
    """``bs`` sequence lengths, each weighted to 0, 1 and max_context_len."""
    _check_config(config)
    check_int("bs", bs, low=1)
    return _seq_lens(config.max_context_len, bs)


# Strategies are built once per shape and reused: constructing (and validating)
# fresh strategy objects for every example was most of the generation time.
@lru_cache(maxsize=4096)
def _seq_lens(c: int, bs: int):
    one = st.one_of(st.just(0), st.just(min(1, c)), st.just(c), st.integers(0, c))
    each = st.lists(one, min_size=bs, max_size=bs).map(tuple)
    if bs == 1:
        return each
    # Whole batches at the context limit are the worst case capacity is sized
    # for (docs/properties.md, capacity-soundness); drawn request by request they are
    # (1/4)^bs rare. Rows of different lengths are the other worst case: work sized
    # by the last row (or the first) instead of the longest shows only when they differ.
    return st.one_of(each, st.just((c,) * bs), st.just((0,) * bs), _mixed_rows(c, bs))


#: how a mixed batch orders its rows: longest first, shortest first, one long row among short ones
ROW_ORDERS = ("long before short", "short before long", "one outlier")


@lru_cache(maxsize=4096)
def _mixed_rows(c: int, bs: int):
    """Rows whose lengths differ, in one of ``ROW_ORDERS``: the long ones weighted to the limit."""
    if c < 1:
        return st.just((0,) * bs)

    @st.composite
    def build(draw) -> tuple[int, ...]:
        order = draw(st.sampled_from(ROW_ORDERS))
        long = draw(st.one_of(st.just(c), st.integers(1, c)))
        short = draw(st.lists(st.integers(0, long - 1), min_size=bs - 1, max_size=bs - 1))
        if order == "one outlier":
            at = draw(st.integers(0, bs - 1))
            return tuple(short[:at] + [long] + short[at:])
        rows = sorted(short + [long], reverse=order == "long before short")
        return tuple(rows)

    return build()


@lru_cache(maxsize=4096)
def _trees(topk: int, spec_steps: int, d: int, bs: int):
    each = st.lists(draft_trees(topk, spec_steps, d), min_size=bs, max_size=bs).map(tuple)
    if bs == 1:
        return each
    # A whole batch of the deepest tree: a kernel's per-batch depth bound is
    # reached only when every request's walk runs to spec_steps.
    return st.one_of(each, st.just((deepest(topk, spec_steps, d),) * bs))


@lru_cache(maxsize=4096)
def _batches(config: Config, bs, overshoot: int, trees: bool):
    sizes = st.just(bs) if bs is not None else batch_sizes(config.max_bs, overshoot=overshoot)
    drafting = trees and not config.trivial

    @st.composite
    def build(draw) -> Batch:
        n = draw(sizes)
        lens = draw(_seq_lens(config.max_context_len, n))
        chosen = None
        if drafting and draw(BOOLEANS):
            chosen = draw(_trees(config.topk, config.spec_steps, config.d, n))
        return Batch(lens, chosen)

    return build()


def batches(config: Config, *, bs=None, overshoot: int = 8, trees: bool = True) -> st.SearchStrategy[Batch]:
    """One scheduler step's batch for ``config``.

    ``bs`` pins the batch size (default: ``batch_sizes(config.max_bs)``);
    ``trees=False`` always uses the simplest tree.
    """
    _check_config(config)
    if bs is not None:
        check_int("bs", bs, low=1)
    return _batches(config, bs, overshoot, bool(trees))


def step_sequences(config: Config, *, min_steps: int = 2, max_steps: int = 5,
                   overshoot: int = 8) -> st.SearchStrategy[list[Batch]]:
    """Consecutive batches over one allocation: captured ones and eager ones past max_bs, mixed."""
    _check_config(config)
    check_int("min_steps", min_steps, low=1)
    check_int("max_steps", max_steps, low=min_steps)
    return _step_sequences(config, min_steps, max_steps, overshoot)


@lru_cache(maxsize=4096)
def _step_sequences(config: Config, min_steps: int, max_steps: int, overshoot: int):
    free = st.lists(batches(config, overshoot=overshoot), min_size=min_steps, max_size=max_steps)
    # Capacity transitions: consecutive steps at the boundary sizes (a full
    # captured batch, a single request, one past capacity) in any order, so
    # "full, then single" is one draw in nine per pair instead of one in 36.
    m = config.max_bs
    edges = tuple(dict.fromkeys((m, 1, m + 1)))
    pinned = st.one_of(*[batches(config, bs=n, overshoot=overshoot) for n in edges])
    return st.one_of(free, st.lists(pinned, min_size=min_steps, max_size=max_steps))
