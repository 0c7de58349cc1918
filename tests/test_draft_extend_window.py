"""The draft-extend cuda-graph runner of a draft model with window layers: its replay's window rail.

A case whose draft model has window layers (``draft_window``: one config in two,
the same choice as its draft-decode runner's) builds the EAGLE draft-extend
runner over a Triton backend with a sliding window. Its replay metadata then
refills the window rail from the prefix before each request's window
(``_update_draft_extend_buffers``' window branch: the rail's slots and each
request's window start), and the stand-in draft model's window layers read
both; graph-replay-equivalence compares them with the eager draft extend's
(``init_forward_metadata``'s extend branch, a path of its own). No other case
runs that branch.
"""

from __future__ import annotations

import pytest

from tests.helpers import sglang_or_skip
from tests.sglang_copies import assert_altered_replay_caught, assert_altered_replay_holds
from tests.surface_ran import assert_texts_ran, checked_under_coverage
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode

TRITON = ["srt/layers/attention/triton_backend.py"]
PROP = "graph-replay-equivalence"
#: topk 2, 3 steps, a 21-token context: the draft model's window is 10, so the request of 14 prefix tokens
#: reads a clipped window (it starts at prefix position 4)
CASE = {"mode": "FULL_MASK", "max_bs": 3, "max_context_len": 21, "num_draft_tokens": 6, "topk": 2,
        "spec_steps": 3, "is_read": True}
LENS = (14, 3)
#: the line only a windowed draft-extend replay runs
LINES = (("srt/layers/attention/triton_backend.py", "_, _, _, self.cuda_graph_window_kv_offsets[:bs] = ("),)
_CALL = (r"self\.sliding_window_size,\n(\s+)kv_lens,\n(\s+)bs,\n(\s+)token_to_kv_pool=self\.token_to_kv_pool,\n"
         r"(\s+)window_kv_indices=self\.cuda_graph_window_kv_indices,")
#: name -> edits; each is caught on the draft-extend runner's replay
ALTERATIONS = {
    # the window clipped from the post-write length: the rail takes the window's own draft slots for prefix
    "window-from-post-write-length": [(TRITON, _CALL, "self.sliding_window_size,\n\\1seq_lens,\n\\2bs,\n"
                                                      "\\3token_to_kv_pool=self.token_to_kv_pool,\n"
                                                      "\\4window_kv_indices=self.cuda_graph_window_kv_indices,")],
    # each request's window start never stored: a clipped window is read as if it began at the prefix's start
    "window-start-dropped": [(TRITON, r"_, _, _, self\.cuda_graph_window_kv_offsets\[:bs\] = \(",
                              "_, _, _, _ = (")],
}
#: the window clipped from a length never above the prefix's: the same lengths
REWRITE = [(TRITON, _CALL, "self.sliding_window_size,\n\\1torch.minimum(kv_lens, seq_lens).to(torch.int32),\n"
                           "\\2bs,\n\\3token_to_kv_pool=self.token_to_kv_pool,\n"
                           "\\4window_kv_indices=self.cuda_graph_window_kv_indices,")]
WANT = {"writer": "draft extend replay", "cell": "real row"}


def _config() -> Config:
    return Config(TreeMaskMode.FULL_MASK, 3, 21, 6, 2, 3, is_read=True).validate()


def test_the_case_has_a_windowed_draft_model():
    from vmfuzz.harness.properties.draft_graph import draft_window
    assert draft_window(_config()) == 10


def test_a_windowed_replay_reads_the_clipped_window_the_eager_run_reads(sglang_target):
    from vmfuzz.harness.guard.shadow import ShadowHeap
    s = sglang_target.draft_extend_session(_config(), ShadowHeap(), "draft extend", 10)
    batch = Batch(LENS)
    x = s.inputs(batch)
    got, want = s.replay(batch, x)[0], s.eager(batch, x)[0]
    rails = [(a.window_slots, a.window_start) for a in want.forward.attended]
    assert [(a.window_slots, a.window_start) for a in got.forward.attended[:len(rails)]] == rails
    assert len(rails[0][0]) == 10 and rails[0][1] == 4  # the long request's window: its last 10 prefix tokens
    assert len(rails[-1][0]) == 3 and rails[-1][1] == 0  # the short one's: its whole prefix
    assert s.overruns == []


def test_the_judged_sglang_line_ran(sglang_target):
    """coverage.py, as the gate measures: the window branch of the draft-extend graph metadata ran under the
    property."""
    root, _, data = checked_under_coverage(sglang_target, PROP, _config(), [Batch(LENS)], [TRITON[0]])
    assert_texts_ran(root, LINES, data)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALTERATIONS))
def test_each_window_rail_bug_is_caught_by_graph_replay_equivalence(tmp_path, name):
    sglang_or_skip()
    assert_altered_replay_caught(tmp_path, ALTERATIONS[name], name, CASE, LENS, PROP, WANT)


@pytest.mark.slow
@pytest.mark.parametrize("edits", [[], REWRITE], ids=["pristine", "window-from-a-no-larger-length"])
def test_pristine_sglang_and_a_rewrite_of_the_window_length_hold(tmp_path, edits):
    sglang_or_skip()
    assert_altered_replay_holds(tmp_path, edits, "rewrite" if edits else None, CASE, LENS, PROP)
