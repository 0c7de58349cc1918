"""FlashAttention's topk > 1 verify metadata under reader-agreement (``properties/fa3_reads``).

The expectation is written out by hand here for one small case (two requests,
d 4, topk 2): request b's node x sees itself and its ancestors, and its expand
row reads exactly those nodes' KV slots. SGLang's own ``init_forward_metadata``
must give that; a slip in any output is a typed reader-agreement finding; and
altered copies of ``flashattention_backend.py`` -- the running sum shifted a row,
the visible count taken from the wrong row, the sort turned around -- are
caught through the CLI, while a refactor that keeps the meaning holds.
"""

from __future__ import annotations

import copy

import pytest
import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.fa3_reads import Fa3Pass, Fa3Verify
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.oracle import expected
from vmfuzz.harness.model.outputs import StepOutput
from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
from vmfuzz.harness.properties.fa3_reads import WRITER, check_fa3, fa3_mismatch, visible_nodes
from vmfuzz.harness.properties.kit import Observation
from vmfuzz.harness.targets import resolve
from tests.sglang_copies import altered_copy, failed_check_origin, replay_on_copy

TREE = Config(TreeMaskMode.FULL_MASK, 2, 8, 4, 2, 3, True, "eagle")
BATCH = Batch((3, 5))
#: the simplest topk-2 tree of 4 nodes: 1 and 2 under the root, 3 under 1
SEES = [[0], [0, 1], [0, 2], [0, 1, 3]]


def _i32(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32)


def _right_view(page_size: int = 1) -> Fa3Verify:
    """By hand: request 0 sits in pool slot 1 (KV slots 200 + token), request 1 in pool slot 0 (100 + token);
    node j of request b is its token s_b + j. Entries past a row's length are anything: here invisible nodes.
    At page size 4 the prefix pass lists pages: request 0's tokens 0-2 lie in page 50 (slots 200-203),
    request 1's tokens 0-4 in pages 25 and 26 (slots 100-107)."""
    table = {1: [[200, 201, 202, 0, 0], [100, 101, 102, 103, 104]], 4: [[50, 0], [25, 26]]}[page_size]
    prefix = Fa3Pass(_i32([3, 5]), _i32([0, 4, 8]), _i32([0, 3, 8]), _i32(table), 4)
    rows = [[203, 204, 205, 206], [203, 204, 205, 206], [203, 205, 204, 206], [203, 204, 206, 205],
            [105, 106, 107, 108], [105, 106, 107, 108], [105, 107, 106, 108], [105, 106, 108, 107]]
    expand = Fa3Pass(_i32([1, 2, 2, 3] * 2), _i32(list(range(9))), _i32([0, 1, 3, 5, 8, 9, 11, 13, 16]),
                     _i32(rows), 1)
    return Fa3Verify(prefix, expand)


def test_each_node_sees_itself_and_its_ancestors():
    assert visible_nodes(TREE, BATCH) == [SEES, SEES]


def _slip(view: Fa3Verify, name: str) -> None:
    e, p = view.expand, view.prefix
    if name == "expand count from the next row":
        e.cache_seqlens = torch.roll(e.cache_seqlens, -1)
    elif name == "expand running sum a row late":
        e.cu_seqlens_k = torch.nn.functional.pad(e.cu_seqlens_k[1:], (0, 1))
    elif name == "expand invisible nodes first":
        e.page_table = torch.flip(e.page_table, [1])
    elif name == "expand another request's slots":
        e.page_table = torch.roll(e.page_table, 4, 0)
    elif name == "prefix of another request":
        p.page_table = torch.roll(p.page_table, 1, 0)
    elif name == "prefix counts the draft":
        p.cache_seqlens = p.cache_seqlens + 4
    elif name == "a query row per request in the expand pass":
        e.cu_seqlens_q = torch.arange(0, 33, 4, dtype=torch.int32)
    elif name == "expand query rows one past the batch":
        e.cu_seqlens_q = torch.arange(0, 10, dtype=torch.int32)
    elif name == "expand a count for a row that is not there":
        e.cache_seqlens = torch.cat([e.cache_seqlens, _i32([1])])


