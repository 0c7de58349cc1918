"""SGLang's draft-decode cuda-graph runner (EAGLEDraftCudaGraphRunner) through the graph stand-in.

Pristine: the three graph properties judge it (their ``draft:`` classes) and hold. Altered copies of SGLang
carry real fixes reverted; each is caught by the property meant for it, as its own failure (never a raise).
"""

from __future__ import annotations

import pytest

from tests.helpers import sglang_or_skip
from tests.sglang_copies import altered_copy, failed_check_origin, replay_on_copy
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode

RUNNER = ["srt/speculative/eagle_draft_cuda_graph_runner.py"]
#: topk 2, 3 steps, 6 draft tokens; graphs at bs 1, 2, 4; the first batch replays padded (3 -> 4)
CONFIG = Config(TreeMaskMode.FULL_MASK, 4, 32, 6, 2, 3)
BATCHES = [Batch((5, 7, 3)), Batch((9,)), Batch((2, 3, 4, 5)), Batch((1,) * 5)]


@pytest.mark.parametrize("name", ["graph-replay-equivalence", "padding-inert", "capture-replay-agreement"])
def test_the_draft_runner_is_judged_and_holds_on_the_installed_sglang(sglang_target, name):
    from vmfuzz.harness.properties import PROPERTIES
    obs = PROPERTIES[name].check(sglang_target, CONFIG, BATCHES)
    assert {"draft: padded replay", "draft: exact replay", "draft: not admitted by can_run_graph (eager)"} <= obs.classes


def test_a_padded_draft_replay_drafts_what_the_eager_draft_does(sglang_target):
    from vmfuzz.harness.model.draft_graph import DraftShape
    s = sglang_target.draft_graph_session(DraftShape(2, 3, 6, 32), 4)
    assert s.capture_bs == [1, 2, 4]
    got, want = s.replay([5, 7, 3]), s.eager([5, 7, 3])
    assert got.graph_bs == 4 and got.draft_tokens.shape == (3, 5)
    assert got.draft_tokens.tolist() == want.draft_tokens.tolist()
    for a, b in zip(got.steps, want.steps):
        assert a.attended[:6] == b.attended and a.kv_writes[:6] == b.kv_writes
        assert [slot for slot, _ in a.kv_writes[6:]] == [0, 0]  # the padded request writes slot 0 only
    # the padded branches' kv_indptr (from positions 0) is one cell short of what the kernel wrote for
    # them (from seq_lens f = 1): inert, their reads feed only their own cut-off rows and slot-0 writes
    assert [len(x) for x in got.steps[0].attended[6:]] == [1, 1]
    assert s.overruns == []


def test_a_largest_bucket_session_has_the_whole_lists_buffers_and_replays_a_full_bucket_alike(sglang_target):
    from vmfuzz.harness.model.draft_graph import DraftShape
    shape = DraftShape(2, 3, 6, 32)
    whole, largest = (sglang_target.draft_graph_session(shape, 4, largest_only=x) for x in (False, True))
    assert largest.capture_bs == [4] and largest.max_bs == whole.max_bs == 4
    assert largest.allocated() == whole.allocated()  # SGLang sizes every static buffer for the largest bs
    lens = [9, 9, 9, 9]
    got, want = largest.replay(lens), whole.replay(lens)
    assert got.graph_bs == want.graph_bs == 4 and got.draft_tokens.tolist() == want.draft_tokens.tolist()
    assert [a.kv_writes for a in got.steps] == [a.kv_writes for a in want.steps]


def test_graph_buffer_soundness_counts_every_branch_and_step_from_the_meaning():
    from vmfuzz.harness.model.draft_graph import DraftShape, footprints, kv_ids_needed
    shape = DraftShape(2, 3, 6, 32)
    assert kv_ids_needed(shape, [5, 7, 3, 1], 0) == 2 * (6 + 8 + 4 + 2)
    need = footprints(shape, 4, 4, [31] * 4)
    assert need["kv_indices"] == 2 * 4 * (31 + 3) and need["out_cache_loc"] == 24 and need["kv_indptr"] == 9


@pytest.fixture(autouse=True)
def every_case_drafts(monkeypatch):
    """Every case's draft runner judged (a search judges one case in four): these cases are chosen."""
    monkeypatch.setenv("VMFUZZ_DRAFT_SHARE", "1")


