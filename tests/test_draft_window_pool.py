"""The draft-decode cuda-graph runner on a window-pool server: its window layers' reads and writes in window slots.

An unpaged server whose draft model has window layers keeps their KV apart
(SGLang's ``SWAKVPool``; ``draft_graph_runner`` with ``DraftShape.window_pool``).
The multi-step Triton backend then translates each step's window rail into
window slots (``_fill_window_rail``'s static-pool branch) and, before a replay,
refills each step's window write slots from that step's columns of the plan
(``init_forward_metadata_out_graph``'s window-pool branch). Only such a server
runs those lines; graph-replay-equivalence judges both against the meaning (the
window slot of what each branch attends and writes), so a bug each path shares
is seen too.
"""

from __future__ import annotations

import pytest

from tests.helpers import sglang_or_skip
from tests.sglang_copies import assert_altered_replay_caught, assert_altered_replay_holds
from tests.surface_ran import assert_texts_ran, checked_under_coverage, surface_never_ran
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode

TRITON = ["srt/layers/attention/triton_backend.py"]
PROP = "graph-replay-equivalence"
#: topk 2, 3 steps, a 21-token context: a window of 10 tokens, unpaged, so a window-pool server; the request
#: of 9 tokens reads a clipped window
CASE = {"mode": "FULL_MASK", "max_bs": 3, "max_context_len": 21, "num_draft_tokens": 6, "topk": 2,
        "spec_steps": 3, "is_read": True}
LENS = (5, 9, 3)
#: the lines only a window-pool draft server runs
LINES = (("srt/layers/attention/triton_backend.py",
          "row.copy_(self.token_to_kv_pool.translate_loc_from_full_to_swa(row))"),
         ("srt/layers/attention/triton_backend.py", "self.attn_backends[i]._fill_cuda_graph_swa_out_cache_loc("))
#: name -> (edits, the buffer the property's origin names)
ALTERATIONS = {
    # the rail left in full-pool ids on a static window pool: the window layers read full slots as window ones
    "rail-untranslated": ([(TRITON, r"if \(\n(\s+)not src\.is_translated\n(\s+)and self\.kv_index_translator",
                            r"if (\n\1src.is_translated\n\2and self.kv_index_translator")], "window_kv_indices"),
    # every step's window write slots refilled from the first step's columns before a replay
    "swa-refill-first-step": ([(TRITON, r"with self\._step_writes\(forward_batch, i\):\n(\s+)self\.attn_backends\[i\]"
                                        r"\._fill_cuda_graph_swa_out_cache_loc\(",
                                r"with self._step_writes(forward_batch, 0):\n\1self.attn_backends[i]"
                                r"._fill_cuda_graph_swa_out_cache_loc(")], "swa_out_cache_loc"),
}
#: the rail's rows translated through a copy: what each row holds afterwards is unchanged
REWRITE = [(TRITON, r"row\.copy_\(self\.token_to_kv_pool\.translate_loc_from_full_to_swa\(row\)\)",
            "row[:] = self.token_to_kv_pool.translate_loc_from_full_to_swa(row.clone())")]


@pytest.fixture(autouse=True)
def every_case_drafts(monkeypatch):
    """Every case's draft runner judged (a search judges one case in four): this case is chosen."""
    monkeypatch.setenv("VMFUZZ_DRAFT_SHARE", "1")


def _config() -> Config:
    return Config(TreeMaskMode.FULL_MASK, 3, 21, 6, 2, 3, is_read=True).validate()


def test_the_case_is_a_window_pool_server():
    from vmfuzz.harness.properties.draft_graph import draft_page_size, draft_shape
    shape = draft_shape(_config(), draft_page_size(_config()))
    assert (shape.window, shape.page_size, shape.window_pool) == (10, 1, True)
    # a paged windowed server keeps one pool (the rail's untranslated branch stays driven)
    assert not draft_shape(_config(), 4).window_pool


def test_a_window_pool_replay_reads_and_writes_the_window_slots_the_meaning_gives(sglang_target):
    from vmfuzz.harness.model.draft_graph import DraftShape, window_reads
    s = sglang_target.draft_graph_session(DraftShape(2, 3, 6, 21, 1, 10, window_pool=True), 3)
    backend = s.server.backend
    assert all(b.use_sliding_window_kv_pool for b in backend.attn_backends)  # SGLang's decision over the pool
    assert {k.name for k in backend.kv_index_translator._spaces} == {"FULL", "SLIDING_WINDOW"}
    for step in backend.attn_backends[:-1]:
        assert s.server.space.heap.backing_of(step.cuda_graph_swa_out_cache_loc) is not None
    got, want = s.replay(list(LENS)), s.eager(list(LENS))
    for a, b in zip(got.steps, want.steps):
        assert a.window_attended[:6] == b.window_attended and a.window_writes[:6] == b.window_writes
        assert b.window_writes == [s.window_slot(slot) for slot, _ in b.kv_writes]
        assert b.window_attended == [tuple(s.window_slot(x) for x in window_reads(y, 10)) for y in b.attended]
        assert b.window_writes != [slot for slot, _ in b.kv_writes]  # the map moves every slot it is handed
    assert s.overruns == []


def test_the_judged_sglang_lines_ran(sglang_target):
    """coverage.py, as the gate measures: the draft backend's surface ran under the property (an exact replay:
    the runner's padded-row cut is test_draft_graph's), and so did the two branches only a window-pool server
    takes."""
    from vmfuzz.harness.targets.sglang.draft_graph_runner import SURFACE, TRITON_FILE
    surface = [row for row in SURFACE if row[0] == TRITON_FILE]
    root, obs, data = checked_under_coverage(sglang_target, PROP, _config(), [Batch(LENS)], [TRITON_FILE])
    assert "draft: window layers' KV apart (a hybrid pool)" in obs.classes, sorted(obs.classes)
    unrun = surface_never_ran(root, surface, data)
    assert not unrun, f"driven functions whose lines never ran: {unrun}"
    assert_texts_ran(root, LINES, data)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALTERATIONS))
def test_each_window_pool_bug_is_caught_by_graph_replay_equivalence(tmp_path, name):
    sglang_or_skip()
    edits, buffer = ALTERATIONS[name]
    assert_altered_replay_caught(tmp_path, edits, name, CASE, LENS, PROP, {"buffer": buffer, "cell": "real row"})


@pytest.mark.slow
@pytest.mark.parametrize("edits", [[], REWRITE], ids=["pristine", "rail-translated-through-a-copy"])
def test_pristine_sglang_and_a_rewrite_of_the_rails_translation_hold(tmp_path, edits):
    sglang_or_skip()
    assert_altered_replay_holds(tmp_path, edits, "rewrite" if edits else None, CASE, LENS, PROP)
