"""A fixed-count search spread over lanes: processes forked after the target has loaded.

A gate's search is a dozen independent searches of a fixed number of examples
each, nearly all of their time inside the code under test (on a CPU host,
Triton's interpreter running SGLang's kernels), on one core while the others
idle. ``--workers`` spreads a search over spawned processes, each of which
imports the target again: seconds of SGLang's import per worker, more than a
gate's share of the search. A lane is forked from the process that already
imported it, so it starts at once, holding the same modules, the same attached
known findings and the same code under test.

Each lane takes the next search (a slot: one property, or the properties one
shared run judges) when it finishes its last, the heaviest first, so a slow
property started last never runs alone at the end. A slot's results are the
ones it would have had in one process: each property's search is seeded by
its own name and reads its own keys of the example database, whoever runs it.

Lanes are used only where a check already runs in its own watched worker
(``--isolate``), so a crash in the code under test costs a check, never a
lane; a lane that dies all the same (the OOM killer) leaves its searches not
checked, said as such, never held.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Callable

import multiprocessing as mp

#: most lanes a search opens: on a 2-core runner the second core is the win; past the cores, none
MAX_LANES = 2


def lanes_available(choice: str | None = None) -> int:
    """How many lanes this host affords: ``VMFUZZ_LANES`` (1 turns lanes off) or its usable cores,
    at most ``MAX_LANES``."""
    choice = os.environ.get("VMFUZZ_LANES") if choice is None else choice
    if choice:
        try:
            return max(1, int(choice))
        except ValueError:
            return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(MAX_LANES, cores))


@dataclass
class LaneReport:
    """What one slot's search sent back: its results, and the kernel launches and seconds it spent
    (the parent's count of the search's kernel share adds them up)."""

    results: list
    launches: int = 0
    kernel_seconds: float = 0.0
    busy_seconds: float = 0.0


@dataclass
class Lanes:
    """``search(slot)`` -> the slot's results, run over ``count`` forked lanes; ``finish_lane()`` in each
    lane as it ends (its own workers stopped, their records written)."""

    search: Callable[[list[str]], list]
    count: int
    finish_lane: Callable[[], None] = lambda: None
    #: seconds the lanes spent searching, all together (the kernel share's denominator)
    busy_seconds: float = 0.0
    launches: int = 0
    kernel_seconds: float = 0.0
    #: when the lanes were forked (their search's start)
    started: float = 0.0
    #: past this (``time.monotonic()``), a lane still searching is killed and its slot lost: the run's
    #: cap holds for the whole run even when a lane's own search overruns it (None: no cap)
    deadline: float | None = None
    _procs: list = field(default_factory=list)
    _idle: list = field(default_factory=list)
    _busy: dict = field(default_factory=dict)  # connection -> (process, slot)
    _todo: list = field(default_factory=list)

    def run(self, slots: list[list[str]], on_results: Callable[[list], None],
            on_lost: Callable[[list[str], str], None]) -> None:
        """Every slot searched once, in the order given, ``on_results`` with each slot's results
        as it ends; ``on_lost(slot, why)`` for a slot whose lane died mid-search."""
        self.start(slots)
        self.finish(on_results, on_lost)

    def start(self, slots: list[list[str]]) -> None:
        """The lanes forked, each searching its first slot while this process does something else
        (a run replays its saved repros meanwhile); ``finish`` hands out the rest."""
        from vmfuzz.harness.engine.core.signals import held
        ctx = mp.get_context("fork")
        self.started = time.monotonic()
        self._todo = list(slots)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # a forked lane must not write out what the parent had buffered
        from vmfuzz.harness.engine.core.isolation import frozen_for_fork
        frozen_for_fork()
        try:
            for _ in range(min(self.count, len(self._todo))):
                parent, child = ctx.Pipe()
                # Not daemonic: a lane starts its own watched checkers.
                proc = ctx.Process(target=_lane, args=(child, self.search, self.finish_lane))
                with held():
                    proc.start()
                child.close()
                self._procs.append((proc, parent))
                self._idle.append((proc, parent))
            self._hand_out()
        except BaseException:
            self.close()
            raise

    def _hand_out(self) -> None:
        while self._todo and self._idle:
            proc, conn = self._idle.pop()
            slot = self._todo.pop(0)
            try:
                conn.send(slot)
            except OSError:  # it died while idle: the slot goes to the next lane
                self._todo.insert(0, slot)
                continue
            self._busy[conn] = (proc, slot)

    def finish(self, on_results: Callable[[list], None], on_lost: Callable[[list[str], str], None]) -> None:
        """Every slot left handed out and every result taken, then the lanes ended."""
        from vmfuzz.harness.engine.core.isolation import exit_reason
        try:
            while self._todo or self._busy:
                self._hand_out()
                if not self._busy:
                    for slot in self._todo:  # every lane died: what is left cannot be searched here
                        on_lost(slot, "no search lane left")
                    return
                left = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
                ready = wait(list(self._busy) + [p.sentinel for p, _ in self._busy.values()], timeout=left)
                if not ready and left is not None and time.monotonic() >= self.deadline:
                    for conn, (proc, slot) in list(self._busy.items()):
                        proc.kill()
                        proc.join(5)
                        del self._busy[conn]
                        on_lost(slot, "its search lane was still searching past the run's cap, and was killed")
                    for slot in self._todo:
                        on_lost(slot, "no search lane was free before the run's cap")
                    self._todo.clear()
                    return
                for conn in [c for c, (p, _) in self._busy.items() if c in ready or p.sentinel in ready]:
                    proc, slot = self._busy.pop(conn)
                    # A lane that died may leave its pipe open in a checker it forked: its end is the
                    # lane's exit, never EOF on a pipe another process still holds (recv would wait on).
                    if not conn.poll(0):
                        proc.join(5)
                        on_lost(slot, f"its search lane died: {exit_reason(proc.exitcode)}")
                        continue
                    try:
                        kind, value = conn.recv()
                    except (EOFError, OSError):
                        proc.join(5)
                        on_lost(slot, f"its search lane died: {exit_reason(proc.exitcode)}")
                        continue
                    self._idle.append((proc, conn))
                    if kind == "raise":
                        raise value
                    self.launches += value.launches
                    self.kernel_seconds += value.kernel_seconds
                    self.busy_seconds += value.busy_seconds
                    on_results(value.results)
        finally:
            self.close()

    def close(self) -> None:
        """Every lane asked to end (killed past a grace period); nothing is searched after. A lane still
        searching (an interrupt, an error) is killed at once: no search is waited for."""
        for proc, _slot in self._busy.values():
            proc.kill()
        for proc, conn in self._procs:
            try:
                conn.send(None)  # asked, not killed: a lane writes its record of the lines it ran
            except OSError:
                pass
        for proc, conn in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
            conn.close()
        self._procs.clear()
        self._idle.clear()
        self._busy.clear()
        self._todo.clear()


def _lane(conn, search, finish) -> None:
    """A lane's loop: a slot in, ``("ok", LaneReport)`` or ``("raise", exc)`` out, until ``None``."""
    from vmfuzz.harness.engine.core.isolation import end_worker, serve_tasks
    from vmfuzz.harness.engine.core.signals import die_with_parent, ignore_in_child
    from vmfuzz.harness.guard.tree_write import LAUNCHES
    ignore_in_child()  # Ctrl-C reaches the whole group: the parent stops its lanes
    die_with_parent()
    import torch
    torch.set_num_threads(1)  # lanes share the cores: one thread each, as forked checkers do

    def report(slot) -> LaneReport:
        t0, (launches, secs) = time.monotonic(), LAUNCHES.snapshot()
        results = search(slot)
        now = LAUNCHES.snapshot()
        return LaneReport(results, now[0] - launches, now[1] - secs, time.monotonic() - t0)

    try:
        serve_tasks(conn, report)
    finally:
        try:
            finish()
        except Exception:  # noqa: BLE001 - a lane ends whatever its clean-up met
            pass
        end_worker()  # the parent's atexit handlers and threads are not this lane's to run