#: name -> (edits, the property meant to catch it, the buffer its origin names)
ALTERATIONS = {
    # S#26880 reverted: the padded rows' fill lengths left out of the replay's seq_lens_sum
    "draft-seq-lens-sum-unpadded": (
        [(RUNNER, r"raw_seq_lens_sum \+ \(bs - raw_bs\) \* self\.seq_len_fill_value", "raw_seq_lens_sum")],
        "capture-replay-agreement", "seq_lens_sum"),
    # S#15399 / S#23037 reverted: padded rows keep the previous step's topk_index
    "draft-topk-index-not-zeroed": (
        [(RUNNER, r"buffers\.topk_index\.zero_\(\)", "pass")], "padding-inert", "topk_index"),
    # S#25529 reverted: the backend is handed the raw-length out_cache_loc at a padded replay
    "draft-out-cache-loc-raw-length": (
        [(RUNNER, r"forward_batch\.out_cache_loc = buffers\.out_cache_loc\[\s*: num_tokens \* self\.speculative_num_steps\s*\]",
          "pass")], "capture-replay-agreement", "out_cache_loc"),
}
CASE = {"mode": "FULL_MASK", "max_bs": 4, "max_context_len": 32, "num_draft_tokens": 6, "topk": 2,
        "spec_steps": 3, "is_read": True}

CACHE_LOCS = ["kernels/ops/speculative/cache_locs.py"]
TRITON = ["srt/layers/attention/triton_backend.py"]
#: a case whose draft model has window layers (``draft_window``: 7 of its 14-token context); the
#: request of 9 tokens attends past the window, so its window layers read a clipped tail
WINDOW_CASE = {**CASE, "max_context_len": 14}
WINDOW_LENS = (5, 9, 3)
#: name -> (edits, the property meant to catch it): bugs in the per-step window rail, each in lines
#: only a model with window layers runs
WINDOW_ALTERATIONS = {
    # the branches' output offsets sum the earlier branches' whole reads, not their clipped windows
    "window-offsets-unclipped": (
        [(CACHE_LOCS, r"prev_window = tl\.where\(in_front, tl\.minimum\(prev_lens \+ iters, window\), 0\)"
                      r"\n(\s+)base = tl\.sum\(prev_window\)\n(\s+)out_ptr",
          r"prev_window = tl.where(in_front, prev_lens + iters, 0)\n\1base = tl.sum(prev_window)\n\2out_ptr")],
        "graph-replay-equivalence"),
    # the window clipped by the committed prefix alone, the draft's own chain left out of its length
    "window-ignores-draft-chain": (
        [(CACHE_LOCS, r"window_len = tl\.minimum\(total, window\)", "window_len = tl.minimum(seq_len, window)")],
        "graph-replay-equivalence"),
    # every draft step handed the first step's window offsets
    "window-rail-first-step-indptr": (
        [(TRITON, r"window_kv_indptr = self\.window_kv_indptr\[\n(\s+)i, : bs \+ 1",
          r"window_kv_indptr = self.window_kv_indptr[\n\g<1>0, : bs + 1")],
        "graph-replay-equivalence"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALTERATIONS))
def test_each_reverted_draft_fix_is_caught_by_its_property(tmp_path, name):
    sglang_or_skip()
    edits, prop, buffer = ALTERATIONS[name]
    proc, out = replay_on_copy(altered_copy(tmp_path, edits, name), tmp_path, CASE, (5, 7, 3), prop)
    assert proc.returncode == 1, out
    origin = failed_check_origin(tmp_path / "report", out)
    assert (origin["property"], origin["buffer"]) == (prop, buffer), origin


@pytest.mark.slow
def test_a_refactor_of_the_draft_runner_is_not_caught(tmp_path):
    sglang_or_skip()
    edits = [(RUNNER, r"raw_seq_lens_sum \+ \(bs - raw_bs\) \* self\.seq_len_fill_value",
              "(bs - raw_bs) * self.seq_len_fill_value + raw_seq_lens_sum")]
    proc, out = replay_on_copy(altered_copy(tmp_path, edits, "refactor"), tmp_path, CASE, (5, 7, 3),
                               "capture-replay-agreement")
    assert proc.returncode == 0 and "held capture-replay-agreement" in out, out


@pytest.mark.slow
def test_the_draft_kv_indices_width_without_topk_is_a_new_capacity_finding_beside_the_known_one(tmp_path):
    """S#27338 reverted: the row sized for max_bs * C ids, not max_bs * topk * C. The shipped known
    entry (requests past their context, cell 'past context') must not excuse it: it is short for
    requests that draft inside their context (cell 'capacity')."""
    sglang_or_skip()
    edits = [(["srt/speculative/spec_utils.py"], r"return num_seqs \* topk \* max_context_len",
              "return num_seqs * max_context_len")]
    proc, out = replay_on_copy(altered_copy(tmp_path, edits, "width-without-topk"), tmp_path, CASE, (5, 7, 3),
                               "graph-buffer-soundness")
    assert proc.returncode == 1, out
    origin = failed_check_origin(tmp_path / "report", out)
    assert (origin["property"], origin["buffer"], origin["cell"]) == ("graph-buffer-soundness", "kv_indices",
                                                                      "capacity"), origin


