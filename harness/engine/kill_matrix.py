"""The kill matrix: every catalogued known-bad variant over a target, and which property caught it.

A property set that lets a known bug through proves nothing about unknown ones.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from harness.engine.search import run_property
from harness.model.bounds import Bounds
from harness.properties import PROPERTIES
from harness.targets import CATALOGUE


def kill_matrix(target, variants: list[str], *, seed: int, max_examples: int, device: str = "cpu",
                log=print) -> dict[str, dict[str, int | None]]:
    """variant -> property -> examples needed to catch it (None: survived that property)."""
    matrix: dict[str, dict[str, int | None]] = {}
    with tempfile.TemporaryDirectory(prefix="vmfuzz-selftest-") as tmp:
        for name in variants:
            layered = CATALOGUE[name].layer(target)
            row = {}
            for prop in PROPERTIES.values():
                res = run_property(layered, prop, seed=seed, max_examples=max_examples, bounds=getattr(target, "bounds", None) or Bounds(),
                                   findings_dir=Path(tmp) / name, device=device)
                # PropertyResult.examples already counts the failing example
                row[prop.name] = res.examples if res.finding else None
            matrix[name] = row
            caught = [p for p, n in row.items() if n is not None]
            log(f"  {layered.name}: " + (f"caught by {', '.join(caught)}" if caught else "SURVIVED"))
    return matrix
