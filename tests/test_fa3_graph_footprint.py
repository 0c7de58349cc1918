"""``allocation-soundness`` judges FlashAttention's cuda-graph metadata buffers by their size.

``FlashAttentionBackend.init_cuda_graph_state(max_bs, ...)`` preallocates, once,
the metadata every captured graph binds slices of. One sized for fewer rows or
columns than the captured max_bs needs is the bug class the verify mask's own
allocation check exists for; before this check such a buffer surfaced only as
SGLang raising later (a negative dimension, an ``arange`` that refuses its
bounds), never as a property's catch. Two mutants of the last mutation run are
the altered copies here: each must be an allocation-soundness finding with a
non-raise origin naming the buffer, even on a server whose real set-up raises on it.
The pristine copy holds under ``tests/test_routers_allocation.py``'s unaltered
allocation-soundness run (not repeated here).
"""

from __future__ import annotations

import pytest
import torch

from vmfuzz.harness.model.allocation import ServerNumbers
from vmfuzz.harness.model.fa3_graph import WRITER, graph_needs
from vmfuzz.harness.properties.allocation import check_fa3_graph
from vmfuzz.harness.properties.kit import Observation, PropertyFailure
from vmfuzz.harness.targets import resolve
from tests.sglang_copies import (altered_copy, assert_altered_replay_caught, failed_check_origin, replay_on_copy,
                                 run_on_copy)

FA3 = ("srt/layers/attention/flashattention_backend.py",)
TREE = ServerNumbers(max_bs=4, context_len=64, num_draft_tokens=5, topk=2, spec_steps=3)


def test_what_a_tree_servers_graph_needs():
    needs = graph_needs(TREE)
    assert needs["target_verify_metadata.page_table"] == (4, 64)
    assert needs["target_verify_metadata_topk_normal.cu_seqlens_q"] == (5,)
    assert needs["target_verify_metadata_topk_expand.cache_seqlens"] == (20,)
    assert needs["target_verify_metadata_topk_expand.page_table"] == (20, 5)
    assert needs["draft_decode_metadata_topk_normal.cu_seqlens_q"] == (5,)
    assert needs["draft_decode_metadata_topk_expand.cu_seqlens_k"] == (9,)
    # a chain server's verify binds only the chain buffers
    assert {n.split(".")[0] for n in graph_needs(ServerNumbers(4, 64, 5, 1, 4))} == {"target_verify_metadata"}


def test_the_footprint_is_judged_at_page_sizes_that_divide_the_context_and_that_do_not():
    from vmfuzz.harness.model.fa3_graph import CASE_PAGE_SIZES, page_sizes
    assert graph_needs(TREE, 4)["target_verify_metadata.page_table"] == (4, 16)
    assert graph_needs(TREE, 64)["target_verify_metadata_topk_normal.page_table"] == (4, 1)
    assert graph_needs(ServerNumbers(4, 12, 5, 2, 3), 8)["draft_decode_metadata_topk_normal.page_table"] == (4, 2)
    # the expand pass reads a token a page whatever the server's page size
    assert graph_needs(TREE, 16)["target_verify_metadata_topk_expand.page_table"] == (20, 5)
    drawn = {page_sizes(ServerNumbers(b, 64, 5, 2, 3))[2] for b in range(1, 9)}
    assert drawn == set(CASE_PAGE_SIZES) and all(page_sizes(TREE)[:2] == (1, 4) for _ in drawn)


