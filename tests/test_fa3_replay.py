"""FlashAttention's topk > 1 verify metadata in a cuda-graph replay, under reader-agreement.

The replay refills the buffers its capture bound, for the batch padded up to
the captured graph's bs. By hand, for three requests in a graph of four (d 4,
topk 2): the real rows read what the eager path reads; the padding request
(fill length 1, pool slot 0) reads its own token 0 in the prefix pass and, in
the expand pass, only its own draft tokens' slots, each once. A padding row
reaching another request's KV, or counting past its draft, is a typed
reader-agreement finding of the replay; altered copies of the replay's own
code are caught through the CLI, and a refactor of it holds.
"""

from __future__ import annotations

import copy

import pytest
import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.fa3_reads import Fa3Pass, Fa3Verify
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PropertyFailure
from vmfuzz.harness.properties.fa3_reads import CAPTURE_WRITER, REPLAY_WRITER, check_fa3, fa3_mismatch
from vmfuzz.harness.properties.kit import Observation
from tests.sglang_copies import altered_copy, failed_check_origin, replay_on_copy
from tests.test_fa3_reads import FA3, _i32, _step

REPLAY = Config(TreeMaskMode.FULL_MASK, 4, 8, 4, 2, 3, True, "eagle")
BATCH = Batch((3, 5, 2))


def _tree_rows(base: int) -> list[list[int]]:
    """Request rows over draft slots base + 0..3: node 0 sees 0; 1 sees 0, 1; 2 sees 0, 2; 3 sees 0, 1, 3 --
    visible slots first, then the rest (what FA3's sort leaves; the judge takes the visible ones as a set)."""
    return [[base, base + 1, base + 2, base + 3], [base, base + 1, base + 2, base + 3],
            [base, base + 2, base + 1, base + 3], [base, base + 1, base + 3, base + 2]]


#: the graph's four requests' prefix pages at page size 4 (pool slot p: slots 100 * (p + 1) + token, pages of 4)
PAGED_PREFIX = [[100, 0], [75, 76], [50, 0], [25, 0]]


def _right_replay(page_size: int = 1) -> Fa3Verify:
    """By hand: the graph's four rows sit in pool slots 3, 2, 1, 0 (KV slot 100 * (pool + 1) + token); the
    padding request has seq_len 1 and here sees all four of its draft tokens."""
    table = [[400, 401, 402, 0, 0, 0, 0, 0], [300, 301, 302, 303, 304, 0, 0, 0],
             [200, 201, 0, 0, 0, 0, 0, 0], [100, 0, 0, 0, 0, 0, 0, 0]] if page_size == 1 else PAGED_PREFIX
    prefix = Fa3Pass(_i32([3, 5, 2, 1]), _i32([0, 4, 8, 12, 16]), _i32([0, 3, 8, 10, 11]), _i32(table), 4)
    counts = [1, 2, 2, 3] * 3 + [4] * 4
    running = [0]
    for n in counts:
        running.append(running[-1] + n)
    rows = _tree_rows(403) + _tree_rows(305) + _tree_rows(202) + [[101, 102, 103, 104]] * 4
    expand = Fa3Pass(_i32(counts), _i32(list(range(17))), _i32(running), _i32(rows), 1)
    return Fa3Verify(prefix, expand, graph_bs=4)


def test_the_padded_replay_holds_and_a_padding_row_may_see_fewer_of_its_own_nodes():
    view = _right_replay()
    assert fa3_mismatch(view, REPLAY, BATCH) is None
    view.expand.cache_seqlens[12:] = 1
    view.expand.cu_seqlens_k[13:] = 24 + torch.arange(1, 5, dtype=torch.int32)  # 24: the real rows' sum
    assert fa3_mismatch(view, REPLAY, BATCH) is None


def _padding_slip(view: Fa3Verify, name: str) -> None:
    e, p = view.expand, view.prefix
    if name == "padding row reads a real request's draft":
        e.page_table[12] = _i32([202, 203, 204, 205])
    elif name == "padding row counts past its draft":
        e.cache_seqlens[15] = 5
        e.cu_seqlens_k[16] += 1
    elif name == "padding prefix of another request":
        p.page_table[3, 0] = 200
    elif name == "padding row reads one slot twice":
        e.page_table[13] = _i32([101, 101, 103, 104])
    elif name == "a real row of the replay reads its neighbour's count":
        e.cache_seqlens = torch.roll(e.cache_seqlens, -1)


PADDING_SLIPS = {"padding row reads a real request's draft": ("page_table", "padding row"),
                 "padding row counts past its draft": ("cache_seqlens", "padding row"),
                 "padding prefix of another request": ("page_table", "padding row"),
                 "padding row reads one slot twice": ("page_table", "padding row"),
                 "a real row of the replay reads its neighbour's count": ("cache_seqlens", "tree node row")}


