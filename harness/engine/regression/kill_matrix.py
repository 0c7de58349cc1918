"""The kill matrix: every catalogued known-bad variant over a target, and which property caught it.

A property set that lets a known bug through proves nothing about unknown ones.
A cell counts as a catch only when the property itself rejected the variant's
behaviour (a ``PropertyFailure`` of that property). A property the target
lacks seams for is "not driven" in that column, as in ``run``; a variant whose
seam the target lacks cannot be layered, so its whole row is not driven; a
search that ended because the target raised is "raised": the property never
judged the behaviour, so it caught nothing; one that ended on a known finding
(``known/``: upstream's defect, there without the variant too) is "known", never
the variant's catch. Every decision reads the finding's origin, never its words.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from vmfuzz.harness.engine.search.search import search_property
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.properties import PROPERTIES
from vmfuzz.harness.targets import CATALOGUE

NOT_DRIVEN = "not driven"
RAISED = "raised"
KNOWN = "known"

# A cell: examples needed to catch (int), survived (None), or why it is neither (NOT_DRIVEN, RAISED).


def caught(cell) -> bool:
    return isinstance(cell, int) and not isinstance(cell, bool)


def variant_driven(row: dict) -> bool:
    """Did any property judge the variant at all (caught it, or let it through)?"""
    return any(cell is None or caught(cell) for cell in row.values())


def _cell(res, prop_name: str, known=()):
    """One property's search over a layered target, as a kill-matrix cell."""
    if res.not_driven:
        return NOT_DRIVEN
    finding = res.finding
    if finding is None:
        return None
    if any(k.matches(finding.origin) for k in known):
        return KNOWN
    if finding.kind != "property" or finding.prop != prop_name or finding.origin.effect in ("raise", "crash",
                                                                                             "hang"):
        return RAISED
    # PropertyResult.examples already counts the failing example
    return res.examples


def kill_matrix(target, variants: list[str], *, seed: int, max_examples: int, device: str = "cpu",
                log=print, into: dict | None = None) -> dict[str, dict]:
    """variant -> property -> a cell: examples to catch, None (survived), NOT_DRIVEN or RAISED.

    Each variant's row is added to ``into`` (when given) as it finishes: an interrupted
    selftest still reports the variants it judged."""
    from vmfuzz.harness.engine.regression.known import applicable, attach, default_known_root, entries
    matrix: dict[str, dict] = {} if into is None else into
    bounds = getattr(target, "bounds", None) or Bounds()
    known = applicable(entries(default_known_root()), dict(target.versions()))
    with tempfile.TemporaryDirectory(prefix="vmfuzz-selftest-") as tmp:
        for name in variants:
            variant = CATALOGUE[name]
            if not callable(getattr(target, variant.seam, None)):
                matrix[name] = {p: NOT_DRIVEN for p in PROPERTIES}
                log(f"  {target.name}+{name}: not driven ({target.name} has no {variant.seam})")
                continue
            layered = variant.layer(target)
            attach(layered, known)  # a property meeting upstream's known defect records it and goes on
            row = {}
            for prop in PROPERTIES.values():
                res = search_property(layered, prop, seed=seed, max_examples=max_examples, bounds=bounds,
                                      findings_dir=Path(tmp) / name, device=device, rounds=False)
                row[prop.name] = _cell(res, prop.name, [k for _, k in known])
            matrix[name] = row
            by = [p for p, n in row.items() if caught(n)]
            raised = [p for p, n in row.items() if n == RAISED]
            log(f"  {layered.name}: " + (f"caught by {', '.join(by)}" if by else "SURVIVED")
                + (f" (target raised under {', '.join(raised)}: not a catch)" if raised else ""))
    return matrix
