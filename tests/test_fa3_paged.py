"""FlashAttention's topk > 1 verify metadata on a paged server (page size 4), under reader-agreement.

By hand, for the cases of ``test_fa3_reads`` (two requests, seq_lens 3 and 5)
and ``test_fa3_replay`` (three in a graph of four): the prefix pass lists each
request's pages in token order, as many as its tokens need, its counts still
in tokens; the expand pass still lists KV slots. A table of slots where pages
belong, a page stepped wrong, a page short, or a part-read page out of its
place is a typed reader-agreement finding naming the page size; SGLang's own
metadata is the meaning, eager and replayed; altered copies of FA3's
page-size code are caught through the CLI (a server of page size 1, all the
harness drove before, never reaches that code), and a refactor holds.
"""

from __future__ import annotations

import copy

import pytest

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.fa3_reads import prefix_pages, table_slot
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PropertyFailure
from vmfuzz.harness.properties.fa3_reads import REPLAY_WRITER, WRITER, check_fa3, fa3_mismatch
from vmfuzz.harness.properties.kit import Observation
from tests.sglang_copies import altered_copy, failed_check_origin, replay_on_copy
from tests.test_fa3_reads import BATCH, FA3, TREE, _i32, _Reads, _right_view, _step
from tests.test_fa3_replay import BATCH as PADDED
from tests.test_fa3_replay import PAGED_PREFIX, REPLAY, _right_replay


def test_the_stand_in_table_fills_whole_pages_of_each_request():
    # a context of 4 and a draft of 3: 10 slots a request at page size 1; at 4 each request starts on a page
    small = Config(TreeMaskMode.FULL_MASK, 3, 4, 3, 2, 2)
    assert [table_slot(p, 5, small) for p in range(3)] == [15, 25, 35]
    assert [table_slot(p, 5, small, 4) for p in range(3)] == [17, 25, 37]
    assert prefix_pages(0, 5, small, 4) == [3, 4] and prefix_pages(1, 4, small, 4) == [5]
    assert prefix_pages(2, 0, small, 4) == [] and prefix_pages(2, 2, small, 1) == [30, 31]


def test_the_paged_meaning_holds_and_whole_pages_may_come_in_any_order():
    assert fa3_mismatch(_right_view(4), TREE, BATCH, 4) is None
    full = Batch((3, 8))  # request 1's 8 tokens fill pages 25 and 26: attention over them is a set
    view = _right_view(4)
    view.prefix.cache_seqlens, view.prefix.cu_seqlens_k = _i32([3, 8]), _i32([0, 3, 11])
    view.expand.page_table[4:] += 3  # its draft starts at token 8 now
    view.prefix.page_table[1] = _i32([26, 25])
    assert fa3_mismatch(view, TREE, full, 4) is None


def _paged_slip(view, name: str) -> None:
    p = view.prefix
    if name == "slots where pages belong":
        p.page_table = _i32([[200, 0], [100, 104]])
    elif name == "pages stepped by three tokens":
        p.page_table = _i32([[50, 0], [25, 25]])
    elif name == "a page short":
        p.page_table = _i32([[50, 0], [25, 0]])
    elif name == "the part-read page first":
        p.page_table = _i32([[50, 0], [26, 25]])
    elif name == "counts in pages":
        p.cache_seqlens = _i32([1, 2])


PAGED_SLIPS = {"slots where pages belong": "page_table", "pages stepped by three tokens": "page_table",
               "a page short": "page_table", "the part-read page first": "page_table",
               "counts in pages": "cache_seqlens"}


@pytest.mark.parametrize("slip", list(PAGED_SLIPS))
def test_each_paged_slip_is_a_typed_difference(slip):
    view = copy.deepcopy(_right_view(4))
    _paged_slip(view, slip)
    diff = fa3_mismatch(view, TREE, BATCH, 4)
    assert diff is not None and (diff.buffer, diff.cell, diff.effect) == (PAGED_SLIPS[slip], "prefix row", "wrong")
    assert "page size 4" in diff


def test_a_paged_slip_fails_reader_agreement_naming_the_page_size():
    view = _right_view(4)
    _paged_slip(view, "slots where pages belong")
    step = _step(TREE, BATCH)
    with pytest.raises(PropertyFailure) as caught:
        check_fa3(_Reads(_right_view(), view), Observation(), TREE, BATCH, step, step.tree_mask)
    o = caught.value.origin
    assert (o.property, o.effect, o.writer, o.buffer, o.cell, o.stage) == (
        "reader-agreement", "wrong", WRITER, "page_table", "prefix row", "eager")
    assert "eager, page size 4" in str(caught.value)


