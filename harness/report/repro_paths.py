"""The repro paths a run's summary names, and how they are written into its report folder.

summary.json, summary.md and report.html travel as one folder (a CI artifact, a
merged nightly): a repro the run wrote under that folder is named relative to it
(``findings/no-oob-write.json``), never by the runner's absolute path. A repro
elsewhere (a saved one under repro/, a known entry's) keeps the path it was given.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path


def rewrite(s: dict, new: Callable[[str | None], str | None]) -> dict:
    """``s`` with every repro path of its findings, known findings, replays' findings and groups
    passed through ``new`` (in place)."""
    for p in s.get("properties", []):
        for f in p.get("findings", []):
            f["repro"] = new(f["repro"])
    for f in s.get("findings", []):
        f["repro"] = new(f["repro"])
    for k in s.get("known_findings", []):
        k["repro"] = new(k["repro"])
    for r in s.get("replays", []):
        r["finding"] = new(r.get("finding"))
    for g in s.get("groups", []):
        g["repro"] = new(g["repro"])
        g["members"] = [new(m) for m in g.get("members", [])]
    return s


def relative_to_folder(s: dict, folder: Path) -> dict:
    """A copy of ``s`` whose repro paths under ``folder`` are relative to it."""
    base = Path(os.path.abspath(folder))

    def new(path):
        if not path:
            return path
        full = Path(os.path.abspath(path))
        return full.relative_to(base).as_posix() if full.is_relative_to(base) else path

    return rewrite(copy.deepcopy(s), new)