SLIPS = {"expand count from the next row": "cache_seqlens", "expand running sum a row late": "cu_seqlens_k",
         "expand invisible nodes first": "page_table", "expand another request's slots": "page_table",
         "prefix of another request": "page_table", "prefix counts the draft": "cache_seqlens",
         "a query row per request in the expand pass": "cu_seqlens_q",
         "expand query rows one past the batch": "cu_seqlens_q",
         "expand a count for a row that is not there": "cache_seqlens"}


def test_the_meaning_holds_and_visible_slots_in_another_order_hold_too():
    view = _right_view()
    assert fa3_mismatch(view, TREE, BATCH) is None
    view.expand.page_table[3, :3] = _i32([206, 203, 204])  # the same nodes: attention over a set
    assert fa3_mismatch(view, TREE, BATCH) is None


@pytest.mark.parametrize("slip", list(SLIPS))
def test_each_slip_is_a_typed_difference(slip):
    view = copy.deepcopy(_right_view())
    _slip(view, slip)
    diff = fa3_mismatch(view, TREE, BATCH)
    assert diff is not None and (diff.buffer, diff.effect) == (SLIPS[slip], "wrong"), diff
    assert diff.cell.removesuffix(" count") == ("prefix row" if slip.startswith("prefix") else "tree node row")


class _Reads:
    """A target whose FA3 seam hands back ``view`` on a server of page size 1, ``paged`` on a paged one."""

    def __init__(self, view, paged=None):
        self.view, self.paged = view, paged

    def read_fa3_verify(self, config, batch, step, page_size=1, window=None, verify_lens=None):
        return self.view if page_size == 1 else self.paged


def _step(config: Config, batch: Batch) -> StepOutput:
    want = expected(config, batch)
    return StepOutput(want.tree_mask, want.positions, want.retrieve_index, want.retrieve_next_token,
                      want.retrieve_next_sibling, reused=False)


def test_a_wrong_read_fails_reader_agreement_with_the_backend_as_writer():
    view = _right_view()
    _slip(view, "expand count from the next row")
    step = _step(TREE, BATCH)
    with pytest.raises(PropertyFailure) as caught:
        check_fa3(_Reads(view), Observation(), TREE, BATCH, step, step.tree_mask)
    o = caught.value.origin
    assert (o.property, o.effect, o.writer, o.buffer, o.cell, o.stage) == (
        "reader-agreement", "wrong", WRITER, "cache_seqlens", "tree node row", "eager")


def test_judged_on_a_right_mask_a_server_could_run_and_a_target_that_reads():
    step, obs = _step(TREE, BATCH), Observation()
    check_fa3(_Reads(_right_view(), _right_view(4)), obs, TREE, BATCH, step, step.tree_mask)
    assert obs.classes == {"fa3 topk>1 verify", "fa3 topk>1 verify, page size 4"}
    wrong = step.tree_mask.clone()
    wrong[-1] = ~wrong[-1]  # the writer's mistake is reference-agreement's, not the reader's
    obs = Observation()
    check_fa3(_Reads(None), obs, TREE, BATCH, step, wrong)
    assert obs.classes == {"fa3 topk>1 verify: not judged, the step's mask is not the oracle's"}
    # a topk-1 draft of 3 tokens after 3 steps: SGLang would have made it 4 (tests/test_fa3_chain.py: the rest)
    chain = Config(TreeMaskMode.FULL_MASK, 2, 8, 3, 1, 3)
    obs = Observation()
    check_fa3(_Reads(None), obs, chain, BATCH, _step(chain, BATCH), _step(chain, BATCH).tree_mask)
    assert obs.classes == {"fa3 topk 1 verify: not judged, no server runs this config"}
    obs = PROPERTIES["reader-agreement"].check(resolve("reference"), TREE, [BATCH])
    assert "fa3 topk>1 verify: not driven by this target" in obs.classes


# -- SGLang's FlashAttention backend -------------------------------------------------

