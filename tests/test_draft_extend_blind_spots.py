"""Three draft-extend mutants a mutation sample left green, each now caught by the property meant for it.

The sample (bench/mutation-0.5.23/survivors-seed20261206.md) found three changes to SGLang 0.5.23's
draft-extend cuda-graph path whose outputs differ on the gate's examples while every check held:

- ``rotate_input_ids_kernel`` writing the shifted window through ``start_loc % offsets``: the replay
  and the eager loop both rotate with it, so they agree and both are wrong. graph-replay-equivalence
  now judges each step's token ids by the rotation's meaning, in both.
- the EAGLE v2 runner rebinding its padded ``spec_info`` views only when NOT padded: the view keeps
  the raw batch's per-request counts. capture-replay-agreement now judges that the view's per-request
  ``spec_info`` fields hold the graph's B rows, read or not.
- the multi-layer step runner cutting its view's ``input_ids`` / ``out_cache_loc`` to ``bs & w``
  tokens. capture-replay-agreement now judges their B·w cells on the multi-layer runners, read or not
  (measured: pristine always hands B·w there).

Each alteration fails as the property's own check naming the buffer (never a raise); a rewrite of the
same lines that keeps what they do holds; the pristine copy holds.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.helpers import sglang_or_skip
from tests.sglang_copies import (altered_copy, assert_altered_replay_caught, assert_altered_replay_holds,
                                 replay_on_copy)
from tests.test_draft_extend_graph import _CHAIN, _TREE, DE_RUNNER, ML_KERNEL
from vmfuzz.harness.properties.kit import PropertyFailure

ML_RUNNER = ["srt/speculative/multi_layer_eagle_draft_extend_cuda_graph_runner.py"]
#: topk 2, d 4: the EAGLE v2 runner only; topk 1, d = steps + 1 = 3: the multi-layer runners too. Graphs
#: at bs 1, 2, 4: the batch (5, 7, 3) replays padded to 4
TREE, CHAIN = _TREE, _CHAIN
LENS = (5, 7, 3)
_ROTATE_WRITE = r"write_ptr = input_ids_ptr \+ start_loc \+ offsets"
_PADDED_SPEC = r"if bs != raw_bs:(\n\s+forward_batch\.spec_info\.positions)"
_STEP_TOKENS = r"(self\.deepep_adapter\.replay\(\)\n\s+buffers = self\.buffers\n\s+)num_tokens = bs \* self\.captured_req_width"

#: name -> (edits, case, the property meant to catch it, the origin fields it must name)
ALTERATIONS = {
    "rotate-writes-through-a-modulo": (
        [(ML_KERNEL, _ROTATE_WRITE, "write_ptr = input_ids_ptr + start_loc % offsets")], CHAIN,
        "graph-replay-equivalence",
        {"writer": "multi-layer draft extend replay", "buffer": "input_ids", "cell": "real row"}),
    "padded-spec-views-rebound-only-unpadded": (
        [(DE_RUNNER, _PADDED_SPEC, r"if bs == raw_bs:\1")], TREE, "capture-replay-agreement",
        {"writer": "draft extend replay", "buffer": "num_correct_drafts", "cell": "capture-replay"}),
    "step-view-tokens-by-bitwise-and": (
        [(ML_RUNNER, _STEP_TOKENS, r"\1num_tokens = bs & self.captured_req_width")], CHAIN,
        "capture-replay-agreement",
        {"writer": "multi-layer draft extend replay", "buffer": "input_ids", "cell": "capture-replay"}),
}

#: name -> (edits, case, property): the same lines rewritten without changing what they do
REFACTORS = {
    "rotate-writes-one-before-the-read": (
        [(ML_KERNEL, _ROTATE_WRITE, "write_ptr = read_ptr - 1")], CHAIN, "graph-replay-equivalence"),
    "padded-spec-views-when-raw-is-smaller": (
        [(DE_RUNNER, _PADDED_SPEC, r"if raw_bs < bs:\1")], TREE, "capture-replay-agreement"),
    "step-view-tokens-width-first": (
        [(ML_RUNNER, _STEP_TOKENS, r"\1num_tokens = self.captured_req_width * bs")], CHAIN,
        "capture-replay-agreement"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALTERATIONS))
def test_each_blind_spot_is_caught_by_its_property(tmp_path, name):
    sglang_or_skip()
    edits, case, prop, want = ALTERATIONS[name]
    assert_altered_replay_caught(tmp_path, edits, name, case, LENS, prop, want)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REFACTORS))
def test_a_rewrite_of_the_same_lines_holds(tmp_path, name):
    sglang_or_skip()
    edits, case, prop = REFACTORS[name]
    assert_altered_replay_holds(tmp_path, edits, name, case, LENS, prop)


@pytest.mark.slow
@pytest.mark.parametrize("prop", ["graph-replay-equivalence", "capture-replay-agreement"])
def test_the_pristine_copy_holds_on_every_runner(tmp_path, prop):
    sglang_or_skip()
    proc, out = replay_on_copy(altered_copy(tmp_path, []), tmp_path, CHAIN, LENS, prop)
    assert proc.returncode == 0 and f"held {prop}" in out, out


def _step(ids, pick):
    return SimpleNamespace(forward=SimpleNamespace(input_ids=ids), topk_index=torch.tensor([[p] for p in pick]))


@pytest.mark.parametrize("third, held", [
    ([50, 4, 3, 6, 60, 7], True),
    ([50, 4, 0, 6, 60, 7], False),  # the last cell not kept
    ([50, 3, 3, 6, 60, 7], False),  # the pick not written at the accepted row
    ([2, 4, 3, 6, 60, 7], False),  # not shifted
    ([50, 4, 3, 60, 60, 7], False),  # the second request's window written over
])
def test_the_rotation_is_judged_by_its_meaning(third, held):
    """Request 0 accepted two of three rows (select 1), request 1 all three (select 5): step 1 shifts each
    window left, the last cell keeps its token unless it is the accepted row, the pick lands there."""
    from vmfuzz.harness.properties.draft_extend_replay import _rotation
    steps = [_step([1, 2, 3, 4, 5, 6], [50, 60]), _step([2, 50, 3, 5, 6, 60], [4, 7]), _step(third, [0, 0])]
    if held:
        _rotation("multi-layer draft extend", steps, [1, 5], 3, "here", "replay")
        return
    with pytest.raises(PropertyFailure) as caught:
        _rotation("multi-layer draft extend", steps, [1, 5], 3, "here", "replay")
    assert (caught.value.origin.buffer, caught.value.origin.cell) == ("input_ids", "real row")
