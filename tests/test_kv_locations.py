"""kv-location-soundness on SGLang's real accept and KV-location step, and the real bugs it must catch.

Each alteration is a real SGLang fix reverted (or one of ours) in a COPY of the installed package; the
sub-check meant to catch it does (read from the finding's origin, never a raise), a behaviour-
preserving refactor holds, and the pristine copy holds.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.kv_locations import KvCase, accept_moves, draft_columns, tail_copies
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES, sub_checks
from vmfuzz.harness.properties.kit import Observation
from vmfuzz.harness.properties.kv_locations import SUB_CHECKS, judge_case
from vmfuzz.strategies.kv_locations import kv_cases
from tests.sglang_copies import altered_copy, failed_check_origin, replay_on_copy
from tests.surface_ran import assert_texts_ran, surface_never_ran

PROP = "kv-location-soundness"
#: a tree draft (topk 2, 3 steps, 6 nodes); a request at the context length, one mid-page, one empty
TREE = {"mode": "FULL_MASK", "max_bs": 4, "max_context_len": 24, "num_draft_tokens": 6, "topk": 2, "spec_steps": 3}
SEQ_LENS = (5, 24, 2)

COMMON = ["srt/speculative/eagle_worker_common.py"]
CACHE_LOCS = ["kernels/ops/speculative/cache_locs.py"]
ALTERATIONS = {
    # S#26866 reverted: the accept moves sized bs·d (the tree's nodes), not bs·(n+1) (the accept index)
    "s26866-move-size-bs-d": [(["srt/speculative/spec_utils.py"], r"size = bs \* accept_index\.shape\[1\]",
                               "size = bs * batch.spec_info.draft_token_num")],
    # S#15360 reverted: the bonus token read at stride d, not the accept index's width
    "s15360-bonus-stride-d": [(COMMON, r"accept_index\.shape\[1\],\n(\s+)bs,", r"num_draft_tokens,\n\1bs,")],
    # S#26972 reverted as SGLang's own pr_fix_toggle does: the row headroom without the paged reserve
    "s26972-row-without-paged-reserve": [(["srt/mem_cache/allocation_sizing.py"],
                                          r"extra = max\(extra, get_alloc_reserve_per_decode\(\) \+ page_size - 1\)",
                                          "pass")],
    # ours (a fresh mutation sample's false "equivalent", seed 20261209): the allocator asked for the rows'
    # ends and-ed with their starts, not for what they grow by
    "alloc-count-and-not-difference": [(["srt/mem_cache/allocation_sizing.py"],
                                        r"num_needed_tokens \+= nxt - cur", "num_needed_tokens += nxt & cur")],
    # ours: the prefix-tail copy takes one column too many, overwriting each later branch's first draft slot
    "tail-copy-one-too-many": [(COMMON, r"page_off\.view\(1, 1, page_size\) < last_page\.view\(bs, 1, 1\)",
                                "page_off.view(1, 1, page_size) <= last_page.view(bs, 1, 1)")],
    # ours: the fused launch's sliding-window slots read through the full sub-pool's page table (a copy-paste)
    "fused-swa-through-full-table": [(CACHE_LOCS, r"swa_v2p \+ tl\.where\(swa_valid, page, 0\)",
                                      "full_v2p + tl.where(swa_valid, page, 0)")],
    # ours: the translating pool hands the full sub-pool's output buffer for the sliding-window one too
    "plan-swa-out-is-full-out": [(["srt/mem_cache/kv_index_translator.py"],
                                  r"swa_out=writes\.get\(IdSpaceKind\.SLIDING_WINDOW\)",
                                  "swa_out=writes.get(IdSpaceKind.FULL)")],
    # ours: the branch for a host with no Triton device writes positions from 0, not from the request's length
    "fallback-positions-from-zero": [(CACHE_LOCS, r"start_offset\.to\(torch\.int64\)\.view\(-1, 1\)\n(\s+)\+ ",
                                      r"0 * start_offset.to(torch.int64).view(-1, 1)\n\1+ ")],
}
PLAN = ["srt/mem_cache/kv_loc_plan.py"]
EAGLE_KERNELS = ["kernels/ops/speculative/eagle.py"]
TRANSLATOR = ["srt/mem_cache/kv_index_translator.py"]
ALTERATIONS.update({
    # ours: a plan's read tables keyed by the reader alone, whatever sub-pool it asks for (the sliding-window
    # reader is handed the full sub-pool's table)
    "read-space-ignores-kind": [(PLAN, r"return \(self\._source if reader is None else reader\)\.space\(kind\)",
                                 "return (self._source if reader is None else reader).space(IdSpaceKind.FULL)")],
    # ours: the stream gathered before any table translates every sub-pool's reads through the full one's pages
    "packed-stream-through-full-pages": [(TRANSLATOR, r"seq_lens=seq_lens,\n(\s+)v2p=self\.space\(kind\)\.read_v2p,",
                                          r"seq_lens=seq_lens,\n\1v2p=self.space(IdSpaceKind.FULL).read_v2p,")],
    # 0.5.23's reader argument reverted (0.5.22's form): a second reader of the plan (a later multi-layer draft
    # depth, its window layers in a sliding-window sub-pool of its own) is handed the plan runner's table
    "plan-table-without-reader": [(TRANSLATOR, r"return plan\.read_table\(kind=kind, rows=rows, into=into, reader=self\)",
                                   "return plan.read_table(kind=kind, rows=rows, into=into)")],
    # ours: a plan's table asked again for more rows (a captured graph's padded lanes) copies one live row too
    # few from its first build
    "grown-table-drops-a-row": [(TRANSLATOR, r"out\[: previous\.ids\.shape\[0\]\]\.copy_\(previous\.ids\)",
                                 "out[: previous.ids.shape[0] - 1].copy_(previous.ids[:-1])")],
    # ours: a table built into a captured graph's buffer leaves its first padding lane as the last replay left it
    "captured-padding-lane-stale": [(TRANSLATOR, r"if rows > bs:\n(\s+)out\[bs:\]\.zero_\(\)",
                                     r"if rows > bs + 1:\n\1out[bs + 1:].zero_()")],
    # ours: a CUDA host's fused commit reads the bonus token one accepted node early
    "fused-bonus-one-node-early": [(EAGLE_KERNELS, r"accept_index \+ row \* INDEX_STRIDE_0 \+ \(accepted - 1\) \* INDEX_STRIDE_1",
                                    "accept_index + row * INDEX_STRIDE_0 + tl.maximum(accepted - 2, 0) * INDEX_STRIDE_1")],
    # ours: a CUDA host's fused commit leaves the bonus token out of the committed length
    "fused-length-without-bonus": [(EAGLE_KERNELS, r"tl\.store\(new_seq_lens \+ row, length \+ accepted, valid\)",
                                    "tl.store(new_seq_lens + row, length + accepted - 1, valid)")],
})
CAUGHT_BY = {"read-space-ignores-kind": "plan reads", "packed-stream-through-full-pages": "plan reads",
             "fused-bonus-one-node-early": "bonus stride", "fused-length-without-bonus": "accept moves",
             "grown-table-drops-a-row": "plan reads", "captured-padding-lane-stale": "plan reads",
             "plan-table-without-reader": "plan reads",
             "s26866-move-size-bs-d": "accept moves", "s15360-bonus-stride-d": "bonus stride",
             "s26972-row-without-paged-reserve": "allocation width", "tail-copy-one-too-many": "draft window",
             "alloc-count-and-not-difference": "allocation width",
             "fused-swa-through-full-table": "fused window", "plan-swa-out-is-full-out": "fused window",
             "fallback-positions-from-zero": "fused window"}
#: the same page count by another expression (ceil division by negation)
REFACTOR = [(COMMON, r"num_new_pages = \(last_page \+ num_steps \+ page_size - 1\) // page_size",
             "num_new_pages = -(-(last_page + num_steps) // page_size)")]


# -- the model, alone ------------------------------------------------------------------

def _case(**kw) -> KvCase:
    base = dict(topk=2, spec_steps=3, num_draft_tokens=6, page_size=4, context_len=24, seq_lens=(5,),
                parents=((-1, 0, 0, 1, 2, 3),), paths=((0, 1, 3),))
    return KvCase(**{**base, **kw}).validate()


def test_paged_tree_branches_own_whole_pages():
    # s = 5 at P = 4: the prefix's last page starts at 4 with one real column; 1 + 3 slots fit one page
    assert draft_columns(_case(), 5) == [5, 6, 7, 9, 10, 11]
    assert tail_copies(_case(), 5) == [(8, 4)]
    assert draft_columns(_case(page_size=1), 5) == [5, 6, 7, 8, 9, 10]


def test_accept_moves_follow_the_path_and_pad_to_the_accept_index():
    moves = accept_moves(_case(), [[10, 11, 12, 13, 14, 15]])
    assert moves == [(10, 10), (11, 11), (12, 13), (0, 0)]


# -- SGLang, pristine --------------------------------------------------------------------

def _config(**kw) -> Config:
    cfg = {**TREE, **kw}
    return Config(TreeMaskMode[cfg.pop("mode")], **cfg).validate()


@pytest.mark.parametrize("topk,steps,d", [(1, 3, 4), (2, 3, 6), (3, 2, 7)])
def test_pristine_sglang_holds_every_sub_check(sglang_target, topk, steps, d):
    config = _config(topk=topk, spec_steps=steps, num_draft_tokens=d)
    obs = PROPERTIES[PROP].check(sglang_target, config, [Batch(SEQ_LENS)])
    assert set(sub_checks(PROP, obs.classes).values()) == {"done"}, obs.classes
    assert {"draft window: page size 1, topk " + ("1" if topk == 1 else "> 1"),
            "draft window: page size 4, topk " + ("1" if topk == 1 else "> 1")} <= obs.classes


@pytest.mark.slow
@settings(max_examples=15, deadline=None, database=None)
@given(case=kv_cases(max_bs=4, max_context_len=40))
def test_drawn_cases_hold_on_pristine_sglang(case):
    from tests.helpers import sglang_or_skip
    target = sglang_or_skip()
    obs = Observation()
    judge_case(target, case, obs)
    assert {f"sub-check {s}: done" for s in SUB_CHECKS} <= obs.classes


def test_sglang_lines_judged_ran(sglang_target):
    """coverage.py, as the gate measures: each driven SGLang function's body ran, and the lines the
    real bugs sit on ran under the property (the Triton kernels run in the interpreter, which executes
    a rewritten copy: their outputs are judged, their lines are not counted here)."""
    import importlib.util
    from pathlib import Path

    import coverage

    from vmfuzz.harness.targets.sglang import kv_plan_reads
    from vmfuzz.harness.targets.sglang.kv_locations import SURFACE
    SURFACE = SURFACE + kv_plan_reads.SURFACE
    root = Path(importlib.util.find_spec("sglang").origin).parent
    files = sorted({str(root / rel) for rel, _, _ in SURFACE})
    cov = coverage.Coverage(include=files, data_file=None)
    cov.start()
    try:
        for topk, steps, d in ((1, 3, 4), (2, 3, 6)):
            PROPERTIES[PROP].check(sglang_target, _config(topk=topk, spec_steps=steps, num_draft_tokens=d),
                                   [Batch(SEQ_LENS)])
    finally:
        cov.stop()
    data = cov.get_data()
    unrun = surface_never_ran(root, SURFACE, data)
    assert not unrun, f"driven functions whose lines never ran: {unrun}"
    assert_texts_ran(root, (("srt/speculative/spec_utils.py", "size = bs * accept_index.shape[1]"),
                            ("srt/speculative/eagle_worker_common.py", "accept_index.shape[1],"),
                            ("srt/speculative/eagle_worker_common.py", "num_new_pages = (last_page + num_steps"),
                            ("srt/mem_cache/allocation_sizing.py", "extra = max(extra, get_alloc_reserve_per_decode()"),
                            # the verify window's producer: its wrapper's fused-output checks and its branch for a host
                            # with no Triton device, and the translating pool's launch of it
                            ("kernels/ops/speculative/cache_locs.py", "assert full_out is not None and full_out.numel()"),
                            ("kernels/ops/speculative/cache_locs.py", "positions_out.copy_("),
                            ("kernels/ops/speculative/cache_locs.py", "anchor_out[:, 0].copy_(anchor_src"),
                            ("srt/mem_cache/kv_index_translator.py", "mappings[kind] = space.read_v2p"),
                            # the plan's reads: the stream before a table, the table, the stream packed from it
                            ("srt/mem_cache/kv_index_translator.py", "return self._plan_table(plan, kind=kind, rows=bs)"),
                            ("srt/mem_cache/kv_index_translator.py", "build_kv_read_table_packed("),
                            ("srt/mem_cache/kv_index_translator.py", "src = self.read_source("),
                            ("srt/mem_cache/kv_loc_plan.py", "return self._read_space(kind, reader).key in self._read_tables"),
                            ("srt/mem_cache/kv_loc_plan.py", "table = self._source.build_iteration_table("),
                            # a CUDA host's fused commit of the accepted path
                            ("srt/speculative/eagle_worker_common.py",
                             "new_seq_lens, bonus_tokens = prepare_verify_commit_outputs("),
                            ("srt/speculative/eagle_worker_common.py",
                             "new_seq_lens, bonus_tokens, prepared_commit_steps, prepared_draft_inputs = ("),
                            # the captured graphs' tables: built in place, with no host lengths, copied, grown
                            ("srt/mem_cache/kv_index_translator.py", "out = into[:rows, :width]"),
                            ("srt/mem_cache/kv_index_translator.py", "width = min(into.shape[1], row_pages)"),
                            ("srt/mem_cache/kv_index_translator.py", "out[:, :width].copy_(table.ids[:rows, :width])"),
                            ("srt/mem_cache/kv_index_translator.py", "out[: previous.ids.shape[0]].copy_(previous.ids)"),
                            # eagle_sample's sampling branch, as a rejection-sampling server verifies a chain draft
                            ("srt/speculative/eagle_utils.py", "sampling_fn = chain_speculative_sampling_triton"),
                            ("srt/speculative/eagle_utils.py", "sampling_fn = partial(sampling_fn, block_verification"),
                            ("srt/speculative/eagle_utils.py", "expanded_temperature = torch.repeat_interleave(")), data)


# -- real bugs, planted in a copy ------------------------------------------------------------

def _replay(tmp_path, edits, name):
    return replay_on_copy(altered_copy(tmp_path, edits, name), tmp_path, TREE, SEQ_LENS, PROP)


@pytest.mark.slow
@pytest.mark.parametrize("alteration", list(ALTERATIONS))
def test_real_bug_is_caught_by_its_sub_check(sglang_target, alteration, tmp_path):
    proc, out = _replay(tmp_path, ALTERATIONS[alteration], alteration)
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "report", out)
    assert (o["property"], o["stage"]) == (PROP, CAUGHT_BY[alteration]), out


#: the allocator's token count as the negated shrink
ALLOC_COUNT_REFACTOR = [(["srt/mem_cache/allocation_sizing.py"], r"num_needed_tokens \+= nxt - cur",
                         "num_needed_tokens -= cur - nxt")]


@pytest.mark.slow
def test_a_refactor_of_the_allocators_count_holds(sglang_target, tmp_path):
    proc, out = _replay(tmp_path, ALLOC_COUNT_REFACTOR, "alloc-count-refactor")
    assert proc.returncode == 0, out


@pytest.mark.slow
def test_a_refactor_of_the_page_count_holds(sglang_target, tmp_path):
    proc, out = _replay(tmp_path, REFACTOR, "page-count-refactor")
    assert proc.returncode == 0, out


#: the fused launch's unheld-page clamp by another expression (a page the table does not hold gives -1)
FUSED_REFACTOR = [(CACHE_LOCS, r"full_loc = tl\.maximum\(physical \* PAGE_SIZE \+ data % PAGE_SIZE, 0\)",
                   "full_loc = tl.where(physical >= 0, physical * PAGE_SIZE + data % PAGE_SIZE, 0)")]


#: the reader's sub-pool looked up by an explicit choice of source
READ_SPACE_REFACTOR = [(PLAN, r"return \(self\._source if reader is None else reader\)\.space\(kind\)",
                        "source = self._source\n        if reader is not None:\n            source = reader\n"
                        "        return source.space(kind)")]


#: the fused commit's length summed the other way round
FUSED_LENGTH_REFACTOR = [(EAGLE_KERNELS, r"tl\.store\(new_seq_lens \+ row, length \+ accepted, valid\)",
                          "tl.store(new_seq_lens + row, accepted + length, valid)")]


@pytest.mark.slow
def test_a_refactor_of_the_fused_commit_holds(sglang_target, tmp_path):
    proc, out = _replay(tmp_path, FUSED_LENGTH_REFACTOR, "fused-length-refactor")
    assert proc.returncode == 0, out


#: a grown table's first rows assigned by slice, not copied in place
GROWN_REFACTOR = [(TRANSLATOR, r"out\[: previous\.ids\.shape\[0\]\]\.copy_\(previous\.ids\)",
                   "out[: len(previous.ids)] = previous.ids")]


@pytest.mark.slow
def test_a_refactor_of_the_grown_table_holds(sglang_target, tmp_path):
    proc, out = _replay(tmp_path, GROWN_REFACTOR, "grown-table-refactor")
    assert proc.returncode == 0, out


@pytest.mark.slow
def test_a_refactor_of_the_read_space_holds(sglang_target, tmp_path):
    proc, out = _replay(tmp_path, READ_SPACE_REFACTOR, "read-space-refactor")
    assert proc.returncode == 0, out


@pytest.mark.slow
def test_a_refactor_of_the_fused_clamp_holds(sglang_target, tmp_path):
    proc, out = _replay(tmp_path, FUSED_REFACTOR, "fused-clamp-refactor")
    assert proc.returncode == 0, out


#: a chain draft as a rejection-sampling server runs it (topk 1, d = spec_steps + 1)
CHAIN = {**TREE, "topk": 1, "num_draft_tokens": 4}
EAGLE_UTILS = ["srt/speculative/eagle_utils.py"]
#: ours: the rejection-sampling branch hands the kernel the target-only sampler's all-zero draft
#: distribution, so every proposal is rejected (each request accepts only its root)
DRAFT_PROBS_DROPPED = [(EAGLE_UTILS, r"draft_probs = \(\n\s+verify_input\.draft_probs\n\s+if use_rejection_sampling\n"
                        r"\s+else torch\.zeros_like\(target_probs\)\n\s+\)",
                        "draft_probs = torch.zeros_like(target_probs)")]
#: the sampler chosen by one conditional expression, block verification wrapped after it
SAMPLER_REFACTOR = [(EAGLE_UTILS, r"( +)if use_rejection_sampling:\n\s+sampling_fn = chain_speculative_sampling_triton\n"
                     r"\s+if get_spec\(\)\.speculative_use_block_verification:\n\s+sampling_fn = partial\(sampling_fn, "
                     r"block_verification=True\)\n\s+else:\n\s+sampling_fn = tree_speculative_sampling_target_only\n",
                     "\\1sampling_fn = (chain_speculative_sampling_triton if use_rejection_sampling\n"
                     "\\1              else tree_speculative_sampling_target_only)\n"
                     "\\1if use_rejection_sampling and get_spec().speculative_use_block_verification:\n"
                     "\\1    sampling_fn = partial(sampling_fn, block_verification=True)\n")]


@pytest.mark.slow
def test_rejection_sampling_without_the_draft_distribution_is_caught(sglang_target, tmp_path):
    proc, out = replay_on_copy(altered_copy(tmp_path, DRAFT_PROBS_DROPPED, "draft-probs-dropped"), tmp_path, CHAIN,
                               SEQ_LENS, PROP)
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "report", out)
    assert (o["property"], o["stage"]) == (PROP, "accept moves"), out
    assert "rejection sampling" in out, out


@pytest.mark.slow
@pytest.mark.parametrize("edits", [SAMPLER_REFACTOR, []], ids=["sampler-refactor", "pristine"])
def test_the_chain_draft_holds_on_a_refactored_and_a_pristine_copy(sglang_target, tmp_path, edits):
    proc, out = replay_on_copy(altered_copy(tmp_path, edits, "chain"), tmp_path, CHAIN, SEQ_LENS, PROP)
    assert proc.returncode == 0, out


@pytest.mark.slow
def test_the_pristine_copy_holds(sglang_target, tmp_path):
    proc, out = _replay(tmp_path, [], "pristine")
    assert proc.returncode == 0, out


@settings(max_examples=30, deadline=None)
@given(kv_cases())
def test_drawn_kv_cases_are_consistent_with_their_trees_and_paths(case):
    """The strategy's own promises, no SGLang needed: lengths inside the context, one accepted path
    per request that walks its tree from the root, at most steps + 1 nodes."""
    assert len(case.seq_lens) == len(case.paths) == len(case.parents) >= 1
    assert all(0 <= s <= case.context_len for s in case.seq_lens)
    for parents, path in zip(case.parents, case.paths):
        assert 1 <= len(path) <= case.spec_steps + 1 and path[0] == 0
        assert all(parents[child] == parent for parent, child in zip(path, path[1:]))
