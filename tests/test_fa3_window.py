"""FlashAttention's windowed tree verify (a sliding-window model) under reader-agreement.

A windowed layer at topk > 1 reads one merged pass: row b * d + x (request b's
draft node x) over its prefix and then the tree nodes x sees, each entry at its
token's position, since the window is cut from a row's end. By hand, for two
requests (d 4, topk 2; node 0 sees 0; 1 sees 0, 1; 2 sees 0, 2; 3 sees 0, 1, 3):
the rows' counts, running sum and position-ordered slots; each slip is a typed
difference. SGLang's own eager and replayed merge is the meaning; altered copies
of its merge are caught through the CLI, and a refactor of it holds.
"""

from __future__ import annotations

import copy

import pytest

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.fa3_reads import Fa3Pass, Fa3Verify, swa_slot
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PropertyFailure
from vmfuzz.harness.properties.fa3_reads import WINDOW, WRITER, check_fa3, window_mismatch
from vmfuzz.harness.properties.kit import Observation
from tests.sglang_copies import altered_copy, failed_check_origin, replay_on_copy
from tests.test_fa3_reads import FA3, _i32, _right_view, _step

TREE = Config(TreeMaskMode.FULL_MASK, 4, 8, 4, 2, 3, True, "eagle")
BATCH = Batch((3, 5))
#: the nodes each draft node sees, root first (its ancestors by depth, then itself)
SEEN = [[0], [0, 1], [0, 2], [0, 1, 3]]


def _merged() -> Fa3Pass:
    """By hand: request 0 in pool slot 1 (KV slot 200 + token), request 1 in pool slot 0 (100 + token); the
    windowed layers read each token's slot in the window pool."""
    rows, counts = [], []
    for base, s in ((200, 3), (100, 5)):
        for seen in SEEN:
            row = [swa_slot(base + t) for t in range(s)] + [swa_slot(base + s + j) for j in seen]
            counts.append(len(row))
            rows.append(row + [0] * (12 - len(row)))
    running = [0]
    for n in counts:
        running.append(running[-1] + n)
    return Fa3Pass(_i32(counts), _i32(list(range(9))), _i32(running), _i32(rows), 1)


def _view() -> Fa3Verify:
    view = _right_view()
    view.window = _merged()
    return view


def _slip(view: Fa3Verify, name: str) -> None:
    w = view.window
    if name == "node before the prefix":  # a node's slot first: the window then keeps a prefix token instead
        w.page_table[1, :5] = _i32([swa_slot(n) for n in (204, 200, 201, 202, 203)])
    elif name == "sibling in place of the parent":
        w.page_table[7, 6] = swa_slot(107)
    elif name == "full-pool slot left untranslated":
        w.page_table[6, 5] = 105
    elif name == "count without the tree":
        w.cache_seqlens[2] = 3
        w.cu_seqlens_k[3:] -= 2
    elif name == "running sum one row late":
        w.cu_seqlens_k[1:] = w.cu_seqlens_k[:-1].clone()


SLIPS = {"node before the prefix": "page_table", "sibling in place of the parent": "page_table",
         "full-pool slot left untranslated": "page_table",
         "count without the tree": "cache_seqlens", "running sum one row late": "cu_seqlens_k"}


def test_the_merged_pass_by_hand_holds():
    assert window_mismatch(_view(), TREE, BATCH) is None


@pytest.mark.parametrize("slip", list(SLIPS))
def test_a_merged_pass_slip_is_a_typed_difference(slip):
    view = copy.deepcopy(_view())
    _slip(view, slip)
    diff = window_mismatch(view, TREE, BATCH)
    assert diff is not None and (diff.buffer, diff.cell, diff.effect) == (SLIPS[slip], "tree node row", "wrong"), diff
    assert "windowed server" in diff


class _Windowed:
    """A target whose windowed eager read is ``view`` and which replays nothing."""

    def __init__(self, view):
        self.view, self.asked = view, []

    def read_fa3_verify(self, config, batch, step, page_size=1, window=None, verify_lens=None):
        self.asked.append((page_size, window))
        return self.view if page_size == 1 else _right_view(page_size)


