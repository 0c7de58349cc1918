"""Hypothesis strategies for kv-location-soundness's cases: a draft shape, page size, batch, trees
drafted the way EAGLE selects them (``harness/model/trees.py``) and an accepted path down each tree."""

from __future__ import annotations

from hypothesis import strategies as st

from vmfuzz.harness.model.config import num_candidates
from vmfuzz.harness.model.kv_locations import KvCase
from vmfuzz.harness.model.trees import parents
from vmfuzz.strategies.trees import draft_trees


@st.composite
def _paths(draw, par: tuple[int, ...], steps: int) -> tuple[int, ...]:
    """A path from the root down ``par``: 1 ... steps + 1 nodes, each a child of the one before."""
    path = [0]
    want = draw(st.integers(1, steps + 1))
    while len(path) < want:
        kids = [c for c in range(1, len(par)) if par[c] == path[-1]]
        if not kids:
            break
        path.append(draw(st.sampled_from(kids)))
    return tuple(path)


@st.composite
def kv_cases(draw, *, max_bs: int = 4, max_context_len: int = 64, page_sizes=(1, 2, 4, 16)) -> KvCase:
    topk = draw(st.integers(1, 4))
    steps = draw(st.integers(1, 4))
    # a tree (topk > 1) at least as wide as its accept index: below that SGLang's compaction raises
    # (kv-location-soundness leaves such configs unjudged)
    low = 2 if topk == 1 else steps + 1
    d = draw(st.integers(low, max(low, min(num_candidates(topk, steps) + 1, 10))))
    page = draw(st.sampled_from(page_sizes))
    bs = draw(st.integers(1, max_bs))
    seq_lens = tuple(draw(st.lists(st.integers(0, max_context_len), min_size=bs, max_size=bs)))
    trees = [draw(draft_trees(topk, steps, d)) for _ in range(bs)]
    pars = tuple((-1, *parents(t, topk)[1:]) for t in trees)
    paths = tuple(draw(_paths(p, steps)) for p in pars)
    return KvCase(topk=topk, spec_steps=steps, num_draft_tokens=d, page_size=page, context_len=max_context_len,
                  seq_lens=seq_lens, parents=pars, paths=paths).validate()