@pytest.mark.parametrize("slip", list(PADDING_SLIPS))
def test_a_replay_slip_is_a_typed_difference_naming_padding_rows(slip):
    view = copy.deepcopy(_right_replay())
    _padding_slip(view, slip)
    diff = fa3_mismatch(view, REPLAY, BATCH)
    assert diff is not None and (diff.buffer, diff.cell, diff.effect) == (*PADDING_SLIPS[slip], "wrong"), diff
    assert "cuda-graph replay, padded to 4" in diff


class _Replays:
    """A target whose eager FA3 seam is right and whose replay seam hands back ``view`` (on a paged
    server: both right)."""

    def __init__(self, eager, view):
        self.eager, self.view = eager, view
        self.replayed = []

    def read_fa3_verify(self, config, batch, step, page_size=1, window=None, verify_lens=None):
        return self.eager if page_size == 1 else _eager_view(page_size)

    def read_fa3_replay(self, config, batch, step, page_size=1, window=None):
        self.replayed.append((batch.bs, page_size))
        return self.view if page_size == 1 else _right_replay(page_size)


def _eager_view(page_size: int = 1) -> Fa3Verify:
    """The eager metadata of BATCH: pool slots 2, 1, 0 (KV slots 300 + t, 200 + t, 100 + t)."""
    right = _right_replay()
    table = right.prefix.page_table[:3] - 100 if page_size == 1 else _i32([[75, 0], [50, 51], [25, 0]])
    prefix = Fa3Pass(_i32([3, 5, 2]), _i32([0, 4, 8, 12]), _i32([0, 3, 8, 10]), table, 4)
    e = right.expand
    expand = Fa3Pass(e.cache_seqlens[:12], e.cu_seqlens_q[:13], e.cu_seqlens_k[:13], e.page_table[:12] - 100, 1)
    return Fa3Verify(prefix, expand)


def test_a_wrong_replay_fails_reader_agreement_at_the_replay_stage():
    assert fa3_mismatch(_eager_view(), REPLAY, BATCH) is None
    view = _right_replay()
    _padding_slip(view, "padding row reads a real request's draft")
    step = _step(REPLAY, BATCH)
    with pytest.raises(PropertyFailure) as caught:
        check_fa3(_Replays(_eager_view(), view), Observation(), REPLAY, BATCH, step, step.tree_mask)
    o = caught.value.origin
    assert (o.property, o.effect, o.writer, o.buffer, o.cell, o.stage) == (
        "reader-agreement", "wrong", REPLAY_WRITER, "page_table", "padding row", "replay")


def test_a_replay_that_raises_is_judged_by_what_its_capture_bound_first():
    """A replay that raised leaves the spans its capture bound: one a row short is reader-agreement's finding
    at stage capture (the cause); when every span is right, the raise itself is passed on, never a catch."""
    step = _step(REPLAY, BATCH)
    view = _right_replay()
    view.raised = RuntimeError("The size of tensor a (3) must match the size of tensor b (4)")
    view.prefix = Fa3Pass(view.prefix.cache_seqlens, view.prefix.cu_seqlens_q, view.prefix.cu_seqlens_k[:4],
                          view.prefix.page_table, 4)
    with pytest.raises(PropertyFailure) as caught:
        check_fa3(_Replays(_eager_view(), view), Observation(), REPLAY, BATCH, step, step.tree_mask)
    o = caught.value.origin
    assert (o.property, o.effect, o.writer, o.buffer, o.cell, o.stage) == (
        "reader-agreement", "wrong", CAPTURE_WRITER, "cu_seqlens_k", "captured span", "capture")
    assert "over 4 entries, its 4 rows need 5" in caught.value.detail
    right = _right_replay()
    right.raised = RuntimeError("raised after a right capture")
    with pytest.raises(RuntimeError, match="after a right capture"):
        check_fa3(_Replays(_eager_view(), right), Observation(), REPLAY, BATCH, step, step.tree_mask)


def test_replayed_only_up_to_max_bs_and_classed_padded():
    target, obs = _Replays(_eager_view(), _right_replay()), Observation()
    step = _step(REPLAY, BATCH)
    check_fa3(target, obs, REPLAY, BATCH, step, step.tree_mask)
    assert obs.classes == {"fa3 topk>1 verify", "fa3 topk>1 verify, cuda-graph replay padded to a captured bs",
                           "fa3 topk>1 verify, page size 4",
                           "fa3 topk>1 verify, cuda-graph replay padded to a captured bs, page size 4"}
    small = Config(TreeMaskMode.FULL_MASK, 2, 8, 4, 2, 3, True, "eagle")  # bs 3 > max_bs 2: eager only
    check_fa3(target, Observation(), small, BATCH, step, step.tree_mask)
    assert target.replayed == [(3, 1), (3, 4)]


# -- SGLang's FlashAttention backend -------------------------------------------------

