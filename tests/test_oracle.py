import torch

from vmfuzz.harness.model.config import Batch, Config, DraftTree
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.oracle import expected
from vmfuzz.harness.model.trees import DETACHED, draft, parents, simplest


def test_simplest_tree_is_breadth_first_and_fully_attached():
    tree = simplest(2, 2, 5)  # topk 2, two steps, 4 drafted nodes
    assert tree.top_scores_index == (0, 1, 2, 3)
    assert tree.parent_list == (-1, 0, 1)
    assert parents(tree, 2) == [0, 0, 0, 1, 1]


def test_tie_broken_against_the_parent_detaches_a_node():
    # Candidate 1 (a root child) costs 3; its zero-cost child 4 ties with it and
    # the drawn tie-break puts the child first, so only one of them fits in d-1=2.
    costs = [0, 3, 5, 5, 0, 5]
    tiebreak = [0, 1, 0, 0, 0, 0]
    tree = draft(2, 2, 3, costs, tiebreak)
    assert DETACHED in parents(tree, 2)


def test_full_mask_block_of_a_chain():
    # topk 1, two steps, d 3: root -> node 1 -> node 2; one request with 2 prefix tokens
    config = Config(TreeMaskMode.FULL_MASK, 1, 4, 3, 1, 2)
    want = expected(config, Batch((2,)))
    rows = want.tree_mask.view(3, 5).int().tolist()
    assert rows == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert want.positions.tolist() == [2, 3, 4]
    assert want.retrieve_next_token.tolist() == [[1, 2, -1]]
    assert want.retrieve_next_sibling.tolist() == [[-1, -1, -1]]


def test_qlen_siblings_link_in_ascending_order():
    config = Config(TreeMaskMode.QLEN_ONLY, 2, 4, 4, 3, 1)  # three root children
    want = expected(config, Batch((0, 3)))
    assert want.tree_mask.view(2, 4, 4)[1].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]]
    assert want.retrieve_next_token[0].tolist() == [1, -1, -1, -1]
    assert want.retrieve_next_sibling[0].tolist() == [-1, 2, 3, -1]
    assert want.retrieve_index.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert want.positions.tolist() == [0, 1, 1, 1, 3, 4, 4, 4]


def test_unread_prefix_is_not_compared():
    read = Config(TreeMaskMode.FULL_MASK, 1, 4, 2, 1, 1, is_read=True)
    assert bool(expected(read, Batch((3,))).compared.all())
    unread = Config(TreeMaskMode.FULL_MASK, 1, 4, 2, 1, 1, is_read=False)
    assert int(expected(unread, Batch((3,))).compared.sum()) == 2 * 2  # the d x d tree cells only


def test_detached_node_sees_root_and_itself_only():
    # node 2 is candidate 4, a child of candidate 1, which was not selected
    tree = DraftTree((0, 4), (-1, 0, 1))
    config = Config(TreeMaskMode.QLEN_ONLY, 1, 1, 3, 2, 2)
    want = expected(config, Batch((0,), (tree,)))
    assert want.tree_mask.view(3, 3).int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 0, 1]]
    assert want.positions.tolist() == [0, 1, 1]
    assert torch.equal(want.retrieve_next_token, torch.tensor([[1, -1, -1]]))
