"""What every forked lane and checker would repeat alone (harness/targets/sglang/fork_ready.py):
SGLang's compiled functions run as their Python, a capture's imports made once before the forks."""

from __future__ import annotations

import signal
import time

import pytest

from tests.helpers import sglang_or_skip
from vmfuzz.harness.targets.sglang import fork_ready, imports


@pytest.fixture
def fresh(monkeypatch):
    """fork_ready as a process that has not imported yet, SGLang's import a recording stand-in."""
    imported = []
    monkeypatch.setattr(fork_ready, "_imported", False)
    monkeypatch.setattr(imports, "sglang_module", lambda name: imported.append(name))
    return imported


def test_a_captures_imports_are_made_for_a_capturing_property_only_and_once(fresh):
    fork_ready.before_forks(["trivial-path", "reader-agreement"])
    assert fresh == []  # nothing captures: nothing imported for nothing
    fork_ready.before_forks(["trivial-path", "padding-inert"])
    assert fresh == list(fork_ready.CAPTURE_IMPORTS)
    fork_ready.before_forks(["graph-buffer-soundness"])
    assert fresh == list(fork_ready.CAPTURE_IMPORTS)  # once a process


def test_a_raising_or_hanging_import_leaves_the_rest_and_the_callers_alarm_as_they_were(fresh, monkeypatch):
    def raising(name):
        fresh.append(name)
        if name == fork_ready.CAPTURE_IMPORTS[0]:
            raise imports.ImportRaised("a change under review broke it")

    monkeypatch.setattr(imports, "sglang_module", raising)
    fork_ready.before_forks(["capture-replay-agreement"])
    assert fresh == list(fork_ready.CAPTURE_IMPORTS)  # the first raised; the others were still made
    monkeypatch.setattr(fork_ready, "_imported", False)
    monkeypatch.setattr(fork_ready, "LIMIT_S", 0.2)
    monkeypatch.setattr(imports, "sglang_module", lambda name: time.sleep(30))
    mine = signal.signal(signal.SIGALRM, signal.SIG_IGN)
    try:
        start = time.monotonic()
        fork_ready.before_forks(["graph-replay-equivalence"])
        assert time.monotonic() - start < 5
        assert signal.getsignal(signal.SIGALRM) is signal.SIG_IGN  # the caller's handler put back
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGALRM, mine)


@pytest.mark.slow
def test_sglangs_draft_selection_runs_as_its_python_and_answers_as_its_compiled_form():
    target = sglang_or_skip()
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters
    assert target is not None and torch._dynamo.config.disable  # loading the target switched Dynamo off
    su = imports.sglang_module("sglang.srt.speculative.spec_utils")
    g = torch.Generator().manual_seed(7)
    cases = []
    for bs, topk in ((3, 2), (5, 1), (1, 1), (8, 4)):
        rows = bs * topk
        cases.append((2, torch.rand(rows, topk, generator=g), torch.randint(0, 32, (rows, topk), generator=g),
                      torch.rand(rows, 4, dtype=torch.float64, generator=g), torch.rand(bs, topk, generator=g),
                      topk))
    before = counters["stats"]["unique_graphs"]
    run_as_python = [su.select_top_k_tokens(*case) for case in cases]
    assert counters["stats"]["unique_graphs"] == before  # nothing traced or compiled
    torch._dynamo.reset()
    with torch._dynamo.config.patch(disable=False):  # the compiled form, as a CUDA host runs it
        compiled = [su.select_top_k_tokens(*case) for case in cases]
    assert counters["stats"]["unique_graphs"] > before  # it did compile
    for mine, theirs in zip(run_as_python, compiled):
        assert torch.equal(mine[0], theirs[0]) and torch.equal(mine[1], theirs[1])
        assert torch.equal(mine[2], theirs[2])
        assert all(torch.equal(a, b) for a, b in zip(mine[3], theirs[3]))