def test_sglangs_own_metadata_is_the_meaning(sglang_target):
    from vmfuzz.harness.targets.sglang import fa3_reader

    view = sglang_target.read_fa3_verify(TREE, BATCH, _step(TREE, BATCH))
    want = _right_view()
    for got, right in ((view.prefix, want.prefix), (view.expand, want.expand)):
        for name in ("cache_seqlens", "cu_seqlens_q", "cu_seqlens_k"):
            assert getattr(got, name).tolist() == getattr(right, name).tolist(), name
    assert view.expand.page_table.tolist() == want.expand.page_table.tolist()
    # What __init__ derived from the stand-in server is SGLang's own reading of it.
    be = fa3_reader.backend(TREE, 2, "cpu")
    assert (be.topk, be.speculative_num_draft_tokens, be.max_context_len, be.page_size) == (2, 4, 8, 1)


@pytest.mark.parametrize("config", [TREE, Config(TreeMaskMode.QLEN_ONLY, 2, 6, 5, 3, 2, True, "eagle")],
                         ids=["full", "qlen-only-read"])
def test_sglang_holds_on_edge_batches(sglang_target, config):
    full = config.max_context_len
    obs = PROPERTIES["reader-agreement"].check(sglang_target, config, [Batch((0, full)), Batch((2, 0, full))])
    assert "fa3 topk>1 verify, windowed" in obs.classes


FA3 = ["srt/layers/attention/flashattention_backend.py"]
#: the eager topk > 1 verify only (the cuda-graph path has its own copy of the sort)
_EAGER_SORT = r"_, sort_order = torch\.sort\(keys, dim=1\)(\n\s+non_masked_page_table = \(\n\s+self\.req_to_token_pool)"
_EXPAND_CU_K = (r"(metadata_expand\.cu_seqlens_k = torch\.nn\.functional\.pad\(\n\s+torch\.cumsum\(\n\s+"
                r"metadata_expand\.cache_seqlens_int32, dim=0, dtype=torch\.int32\n\s+\),\n\s+)\(1, 0\)")
#: name -> edits: a bad edit a reviewer could miss; each passes the harness before fa3_reads existed
ALTERATIONS = {
    # the running sum padded at the end, not the start: every row's KV starts one row late
    "expand-running-sum-off-by-one": [(FA3, _EXPAND_CU_K, r"\1(0, 1)")],
    # the visible count of each row taken from the row before it
    "visible-count-wrong-row": [(FA3, r"metadata_expand\.cache_seqlens_int32 = mask\.sum\(dim=1\)",
                                 "metadata_expand.cache_seqlens_int32 = mask.roll(1, 0).sum(dim=1)")],
    # the sort turned around: hidden nodes first, so each row reads nodes it must not see
    "sort-order-reversed": [(FA3, _EAGER_SORT, r"_, sort_order = torch.sort(keys, dim=1, descending=True)\1")],
}
#: alteration -> the output it shows in first
CAUGHT_IN = {"expand-running-sum-off-by-one": "cu_seqlens_k", "visible-count-wrong-row": "cache_seqlens",
             "sort-order-reversed": "page_table"}
#: the same metadata by other means: a stable argsort over keys built by arithmetic
REFACTOR = [(FA3, r"keys = torch\.where\(\n\s+mask, col_indices, col_indices \+ self\.speculative_num_draft_tokens\n"
                  r"\s+\)", "keys = col_indices + (~mask) * self.speculative_num_draft_tokens"),
            (FA3, _EAGER_SORT, r"sort_order = torch.argsort(keys, dim=1, stable=True)\1")]


def _replay(tmp_path, edits, name):
    config = {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 8, "num_draft_tokens": 4, "topk": 2,
              "spec_steps": 3}
    return replay_on_copy(altered_copy(tmp_path, edits, name), tmp_path, config, (3, 5), "reader-agreement")


@pytest.mark.slow
@pytest.mark.parametrize("alteration", list(ALTERATIONS))
def test_altered_fa3_extraction_is_caught_by_reader_agreement(sglang_target, alteration, tmp_path):
    proc, out = _replay(tmp_path, ALTERATIONS[alteration], alteration)
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "report", out)  # a replay's summary holds its one check
    assert (o["property"], o["effect"], o["writer"]) == ("reader-agreement", "wrong", WRITER), out
    assert o["buffer"] == CAUGHT_IN[alteration], out


@pytest.mark.slow
def test_a_refactor_of_the_fa3_extraction_holds(sglang_target, tmp_path):
    proc, out = _replay(tmp_path, REFACTOR, "fa3-sort-refactor")
    assert proc.returncode == 0, out
