"""FlashAttention's topk 1 (chain) verify read under reader-agreement (``properties/fa3_reads``).

A chain verify reads no mask: FA3 attends causally, one pass, request b's d
query rows over its s_b prefix tokens and its d draft tokens. So its
``cache_seqlens`` is s_b + d, ``cu_seqlens_q`` steps by d, ``cu_seqlens_k`` is
the running sum, and the first s_b + d page-table entries are request b's own
KV slots (pages at page size 4), worked out here by hand for one small case.
Altered copies of the chain branch of ``init_forward_metadata`` are caught by
reader-agreement naming the output, and a refactor of it holds. Its cuda-graph
replay is not driven on CPU: the capture fills it through a decode-metadata
Triton kernel the interpreter refuses.
"""

from __future__ import annotations

import copy

import pytest
import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.fa3_reads import Fa3Pass, Fa3Verify
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES
from vmfuzz.harness.properties.fa3_reads import WRITER, fa3_mismatch
from tests.sglang_copies import altered_copy, failed_check_origin, replay_on_copy

#: a chain of 3 draft tokens after 2 steps (SGLang's own topk-1 width), max_bs 2, context 8
CHAIN = Config(TreeMaskMode.FULL_MASK, 2, 8, 3, 1, 2, True, "eagle")
BATCH = Batch((3, 5))


def _i32(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32)


def _right_view(page_size: int = 1) -> Fa3Verify:
    """By hand: request 0 in pool slot 1 (KV slots 200 + token), request 1 in pool slot 0 (100 + token);
    each reads its prefix and its 3 draft tokens: 6 and 8 tokens. At page size 4: request 0's tokens
    0-5 in pages 50 and 51, request 1's tokens 0-7 in pages 25 and 26."""
    table = {1: [[200, 201, 202, 203, 204, 205, 0, 0], [100, 101, 102, 103, 104, 105, 106, 107]],
             4: [[50, 51], [25, 26]]}[page_size]
    return Fa3Verify(Fa3Pass(_i32([6, 8]), _i32([0, 3, 6]), _i32([0, 6, 14]), _i32(table), 3), None)


SLIPS = {
    "the draft not counted": (lambda p: setattr(p, "cache_seqlens", p.cache_seqlens - 3), "cache_seqlens"),
    "a query row per request": (lambda p: setattr(p, "cu_seqlens_q", _i32([0, 1, 2])), "cu_seqlens_q"),
    "the running sum a row late": (lambda p: setattr(p, "cu_seqlens_k", _i32([0, 0, 6])), "cu_seqlens_k"),
    "another request's slots": (lambda p: setattr(p, "page_table", torch.roll(p.page_table, 1, 0)), "page_table"),
}


def test_the_meaning_holds_at_both_page_sizes():
    assert fa3_mismatch(_right_view(), CHAIN, BATCH) is None
    assert fa3_mismatch(_right_view(4), CHAIN, BATCH, 4) is None


@pytest.mark.parametrize("slip", list(SLIPS))
def test_each_slip_is_a_typed_difference(slip):
    view = copy.deepcopy(_right_view())
    alter, buffer = SLIPS[slip]
    alter(view.prefix)
    diff = fa3_mismatch(view, CHAIN, BATCH)
    assert diff is not None and (diff.buffer, diff.effect, diff.cell.removesuffix(" count")) == (
        buffer, "wrong", "chain row"), diff
    assert "FA3 topk 1 verify" in diff


# -- SGLang's FlashAttention backend -------------------------------------------------

def test_sglangs_own_chain_metadata_is_the_meaning(sglang_target):
    from vmfuzz.harness.model.oracle import expected
    from vmfuzz.harness.model.outputs import StepOutput

    want = expected(CHAIN, BATCH)
    step = StepOutput(want.tree_mask, want.positions, want.retrieve_index, want.retrieve_next_token,
                      want.retrieve_next_sibling, reused=False)
    for page_size in (1, 4):
        view = sglang_target.read_fa3_verify(CHAIN, BATCH, step, page_size)
        assert view.expand is None and fa3_mismatch(view, CHAIN, BATCH, page_size) is None
        assert view.prefix.cache_seqlens.tolist() == [6, 8]
    obs = PROPERTIES["reader-agreement"].check(sglang_target, CHAIN, [BATCH])
    assert {"fa3 topk 1 verify", "fa3 topk 1 verify, page size 4, ragged"} <= obs.classes


FA3 = ["srt/layers/attention/flashattention_backend.py"]
#: name -> (edits, the output reader-agreement's finding must name; None: a refactor that must hold)
ALTERATIONS = {
    # the chain's KV length leaves out the last draft token
    "chain-kv-one-short": ([(FA3, r"forward_batch\.seq_lens \+ self\.speculative_num_draft_tokens\n",
                             "forward_batch.seq_lens + self.speculative_num_draft_tokens - 1\n")], "cache_seqlens"),
    # the page table cut at the longest prefix: the draft tokens' slots left out
    "chain-table-without-draft": ([(FA3, r"eager_max_k \+ self\.speculative_num_draft_tokens", "eager_max_k")],
                                  "page_table"),
    # the query offsets stop one request short
    "chain-query-offsets-one-short": ([(FA3, r"batch_size \* self\.speculative_num_draft_tokens \+ 1,",
                                        "batch_size * self.speculative_num_draft_tokens,")], "cu_seqlens_q"),
    # a refactor: the longest KV row read off the lengths just computed
    "chain-max-k-from-lengths": ([(FA3, r"eager_max_k \+ self\.speculative_num_draft_tokens",
                                   "int(metadata.cache_seqlens_int32.max().item())")], None),
}


@pytest.mark.slow
@pytest.mark.parametrize("alteration", list(ALTERATIONS))
def test_altered_chain_read_is_caught_by_reader_agreement(sglang_target, alteration, tmp_path):
    edits, buffer = ALTERATIONS[alteration]
    config = {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 8, "num_draft_tokens": 3, "topk": 1,
              "spec_steps": 2}
    proc, out = replay_on_copy(altered_copy(tmp_path, edits, alteration), tmp_path, config, (3, 5),
                               "reader-agreement")
    if buffer is None:
        assert proc.returncode == 0, out
        return
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "report", out)
    assert (o["property"], o["effect"], o["writer"], o["buffer"]) == ("reader-agreement", "wrong", WRITER, buffer), out
