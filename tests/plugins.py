"""Plug-in targets that misbehave the way foreign code does: abort, hang, raise.

Loaded with ``--target tests.plugins:NAME``; each behaves like the reference
target until it meets its trigger (a batch past the captured max_bs), which a
short search reaches within its first examples.
"""

from __future__ import annotations

import os
import time

from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.targets.reference import ReferenceTarget


def _past_capacity(mask, batch) -> bool:
    return mask is not None and batch.bs > mask.max_bs


class AbortingTarget(ReferenceTarget):
    name = "aborting"

    def verify(self, mask, config, batch, heap):
        if _past_capacity(mask, batch):
            os.abort()  # what a device-side assert or a segfault looks like from here
        return super().verify(mask, config, batch, heap)


class HangingTarget(ReferenceTarget):
    name = "hanging"

    def verify(self, mask, config, batch, heap):
        if _past_capacity(mask, batch):
            while True:  # a kernel that never returns
                time.sleep(1)
        return super().verify(mask, config, batch, heap)


class RaisingTarget(ReferenceTarget):
    name = "raising"

    def verify(self, mask, config, batch, heap):
        if _past_capacity(mask, batch):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().verify(mask, config, batch, heap)


class ExitingTarget(ReferenceTarget):
    """Calls exit(0) where a real one would fail: the run must not read that as "all held"."""

    name = "exiting"

    def verify(self, mask, config, batch, heap):
        if _past_capacity(mask, batch):
            raise SystemExit(0)
        return super().verify(mask, config, batch, heap)


class InterruptingTarget(ReferenceTarget):
    """Raises KeyboardInterrupt itself (no signal was sent): a target fault, not a Ctrl-C."""

    name = "interrupting"

    def verify(self, mask, config, batch, heap):
        if _past_capacity(mask, batch):
            raise KeyboardInterrupt
        return super().verify(mask, config, batch, heap)


class RecursingTarget(ReferenceTarget):
    name = "recursing"

    def verify(self, mask, config, batch, heap):
        if _past_capacity(mask, batch):
            return self.verify(mask, config, batch, heap)
        return super().verify(mask, config, batch, heap)


class JunkTarget(ReferenceTarget):
    """Returns junk instead of a StepOutput."""

    name = "junk"

    def verify(self, mask, config, batch, heap):
        if _past_capacity(mask, batch):
            return "junk"
        return super().verify(mask, config, batch, heap)


class ExitingFits(ReferenceTarget):
    """exit(0) from fits, which verify-policy calls outside any property check."""

    name = "exiting-fits"

    def fits(self, mask, bs):
        if bs > mask.max_bs:
            raise SystemExit(0)
        return super().fits(mask, bs)


class ExitOnConstruction(ReferenceTarget):
    def __init__(self):
        raise SystemExit(0)


class BadVersions(ReferenceTarget):
    def versions(self):
        return ["not", "a", "dict"]


#: an instance is accepted as a plug-in as well as a class
INSTANCE = ReferenceTarget()


class BreaksReportDir(ReferenceTarget):
    """The reference target, but its first step replaces the directory named by
    VMFUZZ_TEST_BREAK_DIR with a plain file: a report directory that becomes
    unusable mid-run (a chmod would not stop root, which CI containers often are)."""

    name = "breaks-report-dir"

    def allocate(self, config, heap):
        import shutil
        from pathlib import Path
        victim = Path(os.environ.get("VMFUZZ_TEST_BREAK_DIR", ""))
        if victim.name and victim.is_dir():
            shutil.rmtree(victim)
            victim.write_text("this used to be the report directory\n")
        return super().allocate(config, heap)


class ControlCharTarget(ReferenceTarget):
    """Raises with control characters in its message: junit.xml must stay valid XML."""

    name = "control-char"

    def verify(self, mask, config, batch, heap):
        if _past_capacity(mask, batch):
            raise RuntimeError("bad \x01\x02\x1b[31m byte \x00 here \ud800")
        return super().verify(mask, config, batch, heap)


class CoreOnlyTarget(ReferenceTarget):
    """The core protocol alone: no call-site, chain, reader, router or allocation seams.

    What a plug-in written against ``protocol.Target`` looks like: the
    properties needing those seams are not driven on it, and the variants
    replacing them cannot be layered over it.
    """

    site_fits = chain_kernel = chain_write = None
    read_eager = read_replay = pack_mask = None
    route = verify_routed = allocating_backends = allocation_call = None

    def _chain_site(self, buf, config, batch, heap):
        # Its chain call site still works; it only exposes no chain seams.
        return ReferenceTarget()._chain_site(buf, config, batch, heap)


class ThreadLeavingTarget(ReferenceTarget):
    """Its constructor starts a non-daemon thread that never ends (a plug-in's
    background poller): the run must still end once its reports are written."""

    name = "thread-leaving"

    def __init__(self):
        import threading
        super().__init__()
        threading.Thread(target=threading.Event().wait, name="plugin-poller", daemon=False).start()


class KillingTarget(ReferenceTarget):
    """SIGKILLs its own process past the captured max_bs: what the OOM killer does to a worker."""

    name = "killing"

    def verify(self, mask, config, batch, heap):
        if _past_capacity(mask, batch):
            import signal
            os.kill(os.getpid(), signal.SIGKILL)
        return super().verify(mask, config, batch, heap)


