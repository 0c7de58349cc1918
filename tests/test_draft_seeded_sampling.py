"""The draft-decode cuda-graph runner of a server that samples its drafts: each request's seed into the graph.

A chain server with rejection sampling under deterministic inference
(``draft_seeded``: half the chain cases, chosen by the config) samples each
draft step's token from a draw keyed by the request's sampling seed. The
runner's graph reads the seeds from its own buffer, which ``execute`` copies
from the live batch before each replay (0.5.23's new seed copy); the eager
draft reads the batch's seeds. graph-replay-equivalence compares the drafted
tokens: a seed a replay leaves stale, or hands another request, draws others.
The seeded hash runs as SGLang's own Triton kernel, interpreted: on CPU tensors
its wrapper would load the CPU engine's compiled op.
"""

from __future__ import annotations

import pytest

from tests.helpers import sglang_or_skip
from tests.sglang_copies import assert_altered_replay_caught, assert_altered_replay_holds
from tests.surface_ran import assert_texts_ran, checked_under_coverage
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode

RUNNER = ["srt/speculative/eagle_draft_cuda_graph_runner.py"]
PROP = "graph-replay-equivalence"
#: a topk-1 chain of 3 steps (d = 4), a 24-token context, unpaged and without window layers: a seeded server
CASE = {"mode": "FULL_MASK", "max_bs": 3, "max_context_len": 24, "num_draft_tokens": 4, "topk": 1,
        "spec_steps": 3, "is_read": True}
LENS = (5, 9)
#: the lines only a seeded sampling server's replay runs
LINES = (("srt/speculative/eagle_draft_cuda_graph_runner.py", "if self.buffers.sampling_seed is not None:"),
         ("srt/speculative/eagle_draft_cuda_graph_runner.py", "self.buffers.sampling_seed[:raw_bs].copy_("))
_COPY = r"self\.buffers\.sampling_seed\[:raw_bs\]\.copy_\(\n(\s+)forward_batch\.sampling_info\.sampling_seed\[:raw_bs\]"
ALTERATIONS = {
    # the copy skipped: the graph draws with the seeds its buffer held before (zeros, or an earlier batch's)
    "seed-never-copied": [(RUNNER, r"if self\.buffers\.sampling_seed is not None:\n(\s+)self\.buffers\.sampling_seed",
                           "if self.buffers.sampling_seed is None:\n\\1self.buffers.sampling_seed")],
    # the requests' seeds handed over in reverse order: each request draws with another's seed
    "seeds-reversed": [(RUNNER, _COPY, "self.buffers.sampling_seed[:raw_bs].copy_(\n"
                                       "\\1forward_batch.sampling_info.sampling_seed[:raw_bs].flip(0)")],
}
#: the same rows copied through a narrowed view
REWRITE = [(RUNNER, _COPY, "self.buffers.sampling_seed.narrow(0, 0, raw_bs).copy_(\n"
                           "\\1forward_batch.sampling_info.sampling_seed[:raw_bs]")]
WANT = {"writer": "draft cuda-graph replay", "buffer": "draft_tokens", "cell": "real row"}


@pytest.fixture(autouse=True)
def every_case_drafts(monkeypatch):
    """Every case's draft runner judged (a search judges one case in four): this case is chosen."""
    monkeypatch.setenv("VMFUZZ_DRAFT_SHARE", "1")


def _config() -> Config:
    return Config(TreeMaskMode.FULL_MASK, 3, 24, 4, 1, 3, is_read=True).validate()


def test_the_case_is_a_seeded_sampling_server():
    from vmfuzz.harness.properties.draft_graph import draft_page_size, draft_shape
    shape = draft_shape(_config(), draft_page_size(_config()))
    assert (shape.seeded_sampling, shape.window, shape.page_size) == (True, 0, 1)


def test_a_seeded_replay_draws_what_the_eager_draft_draws(sglang_target):
    from vmfuzz.harness.model.draft_graph import DraftShape
    s = sglang_target.draft_graph_session(DraftShape(1, 3, 4, 24, 1, 0, seeded_sampling=True), 3)
    assert s.server.runner.buffers.sampling_seed is not None  # SGLang's decision: its seed buffer exists
    for lens in (list(LENS), [12], [3, 7, 2]):
        got, want = s.replay(lens), s.eager(lens)
        assert got.draft_tokens.tolist() == want.draft_tokens.tolist()
        assert s.server.runner.buffers.sampling_seed[:len(lens)].tolist() == \
            s.live(lens).sampling_info.sampling_seed.tolist()
    assert s.overruns == []


def test_the_judged_sglang_lines_ran(sglang_target):
    """coverage.py, as the gate measures: the seed copy ran under the property."""
    root, _, data = checked_under_coverage(sglang_target, PROP, _config(), [Batch(LENS)], [RUNNER[0]])
    assert_texts_ran(root, LINES, data)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALTERATIONS))
def test_each_seed_copy_bug_is_caught_by_graph_replay_equivalence(tmp_path, name):
    sglang_or_skip()
    assert_altered_replay_caught(tmp_path, ALTERATIONS[name], name, CASE, LENS, PROP, WANT)


@pytest.mark.slow
@pytest.mark.parametrize("edits", [[], REWRITE], ids=["pristine", "seed-copied-through-a-narrowed-view"])
def test_pristine_sglang_and_a_rewrite_of_the_seed_copy_hold(tmp_path, edits):
    sglang_or_skip()
    assert_altered_replay_holds(tmp_path, edits, "rewrite" if edits else None, CASE, LENS, PROP)
