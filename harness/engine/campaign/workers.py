"""``run --workers N``: properties spread over N worker processes that may die.

A worker can be killed from outside (the OOM killer's SIGKILL) or by the code
under test (a segfault with ``--isolate off``). A pool that breaks as a whole
on that (``concurrent.futures``' BrokenProcessPool) loses the run: every other
property and every report. Here each worker serves one property at a time over
its own pipe, so a death costs only the property that worker was on: it is
handed to ``on_death`` with the case being checked when it died (each worker
notes its case before checking it), and a new worker takes the next property.

Pipes only, no queues or semaphores: nothing is registered with
multiprocessing's resource tracker, so a tracker killed along with a worker
has nothing to complain about.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import warnings
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

import multiprocessing as mp

#: in a worker: where the property it is searching notes the case it is checking
_case_file: Path | None = None


@dataclass
class Death:
    """A worker that died while searching ``name``."""

    name: str
    reason: str
    #: (examples run, config, steps) being checked when it died; None: it died outside any check
    case: tuple | None


def remembering(check):
    """``check`` that notes each case on disk while it runs (in a worker; as is elsewhere)."""
    if _case_file is None:
        return check
    path, spare = _case_file, _case_file.with_suffix(".new")
    count = [0]

    def noted(prop, config, steps, device):
        count[0] += 1
        spare.write_bytes(pickle.dumps((count[0], config, steps)))
        os.replace(spare, path)  # whole or absent: a death mid-write leaves the previous case
        obs = check(prop, config, steps, device)
        path.unlink(missing_ok=True)  # it answered: a death from here on is not this case's
        return obs
    return noted


def _serve(conn, case_dir: str) -> None:
    """A worker's loop: ``(fn, name, args)`` in, ``("ok", result)`` or ``("raise", exc)`` out."""
    from vmfuzz.harness.engine.core.signals import die_with_parent, ignore_in_child
    ignore_in_child()  # Ctrl-C reaches the whole group: the parent stops its workers
    die_with_parent()
    from vmfuzz.harness.engine.core.isolation import end_worker, serve_tasks

    def answer(task):
        global _case_file
        fn, name, args = task
        _case_file = Path(case_dir) / f"{name}.case"
        return fn(*args)

    serve_tasks(conn, answer)
    end_worker()  # a plug-in's non-daemon thread must not keep a finished worker alive


def _dead_case(case_dir: Path, name: str) -> tuple | None:
    try:
        return pickle.loads((case_dir / f"{name}.case").read_bytes())
    except Exception:  # noqa: BLE001 - absent or unreadable: the case is not known
        return None


class _Worker:
    def __init__(self, ctx, case_dir: Path):
        from vmfuzz.harness.engine.core.signals import held
        self.conn, child = ctx.Pipe()
        # Not daemonic: a worker with --isolate on starts its own watched children.
        self.proc = ctx.Process(target=_serve, args=(child, str(case_dir)))
        with held():
            self.proc.start()
        child.close()
        self.name: str | None = None

    def stop(self, kill: bool = False) -> None:
        if kill and self.proc.is_alive():
            self.proc.kill()
        else:
            try:
                self.conn.send(None)
            except OSError:
                pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


def spread(fn, tasks: list[tuple[str, tuple]], workers: int, on_result, on_death) -> None:
    """``fn(*args)`` for each ``(name, args)`` in ``tasks``, at most ``workers`` at once.

    ``on_result(result)`` for each answer, ``on_death(Death)`` for each worker
    that died mid-task; an exception ``fn`` raised is raised here.
    """
    from vmfuzz.harness.engine.core.isolation import exit_reason
    # A killed resource tracker is restarted with a warning about leaks that cannot happen here.
    warnings.filterwarnings("ignore", message="resource_tracker", category=UserWarning)
    ctx = mp.get_context("spawn")  # plug-ins resolve by name in the worker: nothing to pickle
    todo = list(tasks)
    busy: list[_Worker] = []
    idle: list[_Worker] = []
    with tempfile.TemporaryDirectory(prefix="vmfuzz-cases-") as tmp:
        case_dir = Path(tmp)
        try:
            while todo or busy:
                while todo and len(busy) < workers:
                    w = idle.pop() if idle else _Worker(ctx, case_dir)
                    w.name, args = todo[0]
                    try:
                        w.conn.send((fn, w.name, args))
                    except OSError:  # it died while idle: its task goes to a new one
                        w.stop(kill=True)
                        continue
                    todo.pop(0)
                    busy.append(w)
                ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy])
                for w in [w for w in busy if w.conn in ready or w.proc.sentinel in ready]:
                    try:
                        kind, value = w.conn.recv()
                    except (EOFError, OSError):
                        busy.remove(w)
                        w.proc.join(5)
                        reason = exit_reason(w.proc.exitcode)
                        w.stop(kill=True)
                        on_death(Death(w.name, reason, _dead_case(case_dir, w.name)))
                        continue
                    busy.remove(w)
                    idle.append(w)
                    if kind == "raise":
                        raise value
                    on_result(value)
        finally:
            # On an interrupt or an error, no worker's search is waited for.
            for w in busy:
                w.stop(kill=True)
            for w in idle:
                w.stop()
