"""The target verify runner (``DecodeCudaGraphRunner``) is made by its own ``__init__``, measured so.

Fast: coverage.py shows the ``__init__``'s sizing lines run when the graph path builds the runner; its
sizing (buckets, max_bs, tokens a request, buffers) is then SGLang's, and graph-buffer-soundness judges
it; a release whose ``__init__`` asks for what the stand-ins lack falls back to a hand-assembled runner
and says the ``__init__`` is not driven. Slow: on altered copies of SGLang, an ``__init__`` that sizes
a static buffer too small for its largest bucket is caught by graph-buffer-soundness; a refactor of the
same lines holds, and so does the pristine copy.
"""

from __future__ import annotations

import inspect
import json

import pytest

from tests.helpers import sglang_or_skip
from tests.sglang_copies import altered_copy, failed_check_origin, replay_on_copy
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode

RUNNER = ["srt/model_executor/runner/decode_cuda_graph_runner.py"]
CONFIG = Config(TreeMaskMode.FULL_MASK, 4, 32, 4, 2, 2)
#: the __init__'s lines that make its sizing decisions (found by their text, wherever they move)
SIZING_LINES = ("get_batch_sizes_to_capture(", "self.max_bs = max(self.capture_bs)",
                "model_runner.decode_num_tokens_per_req(", "self.attn_backend.init_cuda_graph_state(",
                "DecodeInputBuffers.create(", "self.buffers.share_buffers(", "build_decode_registry(",
                "self.backend = resolve_decode_backend(self)", "self.capture()")


def _init_lines(runner_cls) -> dict[str, int]:
    """Each of ``SIZING_LINES`` -> its line number in the installed runner's ``__init__``."""
    source, first = inspect.getsourcelines(runner_cls.__init__)
    out = {}
    for offset, line in enumerate(source):
        for text in SIZING_LINES:
            if text in line and text not in out:
                out[text] = first + offset
    assert set(out) == set(SIZING_LINES), f"lines not found in __init__: {set(SIZING_LINES) - set(out)}"
    return out


def test_the_runner_is_made_by_its_own_init_as_measured_by_coverage(sglang_target):
    import coverage

    from vmfuzz.harness.targets.sglang import graph_runner as gr
    R = gr.modules().runner.DecodeCudaGraphRunner
    path = inspect.getsourcefile(R)
    cov = coverage.Coverage(data_file=None, include=[path], branch=False)
    heap = ShadowHeap()
    mask = sglang_target.allocate(CONFIG, heap)
    cov.start()
    try:
        server = gr.build(CONFIG, [1, 2, 4], mask, heap)
    finally:
        cov.stop()
    ran = set(cov.get_data().lines(path) or ())
    missing = {text: n for text, n in _init_lines(R).items() if n not in ran}
    assert not missing, f"__init__ lines that never ran: {missing}"
    assert server.init_not_driven is None
    # what __init__ decided, SGLang's: every configured bucket, d tokens a request, buffers sized so
    s = server.sizing
    assert (s.capture_bs, s.max_bs, s.captured_req_width, s.max_num_token) == ((1, 2, 4), 4, 4, 16)
    assert s.buffers["input_ids"] == (16,) and s.buffers["seq_lens"] == (4,)
    assert sorted(server.captures) == [1, 2, 4]
    # the buffers __init__ sent to the process-wide pool are the session's redzoned statics
    backing = server.space.heap.backing_of(server.runner.buffers.input_ids)
    assert backing is not None and backing[2] == "input_ids"


def test_a_later_pipeline_stages_runner_is_made_by_its_own_init_with_its_proxy_buffers(sglang_target):
    from vmfuzz.harness.targets.sglang import graph_runner as gr
    heap = ShadowHeap()
    server = gr.build(CONFIG, [1, 2, 4], sglang_target.allocate(CONFIG, heap), heap, pp_size=2, capture=False)
    assert server.init_not_driven is None and server.captures == {}
    proxy = {k: v for k, v in server.sizing.buffers.items() if k.startswith("pp_proxy_tensors.")}
    assert proxy and all(shape[0] == 16 for shape in proxy.values()), proxy
    for value in server.runner.buffers.pp_proxy_tensors.values():  # pooled by SGLang: redzoned statics
        assert server.space.heap.backing_of(value) is not None


def test_graph_buffer_soundness_judges_the_sizing_init_decided(sglang_target):
    from vmfuzz.harness.properties.kit import Observation
    from vmfuzz.harness.properties.verify_graph_buffers import judge_verify_buffers
    obs = Observation()
    judge_verify_buffers(sglang_target, CONFIG, obs)
    assert "sub-check target verify: done" in obs.classes
    assert "target verify: 9 static buffers judged at bs 4" in obs.classes