class KillsRedisMidRun(ReferenceTarget):
    """The reference target, but its first buffer (an allocation or a chain write) SIGKILLs the
    process VMFUZZ_TEST_REDIS_PID names: the shared example database's server, checked at the
    start, dies during the first fixed case of the search, before the search reads its examples."""

    name = "kills-redis"

    def _kill(self) -> None:
        import signal
        try:
            os.kill(int(os.environ["VMFUZZ_TEST_REDIS_PID"]), signal.SIGKILL)
        except ProcessLookupError:
            pass  # another worker's first buffer killed it

    def allocate(self, config, heap):
        self._kill()
        return super().allocate(config, heap)

    def chain_write(self, inputs, buffer, heap, **kwargs):
        self._kill()
        return super().chain_write(inputs, buffer, heap, **kwargs)


#: the process that loaded the plug-ins: a forked worker's Ctrl-C goes to it, as a terminal's would
_MAIN_PID = os.getpid()


class CtrlCAtRouting(ReferenceTarget):
    """A Ctrl-C (a real SIGINT to the process that loaded it, once: VMFUZZ_TEST_CTRL_C names a
    file that says it was sent) the first time the routing property asks for a router, in that
    process or a worker forked from it: every property before it in the run's order has finished."""

    name = "ctrl-c-at-routing"

    def route(self, router, spec_mode, children, context_len):
        import signal
        try:
            os.close(os.open(os.environ["VMFUZZ_TEST_CTRL_C"], os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            os.kill(_MAIN_PID, signal.SIGINT)
        return super().route(router, spec_mode, children, context_len)


class CtrlCAtSecondVariant(ReferenceTarget):
    """A Ctrl-C (a real SIGINT to this process) when selftest layers its second variant over this
    target (each variant is a copy of it): the first variant has been judged by every property."""

    name = "ctrl-c-at-second-variant"
    copies = 0

    def __copy__(self):
        import signal
        if ":" in self.name:  # the resolved target (named by its spec) layered, not resolve's own copy
            CtrlCAtSecondVariant.copies += 1
            if CtrlCAtSecondVariant.copies == 2:
                os.kill(os.getpid(), signal.SIGINT)
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new


class SlowTarget(ReferenceTarget):
    """The reference target on a slow machine: each allocation sleeps VMFUZZ_TEST_SLOW seconds
    (default 0.02), so every example costs at least that whatever the machine; its answers,
    example for example, are the reference's."""

    name = "slow"

    def allocate(self, config, heap):
        time.sleep(float(os.environ.get("VMFUZZ_TEST_SLOW", "0.02")))
        return super().allocate(config, heap)


class LadderTarget(ReferenceTarget):
    """The reference target with a two-step bounds ladder for ``dev`` (as sglang's nightly has):
    a budget below one step's minimum share reaches no step at all."""

    name = "ladder"
    bounds_ladder = {"dev": (Bounds(), Bounds(max_bs=8))}


class AdmitsElevenOnOldSGLang(ReferenceTarget):
    """Claims an SGLang release (so known entries ranged for it apply) and admits a batch of exactly
    11 requests into any buffer: a known entry's repro of 11 requests overruns past the capacity."""

    name = "admits-eleven"

    def versions(self):
        return {"reference": "0.1.0", "sglang": "0.4.0"}

    def fits(self, mask, bs):
        return bs == 11 or super().fits(mask, bs)


class NoRoutingTarget(ReferenceTarget):
    """The reference target without routers: routing is not driven here (a target lacking that seam)."""

    name = "norouting"

    def not_driven_here(self, prop):
        return "no routers on this target" if prop == "routing" else None


class KilledOnceTarget(ReferenceTarget):
    """Its worker is SIGKILLed from outside once, mid-check (the OOM killer picking it), then runs clean:
    ``$VMFUZZ_TEST_KILLED_ONCE`` is the file that says the kill happened."""

    name = "killed-once"

    def verify(self, mask, config, batch, heap):
        import signal
        flag = os.environ["VMFUZZ_TEST_KILLED_ONCE"]
        if not os.path.exists(flag):
            open(flag, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().verify(mask, config, batch, heap)


class SlowToLoadTarget(ReferenceTarget):
    """The reference target whose loading takes ``$VMFUZZ_TEST_SLOW_LOAD`` seconds (a large import of the
    code under test); ``$VMFUZZ_TEST_SLOW_LOAD_HANG=1`` sleeps it in one call that no Python-level
    interruption ends (a hang inside a C extension)."""

    name = "slow-to-load"

    def __init__(self):
        seconds = float(os.environ.get("VMFUZZ_TEST_SLOW_LOAD", "0"))
        if os.environ.get("VMFUZZ_TEST_SLOW_LOAD_HANG") == "1":
            time.sleep(seconds)
            return
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            time.sleep(0.05)


class SlowKnownReplayOnOldSGLang(AdmitsElevenOnOldSGLang):
    """``AdmitsElevenOnOldSGLang`` whose verify step of an 11-request batch (a known entry's repro) sleeps
    ``$VMFUZZ_TEST_SLOW_ELEVEN`` seconds: a replay a loaded machine makes slow. Once
    ``$VMFUZZ_TEST_SLOW_ONCE`` names a file, only the first such step sleeps (it leaves the file)."""

    name = "slow-known-replay"

    def verify(self, mask, config, batch, heap):
        if len(batch.seq_lens) == 11:
            once = os.environ.get("VMFUZZ_TEST_SLOW_ONCE")
            if not once or not os.path.exists(once):
                if once:
                    open(once, "w").close()
                time.sleep(float(os.environ.get("VMFUZZ_TEST_SLOW_ELEVEN", "0")))
        return super().verify(mask, config, batch, heap)
