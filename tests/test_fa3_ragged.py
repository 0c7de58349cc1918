"""FlashAttention's ragged chain verify (each request verifies its own number of draft tokens) under
reader-agreement.

On the paged chain server the requests of a batch verify v_b of their d draft
tokens (``ragged_verify_lens``: 1 to d, varied with the request). By hand, for
three requests verifying 4, 3 and 1 tokens: each reads its prefix and its first
v_b draft tokens causally, its v_b query rows running on from the rows before.
SGLang's own eager read is the meaning; altered copies of the ragged branch and
of the geometry it builds are caught through the CLI, and a refactor holds.
"""

from __future__ import annotations

import copy

import pytest

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.fa3_reads import Fa3Pass, Fa3Verify
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties.fa3_reads import check_fa3, fa3_mismatch, ragged_verify_lens
from vmfuzz.harness.properties.kit import Observation
from tests.sglang_copies import altered_copy, failed_check_origin, replay_on_copy
from tests.test_fa3_reads import FA3, _i32, _step

CHAIN = Config(TreeMaskMode.FULL_MASK, 4, 8, 4, 1, 3, True, "eagle")
BATCH = Batch((3, 5, 2))
RAGGED = ["srt/speculative/ragged_verify.py"]


def _view() -> Fa3Verify:
    """By hand, at pages of one token: pool slots 2, 1, 0 (KV slot 100 * (pool + 1) + token); request b reads
    s_b + v_b tokens, v = 4, 3, 1."""
    table = [[300 + t for t in range(12)], [200 + t for t in range(12)], [100 + t for t in range(12)]]
    prefix = Fa3Pass(_i32([7, 8, 3]), _i32([0, 4, 7, 8]), _i32([0, 7, 15, 18]), _i32(table), 4)
    return Fa3Verify(prefix, None, verify_lens=(4, 3, 1))


def test_the_ragged_lens_vary_between_the_anchor_and_the_whole_draft():
    assert ragged_verify_lens(CHAIN, BATCH) == [4, 3, 1]
    lens = {v for s in range(9) for v in ragged_verify_lens(CHAIN, Batch((s, s)))}
    assert lens == {1, 2, 3, 4}


def test_the_ragged_read_by_hand_holds_and_a_uniform_one_does_not():
    assert fa3_mismatch(_view(), CHAIN, BATCH) is None
    uniform = copy.deepcopy(_view())
    uniform.prefix.cache_seqlens[:] = _i32([7, 9, 6])
    diff = fa3_mismatch(uniform, CHAIN, BATCH)
    assert (diff.buffer, diff.cell) == ("cache_seqlens", "chain row") and "ragged (verify lens [4, 3, 1])" in diff


@pytest.mark.parametrize("slip,buffer", [("query rows", "cu_seqlens_q"), ("max q", "max_seq_len_q")])
def test_a_ragged_slip_is_a_typed_difference(slip, buffer):
    view = copy.deepcopy(_view())
    if slip == "query rows":
        view.prefix.cu_seqlens_q[:] = _i32([0, 4, 8, 12])
    else:
        view.prefix.max_seq_len_q = 3
    assert fa3_mismatch(view, CHAIN, BATCH).buffer == buffer


class _Chain:
    def __init__(self):
        self.asked = []

    def read_fa3_verify(self, config, batch, step, page_size=1, window=None, verify_lens=None):
        self.asked.append((page_size, verify_lens))
        raise LookupError("asked")


def test_the_paged_chain_server_is_the_ragged_one():
    step = _step(CHAIN, BATCH)
    target = _Chain()
    with pytest.raises(LookupError):
        check_fa3(target, Observation(), CHAIN, BATCH, step, step.tree_mask)
    assert target.asked == [(1, None)]
    from vmfuzz.harness.properties.fa3_reads import _judge_at
    with pytest.raises(LookupError):
        _judge_at(target, Observation(), CHAIN, BATCH, step, 4)
    assert target.asked[-1] == (4, [4, 3, 1])


# -- SGLang's FlashAttention backend -------------------------------------------------

@pytest.mark.parametrize("page_size", [1, 4])
def test_sglangs_own_ragged_read_is_the_meaning(sglang_target, page_size):
    view = sglang_target.read_fa3_verify(CHAIN, BATCH, _step(CHAIN, BATCH), page_size, verify_lens=[4, 3, 1])
    assert view.verify_lens == (4, 3, 1) and fa3_mismatch(view, CHAIN, BATCH, page_size) is None
    assert view.prefix.cu_seqlens_q.tolist() == [0, 4, 7, 8]


#: the ragged branch and the geometry it builds, each edit a slip a reviewer could miss
ALTERATIONS = {
    # the ragged branch counts the whole draft, as the uniform branch does
    "ragged-counts-the-whole-draft": (
        [(FA3, r"metadata\.cache_seqlens_int32 = geometry\.cache_seqlens_int32",
          "metadata.cache_seqlens_int32 = (forward_batch.seq_lens + self.speculative_num_draft_tokens).to(torch.int32)")],
        "cache_seqlens"),
    # the key running sum over the prefixes alone: each request's KV starts short by the tokens verified before it
    "ragged-key-sum-without-the-draft": (
        [(RAGGED, r"torch\.cumsum\(cache_seqlens_int32, dim=0, dtype=torch\.int32\)",
          "torch.cumsum(seq_lens, dim=0, dtype=torch.int32)")],
        "cu_seqlens_k"),
}
#: the per-request key count by other means
REFACTOR = [(RAGGED, r"cache_seqlens_int32 = \(seq_lens \+ layout\.verify_lens\)\.to\(torch\.int32\)",
             "cache_seqlens_int32 = torch.add(layout.verify_lens, seq_lens).int()")]


def _replay(tmp_path, edits, name):
    # a context every request drafts inside: a replay's first failure ends a ``replay``, and one past the
    # context is the known entry fa3-chain-graph-page-table-past-context, not the eager slip planted here
    config = {"mode": "FULL_MASK", "max_bs": 4, "max_context_len": 9, "num_draft_tokens": 4, "topk": 1,
              "spec_steps": 3}
    return replay_on_copy(altered_copy(tmp_path, edits, name), tmp_path, config, BATCH.seq_lens, "reader-agreement")


@pytest.mark.slow
@pytest.mark.parametrize("alteration", list(ALTERATIONS))
def test_an_altered_ragged_verify_is_caught_by_reader_agreement(sglang_target, alteration, tmp_path):
    edits, buffer = ALTERATIONS[alteration]
    proc, out = _replay(tmp_path, edits, alteration)
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "report", out)
    assert (o["property"], o["effect"], o["buffer"], o["stage"]) == ("reader-agreement", "wrong", buffer, "eager"), out
    assert "ragged" in out


@pytest.mark.slow
def test_a_refactor_of_the_ragged_geometry_holds(sglang_target, tmp_path):
    proc, out = _replay(tmp_path, REFACTOR, "ragged-geometry-add")
    assert proc.returncode == 0, out