def test_the_page_size_one_server_is_windowed_and_a_slip_fails_reader_agreement_eagerly():
    step = _step(TREE, BATCH)
    target, obs = _Windowed(_view()), Observation()
    check_fa3(target, obs, TREE, BATCH, step, step.tree_mask)
    assert target.asked == [(1, WINDOW), (4, None)]
    assert "fa3 topk>1 verify, windowed" in obs.classes
    view = _view()
    _slip(view, "sibling in place of the parent")
    with pytest.raises(PropertyFailure) as caught:
        check_fa3(_Windowed(view), Observation(), TREE, BATCH, step, step.tree_mask)
    o = caught.value.origin
    assert (o.property, o.writer, o.buffer, o.stage) == ("reader-agreement", WRITER, "page_table", "eager")


# -- SGLang's FlashAttention backend -------------------------------------------------

def test_sglangs_own_windowed_verify_is_the_meaning(sglang_target):
    step = _step(TREE, BATCH)
    eager = sglang_target.read_fa3_verify(TREE, BATCH, step, 1, window=WINDOW)
    assert window_mismatch(eager, TREE, BATCH) is None
    assert eager.window.cache_seqlens.tolist() == _merged().cache_seqlens.tolist()
    replay = sglang_target.read_fa3_replay(TREE, Batch((3, 5, 2)), _step(TREE, Batch((3, 5, 2))), 1, window=WINDOW)
    assert replay.raised is None and replay.graph_bs == 4
    assert window_mismatch(replay, TREE, Batch((3, 5, 2))) is None


#: the merge's own code, each edit a slip a reviewer could miss; the first is a real one, in reverse: SGLang's
#: fix that translates the merged pass's slots to the window pool (sgl-project/sglang#24617, illegal memory
#: access on hybrid sliding-window models at topk > 1)
ALTERATIONS = {
    "window-merge-reads-full-pool-slots": (
        [(FA3, r"if self\.use_sliding_window_kv_pool:(\n\s+page_table_a = self\.token_to_kv_pool)", r"if False:\1")],
        ("page_table", "eager")),
    # the replay refills the counts but not their running sum: the graph reads the capture's sums
    "window-replay-running-sum-stale": (
        [(FA3, r"metadata_swa\.cu_seqlens_k\.copy_\(cu_seqlens_k\)", "pass")],
        ("cu_seqlens_k", "replay")),
    # each request's prefix length tiled across the batch, not repeated per node
    "window-prefix-lengths-tiled": (
        [(FA3, r"(cache_seqlens_int32 = \(\n\s+metadata\.cache_seqlens_int32)\.repeat_interleave\(",
          r"\1.repeat(")],
        ("cache_seqlens", "eager")),
}
#: the same per-node prefix lengths by broadcasting
REFACTOR = [(FA3, r"(cache_seqlens_int32 = \(\n\s+metadata\.cache_seqlens_int32)\.repeat_interleave\(\n\s+"
                  r"self\.speculative_num_draft_tokens\n\s+\)",
             r"\1[:, None].expand(-1, self.speculative_num_draft_tokens).reshape(-1)")]


def _replay(tmp_path, edits, name):
    config = {"mode": "FULL_MASK", "max_bs": 4, "max_context_len": 8, "num_draft_tokens": 4, "topk": 2,
              "spec_steps": 3}
    return replay_on_copy(altered_copy(tmp_path, edits, name), tmp_path, config, (3, 5, 2), "reader-agreement")


@pytest.mark.slow
@pytest.mark.parametrize("alteration", list(ALTERATIONS))
def test_an_altered_window_merge_is_caught_by_reader_agreement(sglang_target, alteration, tmp_path):
    edits, (buffer, stage) = ALTERATIONS[alteration]
    proc, out = _replay(tmp_path, edits, alteration)
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "report", out)
    assert (o["property"], o["effect"], o["buffer"], o["stage"]) == ("reader-agreement", "wrong", buffer, stage), out
    assert "windowed" in out


@pytest.mark.slow
def test_a_refactor_of_the_window_merge_holds(sglang_target, tmp_path):
    proc, out = _replay(tmp_path, REFACTOR, "window-merge-broadcast")
    assert proc.returncode == 0, out
