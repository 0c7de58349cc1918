"""Expected verify inputs, derived from what the tree *means*.

Nothing here follows the kernel's index arithmetic: a request's mask block is
built as a dense (d x (s_b + d)) picture of "who may attend to whom" from
ancestor sets, and laid out by concatenation. If the kernel and this module
agree, they agree for independent reasons.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from vmfuzz.harness.model.config import Batch, Config, DraftTree, num_candidates
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.outputs import Expected
from vmfuzz.harness.model.trees import DETACHED, ROOT, candidate_token, parents, trees_of, verified_token


@lru_cache(maxsize=1024)
def tree_facts(tree: DraftTree, topk: int, d: int):
    """Visibility rows, depths and child links of one tree (cached: trees repeat)."""
    parent = parents(tree, topk)
    visible = [[False] * d for _ in range(d)]
    depth = [0] * d
    for x in range(d):
        visible[x][ROOT] = True
        if x == ROOT:
            continue
        node = x
        # At most d-1 hops, as SGLang's kernel stops after spec_steps: a tree
        # that slipped past validation with a cycle cannot hang the oracle.
        for _ in range(d - 1):
            if node in (ROOT, DETACHED):
                break
            visible[x][node] = True
            depth[x] += 1
            node = parent[node]
    children = {p: sorted(c for c in range(1, d) if parent[c] == p) for p in range(d)}
    first_child = [children[p][0] if children[p] else -1 for p in range(d)]
    next_sibling = [-1] * d
    for kids in children.values():
        for a, b in zip(kids, kids[1:]):
            next_sibling[a] = b
    return visible, depth, first_child, next_sibling


@lru_cache(maxsize=8192)
def _block(tree: DraftTree, topk: int, d: int, s: int, mode: TreeMaskMode, is_read: bool):
    """One request's block (and which of its cells are defined), as flat tensors.

    Cached per (tree, seq_len, layout): a case repeats the same few blocks, and
    building them cell by cell for every request was the oracle's whole cost.
    """
    visible = tree_facts(tree, topk, d)[0]
    if mode == TreeMaskMode.FULL_MASK:
        rows = [[True] * s + row for row in visible]
        owned = [[is_read] * s + [True] * d for _ in range(d)]
        return (torch.tensor(rows, dtype=torch.bool).view(-1), torch.tensor(owned, dtype=torch.bool).view(-1))
    return torch.tensor(visible, dtype=torch.bool).view(-1), torch.ones(d * d, dtype=torch.bool)


def expected(config: Config, batch: Batch) -> Expected:
    d, bs = config.d, batch.bs
    if config.trivial:
        return _expected_trivial(config, batch)
    blocks, compared, positions, firsts, siblings, tokens = [], [], [], [], [], []
    ncand = num_candidates(config.topk, config.spec_steps)
    for b, (s, tree) in enumerate(zip(batch.seq_lens, trees_of(config, batch))):
        _, depth, first, sibling = tree_facts(tree, config.topk, d)
        block, owned = _block(tree, config.topk, d, s, config.mode, config.is_read)
        blocks.append(block)
        compared.append(owned)
        positions.extend(s + k for k in depth)
        firsts.append(first)
        siblings.append(sibling)
        # Node x + 1 is the x-th selected candidate: the root carries the verified token.
        tokens.append(verified_token(b))
        tokens.extend(candidate_token(b, cid, ncand) for cid in tree.top_scores_index)
    return Expected(
        tree_mask=torch.cat(blocks),
        compared=torch.cat(compared),
        positions=torch.tensor(positions, dtype=torch.long),
        retrieve_index=torch.arange(bs * d, dtype=torch.long).view(bs, d),
        retrieve_next_token=torch.tensor(firsts, dtype=torch.long),
        retrieve_next_sibling=torch.tensor(siblings, dtype=torch.long),
        draft_token=torch.tensor(tokens, dtype=torch.long),
    )


def _expected_trivial(config: Config, batch: Batch) -> Expected:
    """One node per request: every cell visible, position = seq_len, no links."""
    bs = batch.bs
    cells = sum(batch.seq_lens) + bs if config.mode == TreeMaskMode.FULL_MASK else bs
    none = torch.full((bs, 1), -1, dtype=torch.long)
    return Expected(
        tree_mask=torch.ones(cells, dtype=torch.bool),
        compared=torch.ones(cells, dtype=torch.bool),
        positions=torch.tensor(batch.seq_lens, dtype=torch.long),
        retrieve_index=torch.arange(bs, dtype=torch.long).view(bs, 1),
        retrieve_next_token=none,
        retrieve_next_sibling=none.clone(),
        draft_token=torch.tensor([verified_token(b) for b in range(bs)], dtype=torch.long),
    )
