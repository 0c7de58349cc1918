"""Qwen sparse attention's chain verify read under reader-agreement (``properties/qsa_reads``).

QSA reads no mask: verify row b * d + x attends causally over its request's
first ``sequence_lengths`` tokens. By hand, for two requests (seq_lens 3, 5;
d 3, a chain): row b * 3 + x sees s_b + x + 1 tokens of the request in pool
slot 1 - b. SGLang's own ``init_forward_metadata`` must give that; a slip is a
typed reader-agreement finding; altered copies of ``qwen_sparse_attn_backend.py``
are caught through the CLI, and a refactor that keeps the meaning holds.
"""

from __future__ import annotations

import copy

import pytest
import torch

from vmfuzz.harness.model.config import Batch, Config, DraftTree
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.qsa_reads import QsaVerify
from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
from vmfuzz.harness.properties.kit import Observation
from vmfuzz.harness.properties.qsa_reads import WRITER, check_qsa, qsa_mismatch
from vmfuzz.harness.targets import resolve
from tests.sglang_copies import altered_copy, failed_check_origin, replay_on_copy
from tests.test_fa3_reads import _step

CHAIN = Config(TreeMaskMode.FULL_MASK, 2, 8, 3, 1, 2, True, "eagle")
BATCH = Batch((3, 5))


def _right_view() -> QsaVerify:
    """By hand: request 0 in pool slot 1 (KV slots 200 + token), request 1 in pool slot 0 (100 + token)."""
    table = [[200 + t for t in range(11)]] * 3 + [[100 + t for t in range(11)]] * 3
    return QsaVerify(torch.tensor([4, 5, 6, 6, 7, 8], dtype=torch.int32), torch.tensor([1, 1, 1, 0, 0, 0]),
                     torch.tensor(table, dtype=torch.int32))


SLIPS = {"node does not see itself": "sequence_lengths", "rows of the other request": "row_req_pool_indices",
         "slots of the other request": "token_slot_table", "a row short": "sequence_lengths"}


def _slip(view: QsaVerify, name: str) -> None:
    if name == "node does not see itself":
        view.sequence_lengths = view.sequence_lengths - 1
    elif name == "rows of the other request":
        view.row_req_pool_indices = torch.tensor([1, 0, 1, 0, 1, 0])
    elif name == "slots of the other request":
        view.token_slot_table = torch.flip(view.token_slot_table, [0])
    elif name == "a row short":
        view.sequence_lengths = view.sequence_lengths[:5]


def test_the_meaning_holds():
    assert qsa_mismatch(_right_view(), CHAIN, BATCH) is None


@pytest.mark.parametrize("slip", list(SLIPS))
def test_each_slip_is_a_typed_difference(slip):
    view = copy.deepcopy(_right_view())
    _slip(view, slip)
    diff = qsa_mismatch(view, CHAIN, BATCH)
    assert diff is not None and (diff.buffer, diff.effect) == (SLIPS[slip], "wrong"), diff


class _Reads:
    def __init__(self, view):
        self.view = view

    def read_qsa_verify(self, config, batch, step):
        return self.view


def test_a_wrong_read_fails_reader_agreement_and_only_chains_are_judged():
    view = _right_view()
    _slip(view, "rows of the other request")
    step = _step(CHAIN, BATCH)
    with pytest.raises(PropertyFailure) as caught:
        check_qsa(_Reads(view), Observation(), CHAIN, BATCH, step)
    o = caught.value.origin
    assert (o.property, o.effect, o.writer, o.buffer, o.cell, o.stage) == (
        "reader-agreement", "wrong", WRITER, "row_req_pool_indices", "chain node row", "eager")
    tree = Config(TreeMaskMode.FULL_MASK, 2, 8, 4, 2, 3, True, "eagle")
    obs = Observation()
    check_qsa(_Reads(None), obs, tree, BATCH, _step(tree, BATCH))
    assert not obs.classes
    obs = PROPERTIES["reader-agreement"].check(resolve("reference"), CHAIN, [BATCH])
    assert "qsa verify: not driven by this target" in obs.classes


def test_sglangs_own_read_is_the_meaning(sglang_target):
    view = sglang_target.read_qsa_verify(CHAIN, BATCH, _step(CHAIN, BATCH))
    want = _right_view()
    assert view.sequence_lengths.tolist() == want.sequence_lengths.tolist()
    assert view.row_req_pool_indices.tolist() == want.row_req_pool_indices.tolist()
    assert qsa_mismatch(view, CHAIN, BATCH) is None
    obs = PROPERTIES["reader-agreement"].check(sglang_target, CHAIN, [BATCH, Batch((0, 8))])
    assert "qsa verify" in obs.classes


def test_a_topk_one_tree_no_server_drafts_is_not_judged_as_a_qsa_read(sglang_target):
    """A wide seed once drew topk 1, spec_steps 3, d 3 with a draft that skips step 2 (``top_scores_index``
    [0, 2]): SGLang reads a topk-1 draft as a chain because its server sets d = spec_steps + 1, so on
    unaltered SGLang that case was a false finding. Such a config is a kernel case, not a deployment."""
    config = Config(TreeMaskMode.FULL_MASK, 1, 8, 3, 1, 3, True, "eagle")
    skipping = Batch((0,), (DraftTree((0, 2), (-1, 0, 1)),))
    obs = PROPERTIES["reader-agreement"].check(sglang_target, config, [Batch((0,)), skipping])
    assert "qsa verify: not judged, no server runs this config" in obs.classes
    assert "qsa verify" not in obs.classes


QSA = ["srt/layers/attention/qwen_sparse_attn_backend.py"]
_ROWS = r"\)\.repeat_interleave\(num_rows // batch_size\)"
ALTERATIONS = {
    # each verify row's causal length taken from its position, not position + 1: a node blind to itself
    "node-blind-to-itself": [(QSA, r"sequence_lengths = \(logical_positions \+ 1\)\.to\(torch\.int32\)",
                              "sequence_lengths = (logical_positions).to(torch.int32)")],
    # rows dealt to requests round-robin, not request-major
    "rows-dealt-round-robin": [(QSA, _ROWS, ").repeat(num_rows // batch_size)")],
}
CAUGHT_IN = {"node-blind-to-itself": "sequence_lengths", "rows-dealt-round-robin": "row_req_pool_indices"}
#: request-major rows by other means
REFACTOR = [(QSA, _ROWS, ").view(-1, 1).expand(-1, num_rows // batch_size).reshape(-1)")]


def _replay(tmp_path, edits, name):
    config = {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 8, "num_draft_tokens": 3, "topk": 1,
              "spec_steps": 2}
    return replay_on_copy(altered_copy(tmp_path, edits, name), tmp_path, config, BATCH.seq_lens, "reader-agreement")


@pytest.mark.slow
@pytest.mark.parametrize("alteration", list(ALTERATIONS))
def test_altered_qsa_read_is_caught_by_reader_agreement(sglang_target, alteration, tmp_path):
    proc, out = _replay(tmp_path, ALTERATIONS[alteration], alteration)
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "report", out)
    assert (o["property"], o["effect"], o["writer"], o["buffer"]) == (
        "reader-agreement", "wrong", WRITER, CAUGHT_IN[alteration]), out


@pytest.mark.slow
def test_a_refactor_of_the_qsa_rows_holds(sglang_target, tmp_path):
    proc, out = _replay(tmp_path, REFACTOR, "qsa-rows-refactor")
    assert proc.returncode == 0, out
