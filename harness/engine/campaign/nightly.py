"""The nightly database's last-failures folder: kept across runs, and kept healthy.

A file that is no repro at all (it does not read, names an unknown property or
one that does not apply to its case, or is no regular file) and a case the
target raises, crashes or hangs on must not poison every later night: each is
reported once and moved to ``DIR/quarantine/``. A sound case this run could not
check (its property is not driven on this target, or vmfuzz is out of step with
it) stays, its reason said, for a night that can. An interrupted run adds its findings but deletes nothing,
so a Ctrl-C during the replay never loses last night's failures.

The folder stays bounded however many nights a failure survives: a kept case is
named by what it is (its property and a hash of its case), so replaying it again
keeps its one file, and ``DIR/nights.json`` counts the nights it has failed. Past
``MAX_LAST_FAILURES`` the least-failed cases go to quarantine, never away. Two
nightly runs sharing one database take ``DIR/.lock`` while they update it, and
each removes only the cases it replayed and saw held, so neither loses the
other's failures; every file is written to a temporary name and renamed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from vmfuzz.harness.engine.campaign.history import append_night, locked, night_record
from vmfuzz.harness.model.validate import read_input

#: kept cases past this go to quarantine (the least-failed first): a nightly replays them all
MAX_LAST_FAILURES = 64
#: the nights file: {kept file name: nights it has failed}
NIGHTS = "nights.json"


class Night:
    """A nightly's own part of a run, around what every run does: last night's failures
    replayed after the saved repros, and this night's kept (and its record added) at the end.

    The plan carries one only for a profile that replays last failures; a gate or a dev run
    has none, so the session's path for them never touches the nightly database.
    """

    def __init__(self, db_dir: Path):
        self.db_dir = db_dir

    def end_with_a_database(self) -> None:
        """The example database's folder there, even for a night whose budget ran out before any
        search (what a next night, and the CI cache that carries it, start from)."""
        path = self.db_dir / "hypothesis"
        if not os.path.lexists(path):
            path.mkdir(parents=True, exist_ok=True)

    def replay_last(self, target, plan, log, out: list) -> None:
        """Last night's failures replayed into ``out`` as they finish (an interrupt keeps those);
        always in a watched worker, since last night's case may be the one that hung."""
        from vmfuzz.harness.engine.regression.regressions import read_saved, replay_saved
        heal(self.db_dir, log)
        last = sorted((self.db_dir / "last-failures").glob("*.json"))
        last_out: list = []
        try:
            replay_saved(read_saved(last), target, source="last run", findings_dir=plan.findings_dir,
                         device=plan.device, isolate=True, timeout=plan.example_timeout,
                         check_teeth=False, out=last_out)
        finally:
            out += last_out
        set_aside(self.db_dir, last_out, log)

    def end(self, outcome, warn) -> list:
        """This night's failures kept for the next (a fixed one drops out); the night's record
        added unless it was cut short, which would read as a night that reached less. Returns
        the last nights, this one last (empty when cut short)."""
        self.end_with_a_database()
        keep_failures(self.db_dir, outcome, print)
        if outcome.interrupted:
            return []
        return append_night(self.db_dir, night_record(outcome), warn=warn)


def set_aside(db_dir: Path, outcomes: list, log=print) -> None:
    """Move the files of ``outcomes`` (``ReplayOutcome``) that are no repro, and the cases the target
    raised, crashed or hung on, to ``db_dir/quarantine``. A sound case that was not checked (not driven
    on this target, out of step) stays: another night, on a target that drives it, replays it."""
    aside = db_dir / "quarantine"
    for o in outcomes:
        if not (o.status == "error" and getattr(o, "unreadable", True)) and not getattr(o, "fault", None):
            continue
        try:
            aside.mkdir(parents=True, exist_ok=True)
            dest = aside / o.path.name
            n = 1
            while dest.exists():
                n += 1
                dest = aside / f"{o.path.stem}-{n}{o.path.suffix}"
            shutil.move(str(o.path), dest)
        except OSError as exc:
            log(f"  could not set aside {o.path}: {exc.strerror or exc}")
            continue
        o.set_aside = dest
        why = o.detail if o.status == "error" else f"{o.fault}: {o.detail}"
        log(f"  set aside {o.path.name} -> {dest} (cannot be replayed: {why})")


