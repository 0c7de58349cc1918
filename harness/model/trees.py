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

from vmfuzz.harness.model.config import Batch, Config, DraftTree, num_candidates

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



@lru_cache(maxsize=512)
def deepest(topk: int, spec_steps: int, num_draft_tokens: int) -> DraftTree:
    """Each kept node's first child free, every other child dear: a chain is selected first."""
    costs = [0 if i < topk and i == 0 or i >= topk and (i - topk) % topk == 0 else 3
             for i in range(num_candidates(topk, spec_steps))]
    return draft(topk, spec_steps, num_draft_tokens, costs)


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


def verified_token(b: int) -> int:
    """Token id of request b's verified (bonus) token: the root of its tree."""
    return 1000 + b


def candidate_token(b: int, cid: int, ncand: int) -> int:
    """Token id of request b's draft candidate ``cid``, distinct per (request, candidate).

    A draft token gathered from the wrong candidate, node or request then names
    where it came from. For a topk-1 chain (candidate x is node x + 1) these are
    the ids ``chain_write.chain_inputs`` gives the chain writer.
    """
    return 2000 + b * ncand + cid


def draft_tokens(config: Config, batch: Batch, device="cpu"):
    """``(bonus_tokens (bs,), draft_tokens (bs, d-1))`` as the draft stage hands them to the verify step.

    The draft tokens are the selected candidates' tokens gathered by
    ``top_scores_index``, as the draft stage's own gather does.
    """
    import torch

    bs = batch.bs
    bonus = torch.tensor([verified_token(b) for b in range(bs)], dtype=torch.long, device=device)
    if config.trivial:
        return bonus, torch.empty((bs, 0), dtype=torch.long, device=device)
    ncand = num_candidates(config.topk, config.spec_steps)
    table = (2000 + torch.arange(bs * ncand, dtype=torch.long, device=device)).view(bs, ncand)
    sel, _ = tree_tensors(config, batch, device)
    return bonus, table.gather(1, sel)
