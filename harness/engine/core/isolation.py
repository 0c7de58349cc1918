"""Runs property checks in a forked worker under a watchdog.

A target under review may abort, segfault, corrupt its process or never return.
In-process, any of those ends the campaign and loses its findings; here it ends
only the worker, and the case that did it becomes a ``target-crash`` or
``target-hang`` finding while the search goes on with a fresh worker.
"""

from __future__ import annotations

import multiprocessing as mp
import signal

from vmfuzz.harness.engine.core import clock
from vmfuzz.harness.engine.core.failures import ImportRaised, TargetFault, TargetRaised, own_raise, raise_place  # noqa: F401 - re-exported
from vmfuzz.harness.guard.tree_write import LAUNCHES
from vmfuzz.harness.model.errors import OutOfStep, SetUpRaised
from vmfuzz.harness.properties import Observation, PropertyFailure, lookup

CRASH, HANG = "target-crash", "target-hang"


def _serve(target, conn) -> None:
    from vmfuzz.harness.engine.core.stack_room import roomy
    roomy(_serve_checks, target, conn)  # the interpreter's hot loop, clear of a frame chunk's end


def _serve_checks(target, conn) -> None:
    import torch
    from vmfuzz.harness.engine.core.signals import die_with_parent, ignore_in_child
    ignore_in_child()  # Ctrl-C reaches the whole group: the parent stops this worker
    die_with_parent()  # a lane or run killed (the OOM killer) takes its checker with it, never leaves it searching
    # A forked child must not reuse the parent's intra-op thread pool (the
    # reason torch's own DataLoader workers run single-threaded).
    torch.set_num_threads(1)
    from vmfuzz.harness.engine.core import line_trace, output_record
    while True:
        try:
            task = conn.recv()
        except EOFError:
            task = None
        if task is None:  # asked to end (or the parent is gone): keep what ran
            line_trace.flush()
            output_record.flush()
            return
        prop_name, config, batches, device = task
        before = LAUNCHES.snapshot()

        def spent():  # this check's kernel launches and their seconds, for the parent's count
            now = LAUNCHES.snapshot()
            return now[0] - before[0], now[1] - before[1]

        try:
            with line_trace.judging(prop_name):
                obs = output_record.check_recorded(lookup(prop_name).check, target, prop_name, config, batches,
                                                   device)
            conn.send(("ok", sorted(obs.classes), obs.margin, dict(obs.path_margins),
                       {n: sorted(c) for n, c in getattr(obs, "by_property", {}).items()}, spent()))
        except PropertyFailure as exc:
            conn.send(("fail", exc.origin, exc.detail, spent()))
        except OutOfStep as exc:  # the harness's seam, not the target: crosses as itself, with the
            # code's own raise behind a set-up's (read here, where its traceback is)
            conn.send(("out-of-step", exc.seam, exc.file, exc.why, own_raise(exc), spent()))
        except ImportRaised as exc:  # SGLang's code raised on import: its own origin (stage import), not its type
            conn.send(("fail", exc.origin(prop_name), exc.detail(), spent()))
        except BaseException as exc:  # noqa: BLE001 - the target's own error (even exit()), reported as the property's
            try:
                conn.send(("raise", type(exc).__name__, str(exc)[:4000], raise_place(exc), spent()))
            except Exception:  # noqa: BLE001 - an unpicklable or broken answer: the worker is lost
                return


def frozen_for_fork() -> None:
    """Moves what this process holds out of the garbage collector's reach before it forks.

    A child's collections would otherwise walk, and so write to, every object it inherited: each
    page of the parent's heap (SGLang, torch, the interpreter's kernels: hundreds of MB) copied into
    every child, seconds of page faults per search lane and per checker. Frozen, the inherited objects stay
    shared; they were reachable when frozen, so nothing collectable is kept.
    """
    import gc
    gc.freeze()