def keep_failures(db_dir: Path, outcome, log=None) -> None:
    """Merge this run's findings into last-failures; the replayed cases that held drop out.

    Only a replay that ran to the end and held drops its case: one out of step with
    the code, or whose property is not driven on this target, was never checked, so
    it stays in last-failures (said with its reason, and in summary.json's replays),
    however long that lasts. The cases ``set_aside`` moved to quarantine (no repro at
    all: corrupt JSON, a bad shape, an unknown property, no regular file; or a case
    the target raised, crashed or hung on) are not here to keep. An interrupted run
    only adds. A case this run did not replay (another nightly sharing the database
    kept it meanwhile) is left alone.
    """
    keep = db_dir / "last-failures"
    log = log or (lambda line: None)
    found = [f for r in outcome.results for f in r.findings]
    found += [o.finding for o in outcome.replays if o.finding and not getattr(o, "set_aside", None)]
    last_run = [o for o in outcome.replays if o.source == "last run" and not getattr(o, "set_aside", None)]
    replayed = {Path(o.path).name for o in last_run if o.status == "held"}
    for o in last_run:
        if o.status not in ("held", "failed"):
            log(f"  kept {Path(o.path).name} in last-failures: not replayed to the end ({o.status}: "
                f"{' '.join(str(o.detail).split())[:200]})")
    try:
        keep.mkdir(parents=True, exist_ok=True)
        with locked(db_dir):
            _merge(db_dir, keep, found, replayed, outcome.interrupted, log)
    except OSError as exc:
        print(f"vmfuzz: could not update {keep}: {exc.strerror or exc} (this run's findings are in its report "
              "directory)", file=sys.stderr)


def _merge(db_dir: Path, keep: Path, found: list, replayed: set, interrupted: bool, log) -> None:
    nights = _read_nights(db_dir, log)
    failing = set()
    for f in found:
        src = Path(f.path)
        if not src.is_file() or src.suffix != ".json":
            continue  # a dead worker's note without a case has nothing to replay
        body = src.read_bytes()
        name = kept_name(body, f.prop)
        if name in failing:
            continue  # the same case found twice in one night is one night
        failing.add(name)
        _write_whole(keep / name, body)
        nights[name] = nights.get(name, 0) + 1
    if not interrupted:
        for name in replayed - failing:  # replayed and held: fixed, it drops out
            (keep / name).unlink(missing_ok=True)
            nights.pop(name, None)
    _cap(db_dir, keep, nights, log)
    present = {p.name for p in keep.glob("*.json")}
    nights = {k: v for k, v in nights.items() if k in present}
    _write_whole(db_dir / NIGHTS, (json.dumps(nights, indent=2, sort_keys=True) + "\n").encode())


def kept_name(body: bytes, prop: str) -> str:
    """``PROPERTY-HASH.json``: the same case keeps the same name however often it is kept."""
    try:
        data = json.loads(body)
        what = json.dumps([data.get("property", prop), data.get("config"), data.get("batches"),
                           data.get("fault")], sort_keys=True)
    except (ValueError, AttributeError):
        what = body.decode("utf-8", "replace")
    safe = "".join(c if c.isalnum() or c in "_-" else "_" for c in (prop or "case"))[:64]
    return f"{safe}-{hashlib.sha256(what.encode()).hexdigest()[:16]}.json"


def _cap(db_dir: Path, keep: Path, nights: dict, log) -> None:
    """The least-failed cases past MAX_LAST_FAILURES go to quarantine (named, never deleted)."""
    kept = sorted(keep.glob("*.json"), key=lambda p: (-nights.get(p.name, 0), p.name))
    aside = db_dir / "quarantine"
    for path in kept[MAX_LAST_FAILURES:]:
        aside.mkdir(parents=True, exist_ok=True)
        dest = aside / path.name
        os.replace(path, dest)  # same name as in last-failures: a repeat overwrites, never piles up
        log(f"  last-failures holds more than {MAX_LAST_FAILURES} cases: moved {path.name} -> {dest}")


def _read_nights(db_dir: Path, log) -> dict:
    """The nights file, or a fresh count: a database from an older harness has none, a
    damaged one is healed (said once), never crashed on."""
    path = db_dir / NIGHTS
    if not path.exists():
        return {}
    try:
        data = json.loads(read_input(path, "the nights file"))  # a regular file only: a FIFO would block
    except (OSError, ValueError) as exc:
        log(f"  {path} could not be read ({exc}); counting nights afresh")
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) and type(v) is int for k, v in data.items()):
        log(f"  {path} is not a map of names to nights; counting nights afresh")
        return {}
    return data


def heal(db_dir: Path, log=print) -> None:
    """A database from an older harness: its last-failures names grew a ``replay-`` prefix
    each night until one was too long to replay. Each such case is renamed to its kept
    name (duplicates fold into one) before the replay."""
    keep = db_dir / "last-failures"
    if not keep.is_dir():
        return
    try:
        with locked(db_dir):
            for path in sorted(keep.glob("replay-*.json")):  # any other name is left as it is
                try:
                    body = read_input(path, "a saved failure")  # a regular file only: a FIFO would block
                    prop = json.loads(body).get("property", "")
                except (OSError, ValueError, AttributeError):
                    continue  # replay finds it unreadable and sets it aside, as for any other
                dest = keep / kept_name(body, str(prop))
                if dest.name != path.name:
                    os.replace(path, dest)
                    log(f"  renamed {path.name[:48]}... -> {dest.name} (a name from an older vmfuzz)")
    except OSError as exc:
        print(f"vmfuzz: could not tidy {keep}: {exc.strerror or exc}", file=sys.stderr)


def _write_whole(path: Path, body: bytes) -> None:
    """Whole or absent: a temporary name in the same folder, then a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(body)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
