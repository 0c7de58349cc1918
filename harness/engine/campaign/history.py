"""A nightly's history: one record per night, in the database directory beside the examples.

report.html draws the last nights from it (findings, examples, bounds reached,
classes covered), so a slow drift -- a night that reaches less, a class no
longer covered -- is seen without digging up old artifacts. The file is JSON
lines, rewritten whole each night (atomic: a crash mid-write leaves the old
file) and bounded to the last ``KEEP`` nights.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

KEEP = 365
NAME = "history.jsonl"


def night_record(outcome) -> dict:
    """What one night is remembered by: counts, not paths (the report directory is gone by then)."""
    classes, reached = set(), {}
    for r in outcome.results:
        classes.update(k for k, v in r.classes.items() if v)
        for k, v in r.reached.items():
            reached[k] = max(reached.get(k, v), v)
    return {"started": outcome.started, "target": outcome.target_name,
            "groups": len(outcome.groups),
            "findings": sum(len(r.findings) for r in outcome.results) + sum(1 for o in outcome.replays if o.finding),
            "examples": sum(r.examples for r in outcome.results), "classes": len(classes),
            "context_reached": reached.get("max_context_len", 0), "bs_reached": reached.get("bs", 0),
            "bounds": (outcome.bounds_used or [{}])[-1], "seconds": round(outcome.seconds, 1)}


#: what a night's record holds, and the types report.html draws from
FIELDS = {"started": (str,), "target": (str,), "groups": (int,), "findings": (int,), "examples": (int,),
          "classes": (int,), "context_reached": (int,), "bs_reached": (int,), "bounds": (dict,),
          "seconds": (int, float)}


def _problem(rec) -> str | None:
    """Why ``rec`` is not a night's record, or None."""
    if not isinstance(rec, dict):
        return f"a {type(rec).__name__}, not a record"
    for key, types in FIELDS.items():
        if key in rec and (not isinstance(rec[key], types) or isinstance(rec[key], bool)):
            return f"{key!r} is a {type(rec[key]).__name__}"
    return None


def read_nights(path: Path) -> tuple[list[dict], str | None]:
    """The nights in the file at ``path``, oldest first, and what is wrong with it (None: nothing)."""
    from vmfuzz.harness.model.validate import LimitError, read_input
    if not os.path.lexists(path):
        return [], None
    try:
        body = read_input(path, "history")  # a regular file only: a FIFO would block the night's end
        text = body.decode("utf-8")
    except LimitError as exc:
        return [], str(exc)
    except UnicodeDecodeError as exc:
        text, bad = body.decode("utf-8", errors="replace"), f"byte {exc.start} is not UTF-8"
    else:
        bad = None
    nights = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            bad = bad or f"line {n} is not JSON"
            continue
        why = _problem(rec)
        if why:
            bad = bad or f"line {n}: {why}"
            continue
        nights.append(rec)
    return nights, bad


def load(db_dir: Path, warn=print) -> list[dict]:
    """The nights on record, oldest first. A damaged file (a bad byte, a line that is not a night's
    record) is set aside beside it, said once through ``warn``; its readable nights are kept."""
    path = Path(db_dir) / NAME
    nights, bad = read_nights(path)
    if bad is None:
        return nights
    aside = path.with_name(f"{NAME}.damaged-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    try:
        os.replace(path, aside)
        where = f"set aside as {aside}"
    except OSError as exc:
        where = f"could not be set aside ({exc.strerror or exc}): it will be rewritten"
    warn(f"history {path} is damaged ({bad}); {where}; kept its {len(nights)} readable night(s)")
    return nights


LOCK = ".lock"


def lock_problem(db_dir: Path) -> str | None:
    """Why ``DIR/.lock`` cannot be the database's lock (it is there and no regular file), or None.

    A FIFO there would block the lock's open for ever (and a blocked open outlives SIGTERM's
    stop): the plan refuses such a database before any work, and ``locked`` never opens one."""
    path = Path(db_dir) / LOCK
    try:
        st = os.lstat(path)
    except OSError:
        return None  # absent (made on first use) or unreadable: ``locked`` says which
    if stat.S_ISREG(st.st_mode):
        return None
    kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a symbolic link" if stat.S_ISLNK(st.st_mode)
            else "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file")
    return f"the database's lock {path} is {kind}, not a regular file: the database cannot be locked (remove it)"


class locked:
    """An exclusive ``flock`` on ``DIR/.lock`` while the database is updated: a second
    nightly waits for the first's update instead of interleaving with it. Anything there but
    a regular file is an OSError naming it, never opened (a FIFO would block the open)."""

    def __init__(self, db_dir: Path):
        self.path = Path(db_dir) / LOCK

    def __enter__(self):
        import fcntl
        bad = lock_problem(self.path.parent)
        if bad:
            raise OSError(bad)
        # put there since the check: a FIFO fails the non-blocking open (or fstat), a link the no-follow
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(f"the database's lock {self.path} is not a regular file")
        self.fh = os.fdopen(fd, "a")
        fcntl.flock(self.fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        self.fh.close()  # closing releases the lock
        return False


def append_night(db_dir: Path, record: dict, keep: int = KEEP, warn=print) -> list[dict]:
    """Adds ``record`` and keeps the last ``keep`` nights; returns them (this one last).

    Read, set aside when damaged, and rewritten under the database's lock: two nightlies
    ending together would otherwise each rewrite the file from what it read, and one night
    would be lost. Written to a temporary file and renamed over the old one: readers never
    see half a file. A database directory that cannot be written loses the history, not
    the night's reports.
    """
    path = Path(db_dir) / NAME
    tmp = path.with_name(f".{NAME}.{os.getpid()}.tmp")
    nights = [record]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked(db_dir):
            nights = (load(db_dir, warn) + [record])[-keep:]
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write("".join(json.dumps(n, sort_keys=True) + "\n" for n in nights))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        warn(f"history not kept in {path}: {exc.strerror or exc}")
    return nights