def serve_tasks(conn, answer) -> None:
    """A worker's loop over its pipe: a task in, ``("ok", answer(task))`` or ``("raise", exc)`` out,
    until the parent sends ``None`` or is gone. Shared by ``--workers`` processes and search lanes."""
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        try:
            reply = ("ok", answer(task))
        except BaseException as exc:  # noqa: BLE001 - crosses to the parent, which raises it there
            reply = ("raise", exc)
        try:
            conn.send(reply)
        except OSError:
            return  # the parent is gone: nobody to answer
        except Exception:  # noqa: BLE001 - an answer that does not pickle still says what happened
            try:
                conn.send(("raise", RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}"[:2000])))
            except OSError:
                return


def end_worker() -> None:
    """A worker's last act: its records of the lines it ran and of what it was handed written, its
    output flushed, then gone without the parent's atexit handlers or a plug-in's threads."""
    import os
    import sys
    from vmfuzz.harness.engine.core import line_trace, output_record
    line_trace.flush()
    output_record.flush()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def exit_reason(code: int | None) -> str:
    if code is None:
        return "worker vanished"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class KilledFromOutside(Exception):
    """The worker died of SIGKILL mid-check: rerun once before it is called the target's crash."""


class IsolatedChecker:
    """Drop-in for ``prop.check``: same arguments, same Observation or PropertyFailure."""

    def __init__(self, target, timeout: float = 30.0):
        self.target = target
        self.timeout = timeout
        self._ctx = mp.get_context("fork")
        self._proc = None
        self._conn = None

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(self.target, child), daemon=True)
        from vmfuzz.harness.engine.core.signals import held
        frozen_for_fork()
        with held():
            self._proc.start()
        child.close()
        self._conn = parent

    def _discard(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        self._conn.close()
        return proc.exitcode

    def close(self) -> None:
        if self._proc is not None:
            # Asked, not killed: the worker writes its record of the lines it ran first.
            try:
                self._conn.send(None)
                self._proc.join(5)
            except (OSError, ValueError):
                pass
            self._discard()

    def __call__(self, prop, config, batches, device="cpu") -> Observation:
        try:
            return self._check(prop, config, batches, device)
        except KilledFromOutside:
            # SIGKILL is what the OOM killer and a CI runner's cancel send, never a kernel's own fault
            # (that is SIGSEGV, SIGABRT, SIGBUS): the case once more, in a fresh worker, decides
            try:
                return self._check(prop, config, batches, device)
            except KilledFromOutside:
                raise TargetFault(CRASH, "target process died: killed by signal SIGKILL, twice on this case",
                                  stopped=True) from None

    def _check(self, prop, config, batches, device="cpu") -> Observation:
        if clock.reached():  # a gate's time cap: no check starts past it
            raise clock.CapReached()
        if self._proc is None or not self._proc.is_alive():
            if self._proc is not None:
                self._discard()
            self._start()
        self._conn.send((prop.name, config, batches, device))
        wait = clock.bounded(self.timeout)
        if not self._conn.poll(wait):
            self._discard()
            if wait < self.timeout:  # the cap, not the example's timeout, ended the wait: no hang of the target's
                raise clock.CapReached()
            raise TargetFault(HANG, f"no answer within {self.timeout:g}s (per-example timeout)", stopped=True)
        try:
            msg = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(5)
            code = self._discard()
            if code == -signal.SIGKILL:
                raise KilledFromOutside() from None
            raise TargetFault(CRASH, "target process died: " + exit_reason(code)) from None
        kind, *rest, spent = msg
        LAUNCHES.add(*spent)
        if kind == "ok":
            classes, margin, path_margins, by_property = rest
            return Observation(set(classes), margin, path_margins, {n: set(c) for n, c in by_property.items()})
        if kind == "fail":
            raise PropertyFailure(*rest)
        if kind == "out-of-step":
            *where, raised = rest
            raise SetUpRaised(*where, raised) if raised else OutOfStep(*where)
        raise TargetRaised(*rest)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
