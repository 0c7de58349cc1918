"""Draft trees as the EAGLE draft stage makes them, and what they mean.

``draft`` replays the draft stage's selection on integer costs (a cost is a
negative log-probability, so a child costs at least its parent): each step keeps
the topk cheapest candidates, the final tree takes the d-1 cheapest overall.
Zero-cost children make ties, and a tie broken against the parent yields the
edge case the kernel must survive: a selected node whose parent was not selected.

``parents`` reads a tree back into node-level parent links from the meaning of
the encoding; the oracle builds on it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from harness.model.config import Batch, Config, DraftTree, num_candidates

ROOT = 0
DETACHED = -1  # the node's parent candidate was not selected: the walk stops here


def draft(topk: int, spec_steps: int, num_draft_tokens: int,
          child_costs: Sequence[int], tiebreak: Sequence[int] = ()) -> DraftTree:
    """Run the draft stage's selection over ``child_costs`` (one per candidate, >= 0).

    ``tiebreak`` (one per candidate, default all 0) orders equal cumulative
    costs; ids break the remaining ties, as a stable top-k would.
    """
    ncand = num_candidates(topk, spec_steps)
    if len(child_costs) != ncand:
        raise ValueError(f"need {ncand} child costs, got {len(child_costs)}")
    key = list(tiebreak) + [0] * (ncand - len(tiebreak))
    cost = [0] * ncand
    # Step 0: the topk children of the root, best first, as top-k returns them.
    step0 = sorted(child_costs[:topk])
    cost[:topk] = step0
    kept = list(range(topk))
    parent_rows = [[-1] + kept]
    for step in range(1, spec_steps):
        base = topk + (step - 1) * topk * topk
        ids = []
        for r, parent in enumerate(kept):
            first = base + r * topk
            for c, inc in enumerate(sorted(child_costs[first:first + topk])):
                cost[first + c] = cost[parent] + inc
                ids.append(first + c)
        kept = sorted(ids, key=lambda i: (cost[i], key[i], i))[:topk]
        if step < spec_steps - 1:
            parent_rows.append(kept)
    chosen = sorted(range(ncand), key=lambda i: (cost[i], key[i], i))[:num_draft_tokens - 1]
    parent_list = [p for row in parent_rows for p in row] if spec_steps > 1 else []
    return DraftTree(tuple(sorted(chosen)), tuple(parent_list))


@lru_cache(maxsize=256)
def simplest(topk: int, spec_steps: int, num_draft_tokens: int) -> DraftTree:
    """The tree a hand-written repro gets: unit costs, no ties, breadth-first."""
    ones = [1] * num_candidates(topk, spec_steps)
    return draft(topk, spec_steps, num_draft_tokens, ones)


def trees_of(config: Config, batch: Batch) -> tuple[DraftTree, ...]:
    if batch.trees is not None:
        return batch.trees
    tree = simplest(config.topk, config.spec_steps, config.d)
    return (tree,) * batch.bs


def parents(tree: DraftTree, topk: int) -> list[int]:
    """Parent node of every node (index 0 is the root, its own entry is ROOT)."""
    node_of = {cid: x + 1 for x, cid in enumerate(tree.top_scores_index)}
    out = [ROOT]
    for cid in tree.top_scores_index:
        slot = cid // topk
        if slot == 0:
            out.append(ROOT)
        else:
            out.append(node_of.get(tree.parent_list[slot], DETACHED))
    return out


def has_detached(tree: DraftTree, topk: int) -> bool:
    return DETACHED in parents(tree, topk)


def tree_tensors(config: Config, batch: Batch, device="cpu"):
    """``(top_scores_index, parent_list)`` as the kernel takes them: (bs, d-1) and (bs, width)."""
    import torch

    trees = trees_of(config, batch)
    sel = torch.tensor([t.top_scores_index for t in trees], dtype=torch.long, device=device)
    par = torch.tensor([t.parent_list for t in trees], dtype=torch.long, device=device)
    return sel.view(batch.bs, config.d - 1), par.view(batch.bs, -1)
