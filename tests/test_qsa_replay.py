"""Qwen sparse attention's chain verify read in a cuda-graph replay, under reader-agreement.

The replay refills the per-row buffers its capture bound, for the batch padded
up to the captured graph's bs. By hand, for three requests in a graph of four
(seq_lens 3, 5, 2; d 3, a chain; pool slots 3, 2, 1 and the padding request's
0; KV slot 100 * (pool + 1) + token): row b * 3 + x sees s_b + x + 1 tokens of
its own request, as eagerly. A padding row's read is discarded: it may read
through any request of the padded batch, from its first token, but no further
than that request holds (s_b + 3; the padding request 1 + 3). A slip is a typed
reader-agreement finding of the replay; altered copies of the replay's own code
are caught through the CLI, and a refactor of it holds.
"""

from __future__ import annotations

import copy

import pytest
import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.qsa_reads import QsaVerify
from vmfuzz.harness.properties import PropertyFailure
from vmfuzz.harness.properties.kit import Observation
from vmfuzz.harness.properties.qsa_reads import REPLAY_WRITER, check_qsa, qsa_mismatch
from tests.sglang_copies import altered_copy, failed_check_origin, replay_on_copy
from tests.test_fa3_reads import _step
from tests.test_qsa_reads import QSA

REPLAY = Config(TreeMaskMode.FULL_MASK, 4, 8, 3, 1, 2, True, "eagle")
BATCH = Batch((3, 5, 2))


def _rows_of(owners: list[int]) -> list[list[int]]:
    return [[100 * (p + 1) + t for t in range(11)] for p in owners]


def _right_replay(padding_owner: int = 3) -> QsaVerify:
    """By hand: the real rows as eagerly; the padding request's three rows one token long through
    ``padding_owner`` (3: the first request's slot, where SGLang's host replay points them)."""
    owners = [3, 3, 3, 2, 2, 2, 1, 1, 1] + [padding_owner] * 3
    return QsaVerify(torch.tensor([4, 5, 6, 6, 7, 8, 3, 4, 5, 1, 1, 1], dtype=torch.int32),
                     torch.tensor(owners, dtype=torch.int32), torch.tensor(_rows_of(owners), dtype=torch.int32),
                     graph_bs=4)


def test_the_padded_replay_holds_whichever_request_a_padding_row_reads_through():
    assert qsa_mismatch(_right_replay(), REPLAY, BATCH) is None
    assert qsa_mismatch(_right_replay(padding_owner=0), REPLAY, BATCH) is None
    view = _right_replay(padding_owner=0)
    view.sequence_lengths[9:] = torch.tensor([2, 3, 4], dtype=torch.int32)  # the padding request's own 1 + 3
    assert qsa_mismatch(view, REPLAY, BATCH) is None


def _slip(view: QsaVerify, name: str) -> None:
    if name == "padding row reads past its request":
        view.sequence_lengths[10] = 7  # request 0 (pool slot 3) holds 3 + 3 tokens
    elif name == "padding row through a slot no request holds":
        view.row_req_pool_indices[11] = 5
        view.token_slot_table[11] = -1
    elif name == "padding row reads another request's slots":
        view.token_slot_table[9] = torch.tensor(_rows_of([2])[0], dtype=torch.int32)
    elif name == "a real row of the replay sees the next node":
        view.sequence_lengths[4] += 1
    elif name == "a real row of the replay through a padding request's slot":
        view.row_req_pool_indices[6] = 0


SLIPS = {"padding row reads past its request": ("sequence_lengths", "padding row"),
         "padding row through a slot no request holds": ("row_req_pool_indices", "padding row"),
         "padding row reads another request's slots": ("token_slot_table", "padding row"),
         "a real row of the replay sees the next node": ("sequence_lengths", "chain node row"),
         "a real row of the replay through a padding request's slot": ("row_req_pool_indices", "chain node row")}


@pytest.mark.parametrize("slip", list(SLIPS))
def test_a_replay_slip_is_a_typed_difference(slip):
    view = copy.deepcopy(_right_replay())
    _slip(view, slip)
    diff = qsa_mismatch(view, REPLAY, BATCH)
    assert diff is not None and (diff.buffer, diff.cell, diff.effect) == (*SLIPS[slip], "wrong"), diff
    assert "cuda-graph replay, padded to 4" in diff


class _Replays:
    """A target whose eager QSA read is right and whose replay hands back ``view``."""

    def __init__(self, view):
        self.view, self.replayed = view, []

    def read_qsa_verify(self, config, batch, step):
        owners = [2, 2, 2, 1, 1, 1, 0, 0, 0]
        return QsaVerify(torch.tensor([4, 5, 6, 6, 7, 8, 3, 4, 5]), torch.tensor(owners),
                         torch.tensor(_rows_of(owners)))

    def read_qsa_replay(self, config, batch, step):
        self.replayed.append(batch.bs)
        return self.view