def test_an_init_that_cannot_be_driven_falls_back_and_says_not_driven(sglang_target, monkeypatch):
    """A release whose __init__ reads what the stand-in model runner lacks: the runner is assembled by
    hand, its replays still judged, and the __init__ reported not driven by every graph property."""
    from vmfuzz.harness.properties import PROPERTIES
    from vmfuzz.harness.properties.kit import Observation
    from vmfuzz.harness.properties.verify_graph_buffers import judge_verify_buffers
    from vmfuzz.harness.targets.sglang import graph_runner as gr
    R = gr.modules().runner.DecodeCudaGraphRunner
    real = R.__init__

    def newer_init(self, model_runner, *, attn_backend=None, **kwargs):
        model_runner.a_field_of_a_later_release  # noqa: B018 - read as a later release's __init__ would
        real(self, model_runner, attn_backend=attn_backend, **kwargs)
    monkeypatch.setattr(R, "__init__", newer_init)
    heap = ShadowHeap()
    server = gr.build(CONFIG, [1, 2, 4], sglang_target.allocate(CONFIG, heap), heap)
    assert "a_field_of_a_later_release" in server.init_not_driven
    assert sorted(server.captures) == [1, 2, 4]
    obs = PROPERTIES["graph-replay-equivalence"].check(sglang_target, CONFIG, [Batch((5, 7, 3))])
    said = [c for c in obs.classes if c.startswith("sub-check target verify set-up: ")]
    assert said and "not driven (the runner was assembled by vmfuzz" in said[0], obs.classes
    obs = Observation()
    judge_verify_buffers(sglang_target, CONFIG, obs)
    assert any(c.startswith("sub-check target verify: not driven (the runner was assembled by vmfuzz")
               for c in obs.classes), obs.classes


#: a server capturing bs 1, 2, 4 (draft runner judged in one case of four: its share unset here)
CASE = {"mode": "FULL_MASK", "max_bs": 4, "max_context_len": 32, "num_draft_tokens": 4, "topk": 2,
        "spec_steps": 2, "is_read": True}
#: name -> the __init__'s edit that sizes a static buffer too small for the largest captured bucket,
#: and the buffer graph-buffer-soundness names
UNDERSIZED = {
    # every buffer sized for one request fewer than the largest bucket it still captures (sizing the
    # buffers alone so is refused at start-up by SGLang's own registry: a raise, no finding)
    "init-max-bs-minus-one": (
        [(RUNNER, r"self\.max_bs = max\(self\.capture_bs\)", "self.max_bs = max(self.capture_bs) - 1")],
        "req_pool_indices"),
    # per-token buffers sized without the tokens a request captures
    "init-tokens-without-width": (
        [(RUNNER, r"else self\.max_bs \* self\.captured_req_width", "else self.max_bs")], "input_ids"),
}
#: the same line rewritten without changing what it computes
REFACTOR = [(RUNNER, r"else self\.max_bs \* self\.captured_req_width", "else self.captured_req_width * self.max_bs")]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(UNDERSIZED))
def test_an_init_sizing_a_buffer_too_small_is_caught_by_graph_buffer_soundness(tmp_path, name):
    sglang_or_skip()
    edits, buffer = UNDERSIZED[name]
    proc, out = replay_on_copy(altered_copy(tmp_path, edits, name), tmp_path, CASE, (5, 7, 3),
                               "graph-buffer-soundness")
    assert proc.returncode == 1, out
    origin = failed_check_origin(tmp_path / "report", out)
    assert (origin["property"], origin["buffer"]) == ("graph-buffer-soundness", buffer), origin


@pytest.mark.slow
@pytest.mark.parametrize("refactored", [True, False], ids=["refactor", "pristine"])
def test_a_refactor_of_the_init_holds_and_so_does_the_pristine_copy(tmp_path, refactored):
    sglang_or_skip()
    site = altered_copy(tmp_path, REFACTOR if refactored else [], "refactor" if refactored else None)
    proc, out = replay_on_copy(site, tmp_path, CASE, (5, 7, 3), "graph-buffer-soundness")
    assert proc.returncode == 0, out
    # the target verify sizing is judged first: what ends the check is the draft runner's part, held or
    # its shipped known finding (requests past their context), never the target verify runner
    [check] = json.loads((tmp_path / "report" / "summary.json").read_text())["checks"]
    assert check["status"] in ("held", "known"), out
    if check["status"] == "known":
        assert check["origin"]["writer"] == "draft cuda-graph replay", check


@pytest.mark.slow
def test_a_gated_change_to_the_inits_sizing_line_runs_and_is_caught(tmp_path, sglang_target):
    """The gate's own line trace: a PR whose __init__ sizes its token buffers without the tokens a
    request captures has that line run under graph-buffer-soundness, which catches it (before, the
    runner was made with object.__new__: the line never ran, and the gate could not check it)."""
    from tests.test_gate_measured import checkout_with, edit, gate
    repo = checkout_with(tmp_path, RUNNER)
    edit(repo, RUNNER[0], "else self.max_bs * self.captured_req_width", "else self.max_bs")
    rc, g, out = gate(repo, tmp_path, "graph-buffer-soundness")
    [lines] = [f for f in g["lines"] if f["path"].endswith(RUNNER[0])]
    assert lines["never_ran"] == [], lines
    assert "graph-buffer-soundness" in sum(lines["judged"].values(), []), lines
    assert rc == 1 and "graph-buffer-soundness" in out and "input_ids" in out, out