# -- SGLang's FlashAttention backend -------------------------------------------------

def test_sglangs_own_paged_metadata_is_the_meaning(sglang_target):
    from vmfuzz.harness.targets.sglang import fa3_reader

    view = sglang_target.read_fa3_verify(TREE, BATCH, _step(TREE, BATCH), 4)
    assert fa3_mismatch(view, TREE, BATCH, 4) is None
    assert [row[:n] for row, n in zip(view.prefix.page_table.tolist(), (1, 2))] == [[50], [25, 26]]
    assert view.prefix.cache_seqlens.tolist() == [3, 5]
    assert view.expand.page_table.tolist() == _right_view().expand.page_table.tolist()  # slots, not pages
    replayed = sglang_target.read_fa3_replay(REPLAY, PADDED, _step(REPLAY, PADDED), 4)
    assert fa3_mismatch(replayed, REPLAY, PADDED, 4) is None
    assert [row[:n] for row, n in zip(replayed.prefix.page_table.tolist(), (1, 2, 1, 1))] == [
        row[:n] for row, n in zip(PAGED_PREFIX, (1, 2, 1, 1))]
    assert replayed.expand.page_table[:12].tolist() == _right_replay().expand.page_table[:12].tolist()
    # the page size the backend works in is its own reading of the stand-in server
    assert fa3_reader.backend(TREE, 2, "cpu", 4).page_size == 4


#: the eager path's turn of the slot table into a page table (``init_forward_metadata``)
_EAGER_STRIDE = r"(0, metadata\.page_table\.shape\[1\], )self\.page_size(, device=self\.device)"
_EAGER_PAGES = r"metadata\.page_table\[:, self\.strided_indices\] // self\.page_size"
#: name -> edits, each a slip in FA3's page-size code; a server of page size 1 never runs it
ALTERATIONS = {
    # the strided gather steps one token short of a page: page j read at token 3j, not 4j
    "eager-pages-stepped-one-short": [(FA3, _EAGER_STRIDE, r"\1self.page_size - 1\2")],
    # the gathered slots never divided into pages: the kernel reads pages by slot number
    "eager-slots-not-divided": [(FA3, _EAGER_PAGES, "metadata.page_table[:, self.strided_indices]")],
    # the replay's page-table kernel asked for pages of one token: slots where pages belong
    "replay-page-table-of-slots": [
        (FA3, r"(page_table=metadata\.page_table,\n\s+)page_size=self\.page_size(,\n\s+\))",
         r"\1page_size=1\2")],
}
CAUGHT_AT = {"eager-pages-stepped-one-short": (WRITER, "eager"), "eager-slots-not-divided": (WRITER, "eager"),
             "replay-page-table-of-slots": (REPLAY_WRITER, "replay")}
#: the eager strided gather as a slice over the slot table, under a name of its own
REFACTOR = [(FA3, r"metadata\.page_table = \(\n\s+" + _EAGER_PAGES + r"\n\s+\)",
             "slot_table = metadata.page_table\n            "
             "metadata.page_table = slot_table[:, :: self.page_size] // self.page_size")]


def _replay(tmp_path, edits, name):
    """The padded case (three requests, seq_lens 3, 5, 2, in a graph of four) replayed on an altered copy."""
    config = {"mode": "FULL_MASK", "max_bs": 4, "max_context_len": 8, "num_draft_tokens": 4, "topk": 2,
              "spec_steps": 3}
    return replay_on_copy(altered_copy(tmp_path, edits, name), tmp_path, config, PADDED.seq_lens, "reader-agreement")


@pytest.mark.slow
@pytest.mark.parametrize("alteration", list(ALTERATIONS))
def test_altered_fa3_page_code_is_caught_by_reader_agreement(sglang_target, alteration, tmp_path):
    proc, out = _replay(tmp_path, ALTERATIONS[alteration], alteration)
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "report", out)
    assert (o["property"], o["effect"], o["writer"], o["stage"]) == (
        "reader-agreement", "wrong", *CAUGHT_AT[alteration]), out
    assert (o["buffer"], o["cell"]) == ("page_table", "prefix row"), out
    assert "page size 4" in out


@pytest.mark.slow
def test_a_refactor_of_the_paged_gather_holds(sglang_target, tmp_path):
    proc, out = _replay(tmp_path, REFACTOR, "fa3-paged-gather-refactor")
    assert proc.returncode == 0, out
