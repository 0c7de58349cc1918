"""The graph-path properties catch what they are meant to on altered copies of SGLang, and only that.

Each alteration plants one bug of the cuda-graph family into a copy of the installed SGLang's target
verify graph path (``DecodeCudaGraphRunner`` and the buffer registry it replays through); the property
meant for it must catch it as its own failure (never a raise). A behaviour-preserving refactor of the
same line is not caught, and the pristine copy holds.
"""

from __future__ import annotations

import pytest

from tests.helpers import sglang_or_skip
from tests.sglang_copies import altered_copy, failed_check_origin, replay_on_copy

RUNNER = ["srt/model_executor/runner/decode_cuda_graph_runner.py"]
REGISTRY = ["srt/model_executor/cuda_graph_buffer_registry.py"]

#: a server capturing bs 1, 2, 4; the first batch replays padded (3 -> 4), the second exact
CONFIG = {"mode": "FULL_MASK", "max_bs": 4, "max_context_len": 32, "num_draft_tokens": 4, "topk": 2,
          "spec_steps": 2, "is_read": True}
SEQ_LENS = (5, 7, 3)

#: name -> (edits, the property meant to catch it, the buffer its origin names)
ALTERATIONS = {
    # S#26880's shape on the target runner: the padded rows' lengths left out of the replay's sum
    "replay-seq-lens-sum-unpadded": (
        [(RUNNER, r"else forward_batch\.seq_lens_sum \+ \(bs - raw_bs\) \* seq_len_fill_value",
          "else forward_batch.seq_lens_sum")],
        "capture-replay-agreement", "seq_lens_sum"),
    # the padded tail reset one row short: the first padded token keeps the previous step's KV slot
    # (a live request's) and writes its KV there
    "replay-padding-reset-one-short": (
        [(REGISTRY, r"tail = self\.buffer\[raw_n:padded_n\]", "tail = self.buffer[raw_n + 1 : padded_n]")],
        "padding-inert", "out_cache_loc"),
    # the live batch's token ids never copied into the graph's static buffer: the graph reads old ids
    "replay-input-ids-not-copied": (
        [(REGISTRY, r'GraphSlot\("input_ids", _tokens, torch\.int64, axis="tokens"\)',
          'GraphSlot("input_ids", _tokens, torch.int64, axis="tokens", copy_from_fb=False)')],
        "graph-replay-equivalence", "logits"),
}

#: the same line rewritten without changing what it computes
REFACTOR = [(RUNNER, r"else forward_batch\.seq_lens_sum \+ \(bs - raw_bs\) \* seq_len_fill_value",
             "else (bs - raw_bs) * seq_len_fill_value + forward_batch.seq_lens_sum")]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALTERATIONS))
def test_each_planted_bug_is_caught_by_its_property(tmp_path, name):
    sglang_or_skip()
    edits, prop, buffer = ALTERATIONS[name]
    site = altered_copy(tmp_path, edits, name)
    proc, out = replay_on_copy(site, tmp_path, CONFIG, SEQ_LENS, prop)
    assert proc.returncode == 1, out
    origin = failed_check_origin(tmp_path / "report", out)
    assert (origin["property"], origin["buffer"]) == (prop, buffer), origin


@pytest.mark.slow
@pytest.mark.parametrize("prop", ["capture-replay-agreement", "graph-replay-equivalence", "padding-inert"])
def test_a_refactor_is_not_caught_and_the_pristine_copy_holds(tmp_path, prop):
    sglang_or_skip()
    edits = REFACTOR if prop == "capture-replay-agreement" else []
    site = altered_copy(tmp_path, edits, "refactor" if edits else None)
    proc, out = replay_on_copy(site, tmp_path, CONFIG, SEQ_LENS, prop)
    assert proc.returncode == 0 and f"held {prop}" in out, out


#: (file, the graph's admission test) per runner whose admission is judged against its captured sizes
ADMISSION = {"target verify": (RUNNER, r"else cuda_graph_bs <= self\.max_bs"),
             "draft decode": (["srt/speculative/eagle_draft_cuda_graph_runner.py"], r"else cuda_graph_bs <= self\.max_bs")}


@pytest.mark.slow
@pytest.mark.parametrize("runner", sorted(ADMISSION))
@pytest.mark.parametrize("altered", [True, False])
def test_a_graph_refusing_its_largest_captured_size_is_caught_and_a_refactor_holds(tmp_path, monkeypatch, runner,
                                                                                   altered):
    """``can_run_graph`` admitting only batches below the largest captured bs: the graph captured for it is
    never replayed. capture-replay-agreement judges admission against the captured sizes, on each runner."""
    sglang_or_skip()
    monkeypatch.setenv("VMFUZZ_DRAFT_SHARE", "1")  # this case's draft runner judged
    path, test = ADMISSION[runner]
    edits = [(path, test, "else cuda_graph_bs < self.max_bs" if altered else "else not cuda_graph_bs > self.max_bs")]
    proc, out = replay_on_copy(altered_copy(tmp_path, edits, "admission"), tmp_path, CONFIG, (5, 7, 3, 2),
                               "capture-replay-agreement")
    if not altered:
        assert proc.returncode == 0 and "held capture-replay-agreement" in out, out
        return
    assert proc.returncode == 1, out
    origin = failed_check_origin(tmp_path / "report", out)
    assert (origin["property"], origin["buffer"], origin["cell"], origin["writer"]) == (
        "capture-replay-agreement", "capture_bs", "admission", f"{runner} can_run_graph"), origin