def test_sglangs_own_replay_is_the_meaning(sglang_target):
    view = sglang_target.read_fa3_replay(REPLAY, BATCH, _step(REPLAY, BATCH))
    assert view.graph_bs == 4 and fa3_mismatch(view, REPLAY, BATCH) is None
    want = _right_replay()
    for got, right in ((view.prefix, want.prefix), (view.expand, want.expand)):
        for name in ("cu_seqlens_q",):
            assert getattr(got, name).tolist() == getattr(right, name).tolist(), name
    assert view.prefix.cache_seqlens.tolist() == [3, 5, 2, 1]
    assert view.expand.cache_seqlens[:12].tolist() == want.expand.cache_seqlens[:12].tolist()
    assert view.expand.page_table[:12].tolist() == want.expand.page_table[:12].tolist()


#: the replay's own code (``_apply_cuda_graph_metadata``), each edit a copy-paste slip a reviewer could miss;
#: the eager path is left alone, so each holds under the eager judgement alone
REPLAY_SORT = (r"_, sort_order = torch\.sort\(keys, dim=1\)"
               r"(\n\s+non_masked_page_table = \(\n\s+self\.req_to_token\[req_pool_indices, :\])")
ALTERATIONS = {
    # the visible count of each expand row taken from the row before it, in the replay's refill only
    "replay-visible-count-wrong-row": [(FA3, r"metadata_expand\.cache_seqlens_int32\.copy_\(mask\.sum\(dim=1\)\)",
                                        "metadata_expand.cache_seqlens_int32.copy_(mask.roll(1, 0).sum(dim=1))")],
    # the replay's sort turned around: hidden nodes first
    "replay-sort-order-reversed": [(FA3, REPLAY_SORT, r"_, sort_order = torch.sort(keys, dim=1, descending=True)\1")],
    # the prefix pass counts the draft, as the topk = 1 verify does: each request reads d tokens too many
    "replay-prefix-counts-the-draft": [
        (FA3, r"metadata\.cache_seqlens_int32\.copy_\(seq_lens\)(\n\s+# metadata\.max_seq_len_q = self\.speculative)",
         r"metadata.cache_seqlens_int32.copy_(seq_lens + self.speculative_num_draft_tokens)\1")],
}
CAUGHT_IN = {"replay-visible-count-wrong-row": ("cache_seqlens", "tree node row"),
             "replay-sort-order-reversed": ("page_table", "tree node row"),
             "replay-prefix-counts-the-draft": ("cache_seqlens", "prefix row")}
#: the replay's sort by other means: keys by arithmetic, a stable argsort
REFACTOR = [(FA3, r"keys = torch\.where\(\n\s+mask,\n\s+col_indices,\n\s+col_indices \+ self\.speculative_num_draft_tokens,"
                  r"\n\s+\)", "keys = col_indices + (~mask) * self.speculative_num_draft_tokens"),
            (FA3, REPLAY_SORT, r"sort_order = torch.argsort(keys, dim=1, stable=True)\1")]


def _replay(tmp_path, edits, name):
    """The padded case (three requests in a graph of four) replayed on an altered copy."""
    config = {"mode": "FULL_MASK", "max_bs": 4, "max_context_len": 8, "num_draft_tokens": 4, "topk": 2,
              "spec_steps": 3}
    return replay_on_copy(altered_copy(tmp_path, edits, name), tmp_path, config, BATCH.seq_lens, "reader-agreement")


@pytest.mark.slow
@pytest.mark.parametrize("alteration", list(ALTERATIONS))
def test_altered_fa3_replay_is_caught_by_reader_agreement(sglang_target, alteration, tmp_path):
    proc, out = _replay(tmp_path, ALTERATIONS[alteration], alteration)
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "report", out)
    assert (o["property"], o["effect"], o["writer"], o["stage"]) == (
        "reader-agreement", "wrong", REPLAY_WRITER, "replay"), out
    assert (o["buffer"], o["cell"]) == CAUGHT_IN[alteration], out


@pytest.mark.slow
def test_a_capture_that_binds_a_short_running_sum_is_caught_before_the_replay_raises(sglang_target, tmp_path):
    """The tree's prefix pass bound ``cu_seqlens_k[: bs]`` at capture (a mutation run's kill that was only a
    raise: the replay's refill then fails on the shape). The span the graph reads is judged first."""
    edits = [(FA3, r'("cu_seqlens_k"\n\s*\]\[: bs) \+ 1\]', r"\1 * 1]")]
    proc, out = _replay(tmp_path, edits, "capture-cu-seqlens-k-one-short")
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "report", out)
    assert (o["property"], o["effect"], o["writer"], o["stage"], o["buffer"], o["cell"]) == (
        "reader-agreement", "wrong", CAPTURE_WRITER, "capture", "cu_seqlens_k", "captured span"), out


@pytest.mark.slow
def test_a_refactor_of_the_fa3_replay_holds(sglang_target, tmp_path):
    proc, out = _replay(tmp_path, REFACTOR, "fa3-replay-sort-refactor")
    assert proc.returncode == 0, out