def test_the_window_case_has_window_layers_and_pages():
    from vmfuzz.harness.model.config import Config
    from vmfuzz.harness.properties.draft_graph import draft_page_size, draft_window
    config = Config(TreeMaskMode[WINDOW_CASE["mode"]], 4, 14, 6, 2, 3, is_read=True).validate()
    assert draft_window(config) == 7 and max(WINDOW_LENS) + 1 > 7  # a request reads a clipped window
    assert draft_page_size(config) == 4  # its branches own whole pages: the rail's paged chain
    assert draft_window(CONFIG) == 0 and draft_page_size(CONFIG) == 1  # the other cases: no window, unpaged


def test_a_paged_window_model_reads_the_tail_of_each_branchs_paged_chain(sglang_target):
    from vmfuzz.harness.model.draft_graph import DraftShape, branch_read_columns, window_reads
    shape = DraftShape(2, 3, 6, 14, 4, 7)
    s = sglang_target.draft_graph_session(shape, 4)
    lens = list(WINDOW_LENS)
    want = s.eager(lens)
    for step in want.steps:
        for z, attended in enumerate(step.attended):
            b, t = divmod(z, 2)
            assert list(attended) == [s.cell(3, b, c) for c in branch_read_columns(shape, lens[b], t, step.step)]
            assert step.window_attended[z] == window_reads(attended, 7)


def test_a_window_model_reads_the_tail_of_what_each_branch_attends(sglang_target):
    from vmfuzz.harness.model.draft_graph import DraftShape, window_reads
    s = sglang_target.draft_graph_session(DraftShape(2, 3, 6, 14, 1, 7), 4)
    got, want = s.replay(list(WINDOW_LENS)), s.eager(list(WINDOW_LENS))
    for a, b in zip(got.steps, want.steps):
        assert a.window_attended[:6] == b.window_attended
        assert b.window_attended == [window_reads(x, 7) for x in b.attended]
    assert any(len(x) == 7 < len(y) for x, y in zip(want.steps[0].window_attended, want.steps[0].attended))
    assert s.overruns == []
    assert s.allocated()["window_kv_indices"] == s.needed()["window_kv_indices"] == 4 * 2 * 7


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WINDOW_ALTERATIONS))
def test_each_window_rail_bug_is_caught_by_its_property(tmp_path, name):
    sglang_or_skip()
    edits, prop = WINDOW_ALTERATIONS[name]
    proc, out = replay_on_copy(altered_copy(tmp_path, edits, name), tmp_path, WINDOW_CASE, WINDOW_LENS, prop)
    assert proc.returncode == 1, out
    origin = failed_check_origin(tmp_path / "report", out)
    assert (origin["property"], origin["buffer"]) == (prop, "window_kv_indices"), origin


@pytest.mark.slow
@pytest.mark.parametrize("prop", ["graph-replay-equivalence", "graph-buffer-soundness"])
def test_a_refactor_of_the_window_offsets_and_the_pristine_window_hold(tmp_path, prop):
    """The clipped offsets by another expression (clip after masking: the same as the window is positive);
    graph-buffer-soundness at the requests' capacity length (its past-context row is a known finding)."""
    sglang_or_skip()
    edits = [(CACHE_LOCS, r"tl\.where\(in_front, tl\.minimum\(prev_lens \+ iters, window\), 0\)",
              "tl.minimum(tl.where(in_front, prev_lens + iters, 0), window)")]
    lens = WINDOW_LENS if prop != "graph-buffer-soundness" else (11,)
    proc, out = replay_on_copy(altered_copy(tmp_path, edits, "window-refactor"), tmp_path, WINDOW_CASE, lens, prop)
    assert proc.returncode == 0, out
    assert (f"held {prop}" if prop != "graph-buffer-soundness" else "known finding draft-kv-indices-past-context") \
        in out, out


#: a windowed case whose server is unpaged (``draft_page_size``): a topk > 1 branch's chain slots then step
#: by the branch's number of steps, a form only page size 1 takes (9 of 18 tokens; the 9-token request clips)
#: context 21: a window of 10 tokens, unpaged, on a server without the metadata glue graph (context 18, the
#: first choice, became a glued window-pool server, where this alteration was measured not to be met)
WINDOW_UNPAGED_CASE = {**CASE, "max_bs": 3, "max_context_len": 21}
#: the same chain slots written another way round (what the kernel reads is unchanged)
WINDOW_UNPAGED_REFACTOR = [(CACHE_LOCS, r"chain_pos = seq_len \+ topk_id \* num_steps \+ chain_step",
                            "chain_pos = chain_step + num_steps * topk_id + seq_len")]


