"""FlashAttention's topk 1 (chain) verify read under reader-agreement (``properties/fa3_reads``).

A chain verify reads no mask: FA3 attends causally, one pass, request b's d
query rows over its s_b prefix tokens and its d draft tokens. So its
``cache_seqlens`` is s_b + d, ``cu_seqlens_q`` steps by d, ``cu_seqlens_k`` is
the running sum, and the first s_b + d page-table entries are request b's own
KV slots (pages at page size 4), worked out here by hand for one small case.
Altered copies of the chain branch of ``init_forward_metadata`` are caught by
reader-agreement naming the output, and a refactor of it holds. So is its
cuda-graph replay (``_apply_cuda_graph_metadata``'s chain branch, whose
lengths SGLang's decode-metadata Triton kernel fills in the interpreter), plain
and, on the paged server, ragged (the live batch's layout, which SGLang pads to
the graph): a bug planted in either arm is caught naming the replay's writer,
on 0.5.23 here and on 0.5.22's own code in tests/test_fa3_chain_older.py.
"""

from __future__ import annotations

import copy
import msgspec

import pytest
import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.fa3_reads import Fa3Pass, Fa3Verify
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES
from vmfuzz.harness.properties.fa3_reads import REPLAY_WRITER, WRITER, fa3_mismatch
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
    assert {"fa3 topk 1 verify", "fa3 topk 1 verify, page size 4, ragged", "fa3 topk 1 verify, cuda-graph replay",
            "fa3 topk 1 verify, cuda-graph replay, page size 4, ragged"} <= obs.classes


def test_sglangs_own_chain_replay_is_the_meaning_padded_or_not(sglang_target):
    from vmfuzz.harness.model.oracle import expected
    from vmfuzz.harness.model.outputs import StepOutput

    wide = msgspec.structs.replace(CHAIN, max_bs=4)
    # the graph of 2 rows exactly, and of 4 with its last row padded at the fill length
    for config, batch, graph_bs in ((CHAIN, BATCH, 2), (wide, Batch((3, 5, 2)), 4)):
        want = expected(config, batch)
        step = StepOutput(want.tree_mask, want.positions, want.retrieve_index, want.retrieve_next_token,
                          want.retrieve_next_sibling, reused=False)
        for page_size in (1, 4):
            view = sglang_target.read_fa3_replay(config, batch, step, page_size)
            assert view.raised is None and view.graph_bs == graph_bs, view.raised
            assert fa3_mismatch(view, config, batch, page_size) is None


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
def test_a_replay_past_the_context_is_the_known_defect_and_inside_it_is_not(sglang_target):
    """SGLang's graph page table holds a context's pages, a chain's request near its context reads d more
    (known/fa3-chain-graph-page-table-past-context.json): its own cell, so a slip inside the context is new."""
    from vmfuzz.harness.model.oracle import expected
    from vmfuzz.harness.model.outputs import StepOutput

    near = Batch((7,))  # 7 + 3 tokens, 8 columns
    want = expected(CHAIN, near)
    step = StepOutput(want.tree_mask, want.positions, want.retrieve_index, want.retrieve_next_token,
                      want.retrieve_next_sibling, reused=False)
    diff = fa3_mismatch(sglang_target.read_fa3_replay(CHAIN, near, step), CHAIN, near)
    assert diff is not None and (diff.buffer, diff.cell) == ("page_table", "past context"), diff
    view = copy.deepcopy(_right_view())
    view = Fa3Verify(view.prefix, None, graph_bs=2)
    view.prefix.page_table = torch.roll(view.prefix.page_table, 1, 0)
    diff = fa3_mismatch(view, CHAIN, BATCH)
    assert diff is not None and (diff.buffer, diff.cell) == ("page_table", "chain row"), diff


#: the chain replay's (``_apply_cuda_graph_metadata``): each edit is the whole non-ragged arm, as 0.5.22 and
#: 0.5.23 both spell it
REPLAY_ARM = r"verify_lens = seq_lens\n(\s+)verify_delta = self\.speculative_num_draft_tokens\n"
RAGGED_ARM = r"verify_lens = geometry\.cache_seqlens_int32\n(\s+)verify_delta = 0\n"
REPLAY_ALTERATIONS = {
    # the replay's KV lengths leave out the last draft token
    "chain-replay-kv-one-short": ([(FA3, REPLAY_ARM, "verify_lens = seq_lens\n\\1verify_delta = "
                                                     "self.speculative_num_draft_tokens - 1\n")], "cache_seqlens"),
    # the replay reads only the prefix: the chain's own draft tokens never attended
    "chain-replay-without-draft": ([(FA3, REPLAY_ARM, "verify_lens = seq_lens\n\\1verify_delta = 0\n")],
                                   "cache_seqlens"),
    # a refactor: the draft counted into the lengths, none added after
    "chain-replay-lengths-with-draft": ([(FA3, REPLAY_ARM, "verify_lens = seq_lens + self.speculative_num_draft_tokens"
                                                           "\n\\1verify_delta = 0\n")], None),
    # the ragged arm (the paged server's chain verifies ragged): the query offsets left as the capture bound them
    "ragged-replay-query-offsets-stale": ([(FA3, r"\n\s+metadata\.cu_seqlens_q\.copy_\(geometry\.cu_seqlens_q\)\n", "\n")],
                                          "cu_seqlens_q"),
    # the ragged arm: every request's whole draft counted again on top of its verify lengths
    "ragged-replay-draft-counted-twice": ([(FA3, RAGGED_ARM, "verify_lens = geometry.cache_seqlens_int32\n\\1"
                                                             "verify_delta = self.speculative_num_draft_tokens\n")],
                                          "cache_seqlens"),
    # a refactor: the ragged lengths summed here from the padded layout, not read off the geometry
    "ragged-replay-lengths-from-layout": ([(FA3, RAGGED_ARM, "verify_lens = seq_lens + padded.verify_lens.to(seq_lens.dtype)"
                                                             "\n\\1verify_delta = 0\n")], None),
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


@pytest.mark.slow
@pytest.mark.parametrize("alteration", list(REPLAY_ALTERATIONS))
def test_altered_chain_replay_is_caught_by_reader_agreement(sglang_target, alteration, tmp_path):
    edits, buffer = REPLAY_ALTERATIONS[alteration]
    proc, out = replay_on_copy(altered_copy(tmp_path, edits, alteration), tmp_path, REPLAY_CASE, (3, 5),
                               "reader-agreement")
    assert_replay_verdict(tmp_path, proc, out, buffer)


#: the chain case the replay alterations run: both requests fit the captured max_bs, so the replay is judged
REPLAY_CASE = {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 8, "num_draft_tokens": 3, "topk": 1,
               "spec_steps": 2}


def assert_replay_verdict(tmp_path, proc, out: str, buffer: str | None) -> None:
    """A refactor (``buffer`` None) holds; a planted bug fails reader-agreement's own check at the replay,
    naming the replay's writer and ``buffer``."""
    if buffer is None:
        assert proc.returncode == 0, out
        return
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "report", out)
    assert (o["property"], o["effect"], o["writer"], o["stage"], o["buffer"]) == (
        "reader-agreement", "wrong", REPLAY_WRITER, "replay", buffer), out