def test_a_wrong_replay_fails_reader_agreement_at_the_replay_stage():
    view = _right_replay()
    _slip(view, "padding row reads past its request")
    with pytest.raises(PropertyFailure) as caught:
        check_qsa(_Replays(view), Observation(), REPLAY, BATCH, _step(REPLAY, BATCH))
    o = caught.value.origin
    assert (o.property, o.effect, o.writer, o.buffer, o.cell, o.stage) == (
        "reader-agreement", "wrong", REPLAY_WRITER, "sequence_lengths", "padding row", "replay")


def test_replayed_only_up_to_max_bs_and_classed_padded():
    target, obs = _Replays(_right_replay()), Observation()
    check_qsa(target, obs, REPLAY, BATCH, _step(REPLAY, BATCH))
    assert obs.classes == {"qsa verify", "qsa verify, cuda-graph replay padded to a captured bs"}
    small = Config(TreeMaskMode.FULL_MASK, 2, 8, 3, 1, 2, True, "eagle")  # bs 3 > max_bs 2: eager only
    check_qsa(target, Observation(), small, BATCH, _step(small, BATCH))
    assert target.replayed == [3]


# -- SGLang's Qwen sparse-attention backend ---------------------------------------------

def test_sglangs_own_replay_is_the_meaning(sglang_target):
    view = sglang_target.read_qsa_replay(REPLAY, BATCH, _step(REPLAY, BATCH))
    want = _right_replay()
    assert view.graph_bs == 4 and qsa_mismatch(view, REPLAY, BATCH) is None
    assert view.sequence_lengths[:9].tolist() == want.sequence_lengths[:9].tolist()
    assert view.row_req_pool_indices[:9].tolist() == want.row_req_pool_indices[:9].tolist()
    assert view.token_slot_table[:9, :8].tolist() == want.token_slot_table[:9, :8].tolist()


#: the replay's own code, each edit a slip a reviewer could miss; the eager path is left alone, so each
#: holds under the eager judgement alone
_REFILL = r"metadata\.sequence_lengths\.copy_\(row_lengths\.to\(device=self\.device\)\)"
_OWNERS = r"torch\.repeat_interleave\(req_pool_indices\[:bs\], repeats\)"
ALTERATIONS = {
    # the replay's refill counts one token past each row: every node sees the next one
    "replay-row-sees-next-node": [(QSA, _REFILL, "metadata.sequence_lengths.copy_((row_lengths + 1).to(device=self.device))")],
    # each graph row's pool slot taken from its request's place in the batch
    "replay-rows-by-batch-place": [(QSA, _OWNERS,
                                    "torch.repeat_interleave(torch.arange(bs, device=req_pool_indices.device), repeats)")],
    # the graph layout's prefix one short: every row blind to the last prefix token
    "replay-prefix-one-short": [(QSA, r"prefix_len = max\(int\(seq_len\) - int\(extend_len\), 0\)",
                                 "prefix_len = max(int(seq_len) - int(extend_len) - 1, 0)")],
}
CAUGHT_IN = {"replay-row-sees-next-node": "sequence_lengths", "replay-rows-by-batch-place": "row_req_pool_indices",
             "replay-prefix-one-short": "sequence_lengths"}
#: the refill by slice assignment, the rows' pool slots by the tensor method
REFACTOR = [(QSA, _REFILL, "metadata.sequence_lengths[:] = row_lengths"),
            (QSA, _OWNERS, "req_pool_indices[:bs].repeat_interleave(repeats)")]


def _replay(tmp_path, edits, name):
    """The padded case (three requests in a graph of four) replayed on an altered copy."""
    config = {"mode": "FULL_MASK", "max_bs": 4, "max_context_len": 8, "num_draft_tokens": 3, "topk": 1,
              "spec_steps": 2}
    return replay_on_copy(altered_copy(tmp_path, edits, name), tmp_path, config, BATCH.seq_lens, "reader-agreement")


@pytest.mark.slow
@pytest.mark.parametrize("alteration", list(ALTERATIONS))
def test_altered_qsa_replay_is_caught_by_reader_agreement(sglang_target, alteration, tmp_path):
    proc, out = _replay(tmp_path, ALTERATIONS[alteration], alteration)
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "report", out)
    assert (o["property"], o["effect"], o["writer"], o["stage"], o["buffer"], o["cell"]) == (
        "reader-agreement", "wrong", REPLAY_WRITER, "replay", CAUGHT_IN[alteration], "chain node row"), out


@pytest.mark.slow
def test_a_refactor_of_the_qsa_replay_holds_and_its_lines_are_still_watched(sglang_target, tmp_path):
    proc, out = _replay(tmp_path / "refactor", REFACTOR, "qsa-replay-refactor")
    assert proc.returncode == 0, out
    # the same refactor with the refill's slip in its new form: the replay it holds on is judged
    slipped = [(QSA, _REFILL, "metadata.sequence_lengths[:] = row_lengths + 1"), REFACTOR[1]]
    proc, out = _replay(tmp_path / "slipped", slipped, "qsa-replay-refactor-slipped")
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "slipped" / "report", out)
    assert (o["writer"], o["stage"], o["buffer"]) == (REPLAY_WRITER, "replay", "sequence_lengths"), out
