"""The nightly database's last-failures folder: kept across runs, and kept healthy.

A case that cannot be replayed (it is invalid, the target raises or hangs on
it) must not poison every later night: it is reported once and moved to
``DIR/quarantine/``. An interrupted run adds its findings but deletes nothing,
so a Ctrl-C during the replay never loses last night's failures.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def set_aside(db_dir: Path, outcomes: list, log=print) -> None:
    """Move the unreplayable cases of ``outcomes`` (``ReplayOutcome``) to ``db_dir/quarantine``."""
    aside = db_dir / "quarantine"
    for o in outcomes:
        if o.status != "error" and not getattr(o, "fault", None):
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


def keep_failures(db_dir: Path, outcome) -> None:
    """Replace last-failures with this run's findings (an interrupted run only adds)."""
    keep = db_dir / "last-failures"
    found = [f for r in outcome.results for f in r.findings]
    found += [o.finding for o in outcome.replays if o.finding and not getattr(o, "set_aside", None)]
    try:
        if keep.is_dir() and not outcome.interrupted:
            for old in keep.glob("*.json"):
                old.unlink()
        keep.mkdir(parents=True, exist_ok=True)
        for f in found:
            if Path(f.path).is_file():
                shutil.copy2(f.path, keep / Path(f.path).name)
    except OSError as exc:
        print(f"vmfuzz: could not update {keep}: {exc.strerror or exc} (this run's findings are in its report "
              "directory)", file=sys.stderr)
