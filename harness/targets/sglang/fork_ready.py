"""Work every forked lane and checker would otherwise repeat on its own, done once or not at all.

Two costs a gate used to pay in each process it forks:

* **Compilation.** SGLang wraps a few functions in ``torch.compile`` (EAGLE's
  later-step draft selection, ``spec_utils._select_top_k_tokens_later``, among
  them). On a host without CUDA, Dynamo traced it and Inductor built C++ for each
  new specialisation: about 4 s of CPU before the lanes could fork, and more in
  a checker that met a shape not warmed. Where SGLang's kernels run in Triton's
  interpreter, its compiled functions now run as their Python (Dynamo off for the
  process), the way SGLang itself runs them on NPU and XPU hosts
  (``disable=_is_npu or _is_xpu``). What they compute is what the compiled form
  computes (``torch.compile``'s contract; tests/test_fork_ready.py holds the
  selection to its compiled answers), and their lines now run where coverage.py
  sees them: a change inside a compiled function is judged like any other, where
  before only Dynamo's trace of it ran. On a CUDA host nothing changes.
* **Imports a capture makes.** Building and capturing a cuda-graph runner imports
  SGLang modules lazily (the decode runner asks whether its backend is
  DeepSeek V4's; the model runner's module; the hybrid backend): measured in a gate's
  profile, each forked checker imported them afresh. ``before_forks`` imports
  them once, in the process the lanes fork from, when a property that captures
  runs, under an alarm (these imports run outside any watchdog): a module that fails to
  import, or hangs, is left to the check that meets it, watched.
"""

from __future__ import annotations

import signal

#: the properties whose checks build and capture SGLang's cuda-graph runners
CAPTURING = frozenset({"graph-buffer-soundness", "graph-replay-equivalence", "padding-inert",
                       "capture-replay-agreement"})
#: SGLang modules a capture imports on first use (measured: py-spy over a gate, imports in forked checkers)
CAPTURE_IMPORTS = ("sglang.srt.layers.attention.deepseek_v4_backend",
                   "sglang.srt.model_executor.model_runner",
                   "sglang.srt.layers.attention.hybrid_attn_backend")

#: seconds the imports may take before they are given up
LIMIT_S = 60.0

_imported = False


class _TooLong(BaseException):
    """The alarm rang (not an Exception: the per-module ``except`` must not swallow it)."""


def compiled_as_python() -> None:
    """SGLang's ``torch.compile``'d functions run as their Python in this process and its forks."""
    import torch._dynamo
    torch._dynamo.config.disable = True


def before_forks(names) -> None:
    """Imports what a capture would import, here, when a property in ``names`` captures; at most once a
    process. An import that fails is left to the checks, which meet it in their watched workers."""
    global _imported
    if _imported or not CAPTURING & set(names):
        return
    _imported = True
    from vmfuzz.harness.targets.sglang.imports import sglang_module

    def each():
        for name in CAPTURE_IMPORTS:
            try:
                sglang_module(name)
            except Exception:  # noqa: BLE001 - a release without it, or one that raises: the check says so
                continue
    _alarmed(each)


def _alarmed(work) -> None:
    """``work()`` under a ``LIMIT_S`` alarm; however long it takes, it returns, the caller's alarm put back."""
    def ring(signum, frame):
        raise _TooLong

    before = signal.signal(signal.SIGALRM, ring)
    try:
        signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
        try:
            work()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _TooLong:  # the checks meet the hang again, watched
        pass
    finally:
        signal.signal(signal.SIGALRM, before)