def test_the_unpaged_window_case_is_judged_unpaged():
    from vmfuzz.harness.properties.draft_graph import draft_page_size, draft_window
    from vmfuzz.harness.properties.graph_glue import glued
    config = Config(TreeMaskMode.FULL_MASK, 3, 21, 6, 2, 3, is_read=True).validate()
    assert (draft_window(config), draft_page_size(config), glued(config)) == (10, 1, False)


@pytest.mark.slow
@pytest.mark.parametrize("altered", [True, False])
def test_an_unpaged_window_read_of_another_branchs_chain_is_caught_and_a_refactor_holds(tmp_path, altered):
    """Every branch's window layers read branch 0's chain slots (the branch's offset dropped on page 1): the
    replay and the eager draft share the kernel, so only the meaning (the tail of what it attends) sees it."""
    sglang_or_skip()
    edits = ([(CACHE_LOCS, r"chain_pos = seq_len \+ topk_id \* num_steps \+ chain_step",
               "chain_pos = seq_len + chain_step")] if altered else WINDOW_UNPAGED_REFACTOR)
    proc, out = replay_on_copy(altered_copy(tmp_path, edits, "window-unpaged"), tmp_path, WINDOW_UNPAGED_CASE,
                               (5, 9, 3), "graph-replay-equivalence")
    if not altered:
        assert proc.returncode == 0 and "held graph-replay-equivalence" in out, out
        return
    assert proc.returncode == 1, out
    origin = failed_check_origin(tmp_path / "report", out)
    assert (origin["property"], origin["buffer"], origin["cell"]) == (
        "graph-replay-equivalence", "window_kv_indices", "real row"), origin


FLASHINFER = ["srt/layers/attention/flashinfer_backend.py"]
#: name -> edits: bugs in FlashInfer's multi-step draft plan, caught by capture-replay-agreement on kv_indptr
FLASHINFER_ALTERATIONS = {
    # the host plan's per-branch chain offset one step short
    "flashinfer-host-indptr-step-short": [(FLASHINFER, r"\[offset \+ branch \* \(step \+ 1\) for branch, offset",
                                            "[offset + branch * step for branch, offset")],
    # every draft step planned from the first step's host indptr
    "flashinfer-host-indptr-first-step": [(FLASHINFER, r"global_override_indptr_cpu = indptr_cpu_whole\[i\]",
                                            "global_override_indptr_cpu = indptr_cpu_whole[0]")],
}


def test_flashinfer_plans_each_real_branch_from_a_host_indptr_that_agrees(sglang_target):
    from vmfuzz.harness.model.draft_graph import DraftShape, branch_read_columns
    shape = DraftShape(2, 3, 6, 32)
    s = sglang_target.draft_graph_session(shape, 4)
    lens = [5, 7, 3]
    got = s.replay(lens)
    drafted = s.flashinfer_plans(got.view)
    assert [d.host_indptr for d in drafted] == [False, True]
    for d in drafted:
        assert d.violations == [] and [st.step for st in d.steps] == [0, 1]
        for st in d.steps:
            assert st.host_indptr[:7] == st.indptr[:7]  # the real branches; padded ones differ (documented)
            b, t = divmod(5, 2)
            assert st.indices[st.indptr[5]:st.indptr[6]] == [
                s.cell(3, b, c) for c in branch_read_columns(shape, lens[b], t, st.step)]
    assert drafted[1].steps[0].host_indptr[7:9] != drafted[1].steps[0].indptr[7:9]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FLASHINFER_ALTERATIONS))
def test_each_flashinfer_draft_plan_bug_is_caught(tmp_path, name):
    sglang_or_skip()
    proc, out = replay_on_copy(altered_copy(tmp_path, FLASHINFER_ALTERATIONS[name], name), tmp_path, CASE, (5, 7, 3),
                               "capture-replay-agreement")
    assert proc.returncode == 1, out
    origin = failed_check_origin(tmp_path / "report", out)
    assert (origin["property"], origin["buffer"], origin["cell"]) == ("capture-replay-agreement", "kv_indptr",
                                                                      "host plan"), origin


@pytest.mark.slow
def test_a_refactor_of_flashinfers_host_indptr_holds(tmp_path):
    sglang_or_skip()
    edits = [(FLASHINFER, r"\[offset \+ branch \* \(step \+ 1\) for branch, offset in enumerate\(offsets\)\]",
              "[offsets[branch] + (step + 1) * branch for branch in range(len(offsets))]")]
    proc, out = replay_on_copy(altered_copy(tmp_path, edits, "flashinfer-refactor"), tmp_path, CASE, (5, 7, 3),
                               "capture-replay-agreement")
    assert proc.returncode == 0 and "held capture-replay-agreement" in out, out
