"""The gate's time cap: one clock from the gate's start to its exit, every phase under it.

The pr profile's cap is a hang guard on the whole gate, not on its search
alone: finding what the change touches, the base's replay of the known
entries, the import of the code under test, the watch's set-up, the replays,
the search, the base's answer on cases vmfuzz fell out of step on, and the
coverage of the changed lines all count. A release diff on a loaded machine
spent 217 s outside the search, which alone was capped.

Each phase that waits on something that can run long (a child process, a
checker, a lane) waits at most what is left (``left``, ``bounded``); what the
cap stops is said as a line (``cut``): could not check, exit 3, never silent.
Past the cap the gate has ``grace(cap)`` seconds to stop what runs and write
its reports. The watch here enforces that: it raises ``CapReached`` in the
main thread part-way through the grace, wherever it is (an import, the
coverage), and ends the process at the grace's end (exit 3) if that did not.

Forked lanes and checkers inherit the clock (not its watch: a thread does not
survive a fork), so a checker's wait is bounded by the cap too.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable

#: the state of this process's clock (a forked child's copy is its parent's at the fork)
_clock: dict = {"entered": None, "start": None, "cap": None, "cut": [], "phase": "", "watch": None,
                "settled": False, "children": [], "fired": False, "folders": []}


from vmfuzz.harness.model.errors import CapReached  # noqa: F401 - raised and caught as clock.CapReached


def grace(cap: float) -> float:
    """Seconds past the cap a gate may take to stop and write its reports: a tenth of the cap, at
    least 5 s and at most 30 s."""
    return min(30.0, max(5.0, cap / 10))


def entered(process_entry: bool) -> None:
    """Called as a command starts: the moment its clock counts from. When the command is the
    process's own entry, that is the process's start (the interpreter's and vmfuzz's imports count)."""
    _clock["entered"] = _process_started() if process_entry else time.monotonic()


def _process_started() -> float:
    """``time.monotonic()`` when this process started (Linux's /proc); now where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic()
    return time.monotonic() - age if 0 <= age < 3600 else time.monotonic()


def start(cap: float, on_overrun: Callable[[], None] | None = None, *, watched: bool = True) -> None:
    """The cap counts from the command's start (``entered``, else now); the watch that holds the
    process to it starts (not ``watched``: a caller that is no command, a test). ``on_overrun()``
    writes the reports of a gate the watch ends."""
    stop()
    began = _clock["entered"] or time.monotonic()
    _clock.update(start=began, cap=float(cap), cut=[], phase="", settled=False, fired=False)
    if not watched:
        return
    done = threading.Event()
    watch = threading.Thread(target=_watch, args=(done, threading.main_thread().ident, on_overrun),
                             name="vmfuzz-cap", daemon=True)
    _clock["watch"] = (watch, done)
    watch.start()


def stop() -> None:
    """The command ended: the watch ends, the clock stops."""
    if _clock["watch"] is not None:
        _clock["watch"][1].set()
    _clock.update(start=None, cap=None, cut=[], phase="", watch=None, settled=False, children=[], fired=False,
                  folders=[])


def running() -> bool:
    return _clock["start"] is not None


def cap() -> float | None:
    return _clock["cap"]


def elapsed() -> float:
    return time.monotonic() - _clock["start"] if running() else 0.0


def end() -> float | None:
    """The cap's moment (``time.monotonic``), None while no clock runs."""
    return _clock["start"] + _clock["cap"] if running() else None


def left() -> float | None:
    """Seconds left before the cap (negative past it); None while no clock runs."""
    return end() - time.monotonic() if running() else None


def reached() -> bool:
    return running() and time.monotonic() >= end()


def bounded(seconds: float) -> float:
    """``seconds``, or what is left of the cap when that is less (never below 0)."""
    remaining = left()
    return seconds if remaining is None else max(0.0, min(seconds, remaining))


def leave_no(folder) -> None:
    """A scratch folder the watch has removed (by a detached ``rm``, not waited for) if it ends the gate."""
    _clock["folders"].append(str(folder))


def track(proc) -> None:
    """A child process (``subprocess.Popen``) the watch kills if it ends the gate: a lane or checker
    dies with its parent by itself, a fresh process on the base's code would not."""
    _clock["children"].append(proc)


def phase(name: str) -> None:
    """What the gate is doing now: the words of a report the watch writes if the cap ends it here."""
    _clock["phase"] = name


def current_phase() -> str:
    return _clock["phase"]


def cut(line: str) -> None:
    """A could-not-check line for what the cap stopped (said once)."""
    if line not in _clock["cut"]:
        _clock["cut"].append(line)


def cut_lines() -> list[str]:
    return list(_clock["cut"])


def settle() -> None:
    """The reports are being written: the watch raises nothing into the main thread from here
    (it still ends a process that overruns the grace)."""
    _clock["settled"] = True


def fired() -> bool:
    """The watch raised ``CapReached`` into the main thread before the reports were begun: whatever the
    gate came to after it (code that caught it and said something else included) is the cap's doing."""
    return _clock["fired"] and not _clock["settled"]


def _watch(done: threading.Event, main_thread: int | None, on_overrun) -> None:
    """Part-way through the grace, ``CapReached`` in the main thread; at its end, the process ended."""
    total = grace(_clock["cap"])
    if done.wait(max(0.0, end() + total * 0.4 - time.monotonic())):
        return
    if not _clock["settled"] and main_thread is not None:
        _clock["fired"] = True
        _raise_in(main_thread)
    if done.wait(max(0.0, end() + total - 0.5 - time.monotonic())):
        return
    try:
        print(f"vmfuzz: the time cap of {_clock['cap']:g} s and its {total:g} s grace were spent "
              f"{_clock['phase'] or 'before the gate ended'}; ending the gate (exit 3)", file=sys.stderr, flush=True)
        if on_overrun is not None and not _clock["settled"]:
            on_overrun()
        sys.stdout.flush()
    finally:
        for proc in _clock["children"]:
            try:
                proc.kill()
            except OSError:
                pass
        remove_detached([f for f in _clock["folders"] if os.path.isdir(f)])
        os._exit(3)


def remove_detached(folders: list[str]) -> None:
    """The folders removed by a process of their own, which outlives this one: a base's scratch (about
    100 MB, thousands of files) takes seconds the grace has not got."""
    if folders:
        import subprocess
        try:
            subprocess.Popen(["rm", "-rf", "--", *folders], start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            pass


def _raise_in(thread_id: int) -> None:
    """``CapReached`` raised in the thread ``thread_id`` at its next Python instruction (CPython)."""
    import ctypes
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(CapReached))