def test_sglangs_own_set_up_at_every_page_size_holds(sglang_target):
    from vmfuzz.harness.model.fa3_graph import CASE_PAGE_SIZES
    for page_size in (1, 4, *CASE_PAGE_SIZES):
        shapes = sglang_target.fa3_graph_buffers(TREE, list(graph_needs(TREE)), page_size=page_size)
        assert shapes["target_verify_metadata.page_table"] == (4, -(-64 // page_size)), page_size


class _Sized:
    """The reference target, with FlashAttention's set-up sizing its buffers as ``shapes`` say."""

    def __init__(self, shapes):
        self._target, self.shapes = resolve("reference"), shapes

    def __getattr__(self, name):
        return getattr(self._target, name)

    def fa3_graph_buffers(self, numbers, names, page_size=1):
        shapes = self.shapes if page_size == 1 else {}
        return {name: shapes.get(name, graph_needs(numbers, page_size)[name]) for name in names}


@pytest.mark.parametrize("buffer, shape, cell", [
    ("target_verify_metadata_topk_normal.page_table", (4, 63), "columns too few"),
    ("target_verify_metadata_topk_expand.cu_seqlens_q", (20,), "entries too few"),
    ("draft_decode_metadata_topk_expand.page_table", (7, 9), "rows too few"),
])
def test_a_buffer_too_small_for_the_captured_max_bs_is_unsound(buffer, shape, cell):
    with pytest.raises(PropertyFailure) as failed:
        check_fa3_graph(_Sized({buffer: shape}), Observation(), TREE)
    o = failed.value.origin
    assert (o.property, o.effect, o.writer, o.buffer, o.cell) == ("allocation-soundness", "unsound", WRITER,
                                                                  buffer, cell), o


def test_a_larger_buffer_holds_and_the_reference_target_says_it_does_not_drive_it():
    obs = Observation()
    check_fa3_graph(_Sized({"target_verify_metadata.page_table": (8, 4096)}), obs, TREE)
    assert obs.classes == {"fa3 cuda-graph buffers", "fa3 cuda-graph constant sums: not driven by this target"}
    obs = Observation()
    check_fa3_graph(resolve("reference"), obs, TREE)
    assert obs.classes == {"fa3 cuda-graph buffers: not driven (not by this target)"}


def test_sglangs_own_set_up_is_read_at_production_scale_and_left_as_found(sglang_target):
    from vmfuzz.harness.targets.sglang import fa3_reader
    big = ServerNumbers(max_bs=160, context_len=131072, num_draft_tokens=8, topk=4, spec_steps=3)
    shapes = sglang_target.fa3_graph_buffers(big, list(graph_needs(big)))
    assert shapes["target_verify_metadata_topk_expand.page_table"] == (1280, 8)
    assert shapes["draft_decode_metadata_topk_normal.cu_seqlens_q"] == (161,)
    obs = Observation()
    check_fa3_graph(sglang_target, obs, big)
    assert obs.classes == {"fa3 cuda-graph buffers", "fa3 cuda-graph constant sums"}
    mod = fa3_reader.module()
    assert mod.torch is torch and mod.maybe_create_verify_mask.__module__ == "sglang.srt.layers.attention.verify_mask"


# -- altered copies: the mutation run's two FA3 mutants killed only by raising -----------------

_PAGES = r"max_num_pages = \(self\.max_context_len \+ self\.page_size - 1\) // self\.page_size"
_DRAFT_Q = r"(\"cu_seqlens_q\": torch\.arange\(\n\s+0,\n\s+)max_bs \* self\.topk \+ 1,(\n\s+step=self\.topk,)"

#: name -> (edit, a server, a batch, the buffer and cell the finding must name); the second server's
#: real set-up raises on the short buffer
MUTANTS = {
    # the page count rounded down: the same at a token a page and wherever P divides C; at context 12
    # the case's page size is 8, and the last, part-read page has no column
    "page-count-rounds-down": (
        (FA3, _PAGES, "max_num_pages = self.max_context_len // self.page_size"),
        {"mode": "FULL_MASK", "max_bs": 1, "max_context_len": 12, "num_draft_tokens": 4, "topk": 1, "spec_steps": 3},
        [5], "target_verify_metadata.page_table", "columns too few"),
    # line 2432: every max_num_pages-wide page table two pages short (none at context 2, negative below)
    "page-count-subtracts-page-size": (
        (FA3, _PAGES, "max_num_pages = (self.max_context_len - self.page_size - 1) // self.page_size"),
        {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 2, "num_draft_tokens": 2, "topk": 1, "spec_steps": 1},
        [1], "target_verify_metadata.page_table", "columns too few"),
    # line 2491: the draft decode's query running sum max_bs - topk + 1 long; arange refuses it past topk - 1
    "draft-decode-query-sum-short": (
        (FA3, _DRAFT_Q, r"\1max_bs - self.topk + 1,\2"),
        {"mode": "FULL_MASK", "max_bs": 1, "max_context_len": 64, "num_draft_tokens": 4, "topk": 3,
         "spec_steps": 3},
        [5], "draft_decode_metadata_topk_normal.cu_seqlens_q", "entries too few"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MUTANTS))
def test_a_short_fa3_graph_buffer_is_caught_by_its_size_not_by_sglang_raising(sglang_target, name, tmp_path):
    edit, config, seq_lens, buffer, cell = MUTANTS[name]
    proc, out = replay_on_copy(altered_copy(tmp_path, [edit], name), tmp_path, config, seq_lens,
                               "allocation-soundness")
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "report", out)
    assert (o["property"], o["effect"], o["writer"], o["buffer"], o["cell"]) == (
        "allocation-soundness", "unsound", WRITER, buffer, cell), out


_EXPAND_Q = r"(\"cu_seqlens_q\": torch\.arange\(\n\s+)0,\n\s+(max_bs \* self\.topk \+ 1,\n\s+dtype)"

#: name -> (edit, the running sum it makes wrong): constant sums the set-up fills once, of the right size
#: but the wrong content (the mutation sample's survivor, and a stride lost)
WRONG_SUMS = {
    "draft-expand-query-sum-from-minus-one": ((FA3, _EXPAND_Q, r"\1-1, \2"),
                                              "draft_decode_metadata_topk_expand.cu_seqlens_q"),
    "draft-query-sum-without-its-stride": ((FA3, _DRAFT_Q, r"\1max_bs * self.topk + 1,"),
                                           "draft_decode_metadata_topk_normal.cu_seqlens_q"),
}


class _Filled(_Sized):
    """The reference target, with FlashAttention's set-up filling its running sums as ``made`` says."""

    def __init__(self, made):
        super().__init__({})
        self.made = made

    def fa3_graph_constants(self, numbers, names):
        from vmfuzz.harness.model.fa3_graph import constant_sums, length_sums
        right = {n: ("arange", 0, step) for n, step in constant_sums(numbers).items()}
        sums = length_sums(numbers)
        right |= {n: ("arange", 0, 2) for n in sums} | {n: ("full", 2) for n in sums.values()}
        return {name: self.made.get(name, right[name]) for name in names}


@pytest.mark.parametrize("made", [{"draft_decode_metadata_topk_normal.cu_seqlens_q": ("arange", 0, 1)},
                                  {"target_verify_metadata.cu_seqlens_q": ("arange", -1, 5)},
                                  {"draft_decode_metadata_topk_expand.cu_seqlens_k": ("arange", 0, 3)},
                                  {"target_verify_metadata_topk_expand.cu_seqlens_q": None}])
def test_a_constant_running_sum_of_the_wrong_content_is_a_finding_and_the_right_one_holds(made):
    with pytest.raises(PropertyFailure) as failed:
        check_fa3_graph(_Filled(made), Observation(), TREE)
    o = failed.value.origin
    assert (o.property, o.effect, o.buffer, o.cell) == ("allocation-soundness", "wrong", *made, "constant running sum")
    obs = Observation()
    check_fa3_graph(_Filled({}), obs, TREE)
    assert "fa3 cuda-graph constant sums" in obs.classes


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WRONG_SUMS))
def test_a_constant_fa3_running_sum_of_the_wrong_content_is_caught(sglang_target, name, tmp_path):
    edit, buffer = WRONG_SUMS[name]
    config = {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 16, "num_draft_tokens": 4, "topk": 2,
              "spec_steps": 2}
    assert_altered_replay_caught(tmp_path, [edit], name, config, [5], "allocation-soundness",
                                 {"effect": "wrong", "buffer": buffer, "cell": "constant running sum"})


#: the same sizes and sums computed other ways: never a finding
REFACTOR = [(FA3, _PAGES, "max_num_pages = (self.max_context_len - 1) // self.page_size + 1"),
            (FA3, _DRAFT_Q, r"\1self.topk * (max_bs + 1) - self.topk + 1,\2"),
            (FA3, _EXPAND_Q, r"\1\2")]


@pytest.mark.slow
def test_the_same_fa3_graph_sizes_computed_another_way_hold(sglang_target, tmp_path):
    site = altered_copy(tmp_path, REFACTOR, "fa3-graph-sizes-refactored")
    proc, out = run_on_copy(site, tmp_path, "run", "--target", "sglang", "--seed", "1", "--max-examples", "10",
                            "--isolate", "off", "--property", "allocation-soundness",
                            "--report-dir", str(tmp_path / "report"))
    assert proc.returncode == 0, out
