"""SGLang's torch.compile'd draft selection compiled once, in the process the checkers fork from.

EAGLE's draft forward picks each later step's tokens through
``spec_utils._select_top_k_tokens_later``, which SGLang wraps in
``torch.compile(dynamic=True)``. On a CPU, Dynamo traces it and Inductor
builds C++ for it the first time a process calls it, and again for each new
specialisation (a batch of one request, top-k 1): about 6 s of CPU in a fresh
process. A gate searches in two forked lanes and replays in a forked checker,
each of which paid that on its own (measured on 0.5.23: every graph check's
process compiled it). Compiled here, before they fork, the compiled variants are
inherited and each process skips the work.

Nothing a check sees changes: the checks still call SGLang's own compiled
function, with the variants Dynamo would have compiled for the same shapes in
the checker itself (a shape not warmed here compiles there, as before). The
warm-up calls SGLang's code outside any watchdog, so it runs under its own
alarm: a change under review that makes the selection hang or raise leaves the
warm-up, and meets the check that drives it, in its watched worker.
"""

from __future__ import annotations

import signal

import torch

from vmfuzz.harness.targets.sglang.draft_model import HIDDEN

#: the properties whose checks run SGLang's draft forward (the draft-decode graph's capture and replay)
DRAFTING = frozenset({"graph-buffer-soundness", "graph-replay-equivalence", "padding-inert",
                      "capture-replay-agreement"})
#: (requests, top-k): the specialisations the draft graphs' buckets meet (one request or more, top-k 1 or more)
SHAPES = ((1, 1), (2, 1), (1, 2), (2, 2))
#: seconds the warm-up may take before it is given up (a cold Inductor cache compiles with the host's C++ compiler)
LIMIT_S = 60.0

_warmed = False


class _TooLong(Exception):
    """The warm-up's alarm rang."""


def before_forks(names) -> None:
    """Compiles the draft selection here when a property in ``names`` drives it; at most once a process.
    Any failure leaves the compiling to the checks themselves, as without the warm-up."""
    global _warmed
    if _warmed or not DRAFTING & set(names):
        return
    _warmed = True
    try:
        from vmfuzz.harness.targets.sglang.imports import sglang_module
        select = sglang_module("sglang.srt.speculative.spec_utils").select_top_k_tokens
    except Exception:  # noqa: BLE001 - a release without it: the checks say what they cannot drive
        return
    _alarmed(lambda: _select_each_shape(select))


def _select_each_shape(select) -> None:
    for bs, topk in SHAPES:
        rows = bs * topk
        select(1, torch.rand(rows, topk), torch.randint(0, 8, (rows, topk)),
               torch.rand(rows, HIDDEN, dtype=torch.float64), torch.rand(bs, topk), topk)


def _alarmed(work) -> None:
    """``work()`` under a ``LIMIT_S`` alarm; whatever it raises or however long it takes, it returns."""
    def ring(signum, frame):
        raise _TooLong

    before = signal.signal(signal.SIGALRM, ring)
    try:
        signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
        try:
            work()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except Exception:  # noqa: BLE001 - the checks meet it again, watched; _TooLong included
        pass
    finally:
        signal.signal(signal.SIGALRM, before)
    _tqdm_monitor_stopped()


def _tqdm_monitor_stopped() -> None:
    """Inductor's progress bar starts tqdm's monitor thread; it is stopped so the forks happen from a
    process with one thread, as they did before the warm-up."""
    import sys
    # only a tqdm something already imported can have started a monitor (and vmfuzz does not depend on it)
    tqdm = getattr(sys.modules.get("tqdm"), "tqdm", None)
    monitor = getattr(tqdm, "monitor", None)
    if monitor is not None:
        monitor.exit()
