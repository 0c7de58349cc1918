"""SGLang's compiled draft selection is compiled once before the forks (harness/targets/sglang/compile_warm.py)."""

from __future__ import annotations

import os
import pickle
import signal
import time
from types import SimpleNamespace

import pytest

from tests.helpers import sglang_or_skip
from vmfuzz.harness.targets.sglang import compile_warm, imports


@pytest.fixture
def fresh(monkeypatch):
    """compile_warm as a process that has not warmed, its SGLang module a recording stand-in."""
    calls = []
    select = SimpleNamespace(fn=lambda i, p, idx, hs, scores, topk: calls.append((i, tuple(scores.shape), topk)))
    monkeypatch.setattr(compile_warm, "_warmed", False)
    monkeypatch.setattr(imports, "sglang_module",
                        lambda name: SimpleNamespace(select_top_k_tokens=lambda *a: select.fn(*a)))
    return calls, select


def test_the_warm_up_runs_for_a_drafting_property_only_and_once(fresh):
    calls, _ = fresh
    compile_warm.before_forks(["trivial-path", "reader-agreement"])
    assert calls == []  # nothing run drafts: no compile paid for nothing
    compile_warm.before_forks(["trivial-path", "graph-buffer-soundness"])
    assert calls == [(1, (bs, topk), topk) for bs, topk in compile_warm.SHAPES]
    compile_warm.before_forks(["padding-inert"])
    assert len(calls) == len(compile_warm.SHAPES)  # once a process


def test_a_raising_or_hanging_selection_leaves_the_warm_up_and_the_alarm_as_it_was(fresh, monkeypatch):
    calls, select = fresh

    def raising(*args):
        calls.append("raised")
        raise RuntimeError("a change under review broke it")

    select.fn = raising
    compile_warm.before_forks(["graph-buffer-soundness"])
    assert calls == ["raised"]  # the first shape raised: given up, the check meets it watched
    monkeypatch.setattr(compile_warm, "_warmed", False)
    monkeypatch.setattr(compile_warm, "LIMIT_S", 0.2)
    select.fn = lambda *args: time.sleep(30)
    mine = signal.signal(signal.SIGALRM, signal.SIG_IGN)
    try:
        start = time.monotonic()
        compile_warm.before_forks(["graph-replay-equivalence"])
        assert time.monotonic() - start < 5
        assert signal.getsignal(signal.SIGALRM) is signal.SIG_IGN  # the caller's handler put back
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGALRM, mine)


@pytest.mark.slow
def test_a_forked_checker_reuses_the_warmed_compile_and_selects_as_sglang_eagerly_does(monkeypatch):
    sglang_or_skip()
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters
    monkeypatch.setattr(compile_warm, "_warmed", False)
    compile_warm.before_forks(["graph-buffer-soundness"])
    su = imports.sglang_module("sglang.srt.speculative.spec_utils")
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1
    g = torch.Generator().manual_seed(7)
    cases = []
    for bs, topk in ((3, 2), (5, 1), (1, 1), (8, 4)):  # new sizes of the warmed specialisations
        rows = bs * topk
        cases.append((2, torch.rand(rows, topk, generator=g), torch.randint(0, 32, (rows, topk), generator=g),
                      torch.rand(rows, 4, dtype=torch.float64, generator=g), torch.rand(bs, topk, generator=g),
                      topk))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a checker forked after the warm-up
        try:
            got = [su.select_top_k_tokens(*case) for case in cases]
            os.write(write, pickle.dumps((counters["stats"]["unique_graphs"], got)))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child_graphs, got = pickle.loads(pipe.read())
    os.waitpid(pid, 0)
    assert child_graphs == graphs  # nothing compiled again in the child
    with torch._dynamo.config.patch(disable=True):  # SGLang's function run eagerly, as the reference
        want = [su.select_top_k_tokens(*case) for case in cases]
    for g_out, w_out in zip(got, want):
        assert torch.equal(g_out[0], w_out[0]) and torch.equal(g_out[1], w_out[1])
        assert torch.equal(g_out[2], w_out[2])
        assert all(torch.equal(a, b) for a, b in zip(g_out[3], w_out[3]))
