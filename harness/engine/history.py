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


def load(db_dir: Path) -> list[dict]:
    """The nights on record, oldest first; a line that does not parse (a hand edit) is skipped."""
    path = Path(db_dir) / NAME
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    nights = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            nights.append(rec)
    return nights


def append_night(db_dir: Path, record: dict, keep: int = KEEP) -> list[dict]:
    """Adds ``record`` and keeps the last ``keep`` nights; returns them (this one last).

    Written to a temporary file and renamed over the old one: readers never see half a file.
    A database directory that cannot be written loses the history, not the night's reports.
    """
    nights = (load(db_dir) + [record])[-keep:]
    path = Path(db_dir) / NAME
    tmp = path.with_name(f".{NAME}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(n, sort_keys=True) + "\n" for n in nights))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        print(f"vmfuzz: warning: history not kept in {path}: {exc.strerror or exc}", flush=True)
    return nights
