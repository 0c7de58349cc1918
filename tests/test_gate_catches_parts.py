"""The PR gate itself catches a bad edit to every part of the mask's path.

The per-part test files prove each alteration with ``vmfuzz run --property``;
a maintainer's PR meets ``vmfuzz gate`` instead, which chooses its own seed,
budget and properties (the pr profile). Here one alteration per part -- call
sites, chain writer, readers, packing, routers, allocation site -- goes through
the whole gate on an altered copy of the installed SGLang, with the edited
file as the PR's only change: it must exit 1, and its summary must list that
file as exercised, not merely triggered on. The pristine copy's gate, which
must pass, is tests/test_deep_corpus.py's (one whole gate less).

One part, the pp call site (#33127's own), goes through the gate with every
property it chooses. The others name the properties meant to catch them
(``--property``, as a maintainer narrows a rerun): the same pr profile, seed
and budget for each of those, at about a third of a whole gate's CPU. What the
narrowing drops is whether the other properties also see the bug, which no
assertion here is about.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import test_readers, test_routers_allocation, test_sglang_callsites_writers, test_surface_rest
from tests.sglang_copies import THROUGH_THE_GATE, altered_copy, assert_caught_by, run_on_copy


def _edits(module, name):
    spec = module.ALTERATIONS[name]
    return spec[0] if isinstance(spec, tuple) else spec


_CORE = ("no-oob-write", "fallback-equivalence", "reference-agreement", "multi-step-reuse")

#: part of the path -> (module holding its alterations, alteration, the properties meant to catch it)
PARTS = {
    "pp call site": (test_sglang_callsites_writers, "pp-fits-admits-one-more", _CORE),
    "chain writer": (test_sglang_callsites_writers, "chain-positions-off-by-one",
                     ("chain-writer", "reference-agreement", "multi-step-reuse")),
    "frozen-KV MTP call site": (test_surface_rest, "frozen-mtp-short-length-sum", _CORE),
    "eager reader": (test_readers, "eager-indptr-precedence", ("reader-agreement",)),
    "replay reader": (test_readers, "replay-indptr-slot-early", ("reader-agreement",)),
    "packing kernel": (test_readers, "pack-bit-order", ("packed-mask",)),
    "hybrid router": (test_routers_allocation, "hybrid-mask-from-decode", ("routing",)),
    "tbo router": (test_routers_allocation, "tbo-mask-from-overlap-child", ("routing",)),
    "hybrid-linear router": (test_routers_allocation, "linear-mask-from-linear-child", ("routing",)),
    "allocation site": (test_routers_allocation, "triton-allocates-max-bs-minus-one", ("allocation-soundness",)),
}


#: the part whose gate chooses every property itself
WHOLE_GATE_PART = "pp call site"


def _gate(tmp_path, site, changed_file: str, properties: tuple[str, ...] = ()):
    changed = tmp_path / "changed.txt"
    changed.write_text(f"python/sglang/{changed_file}\n")
    report = tmp_path / "report"
    narrowed = [arg for name in properties for arg in ("--property", name)]
    proc, out = run_on_copy(site, tmp_path, "gate", "--target", "sglang", "--changed-files", str(changed),
                            "--report-dir", str(report), *narrowed)
    return proc, out, json.loads((report / "summary.json").read_text())


def test_one_part_goes_through_the_whole_gate():
    assert WHOLE_GATE_PART in PARTS


def test_the_alterations_left_to_the_gate_are_the_ones_it_runs():
    """Their own modules skip what is listed in THROUGH_THE_GATE: one missing here would be run by neither."""
    assert {name for _, name, _ in PARTS.values()} == THROUGH_THE_GATE
    for module, name, _ in PARTS.values():
        assert name in module.ALTERATIONS, (module.__name__, name)


@pytest.mark.slow
@pytest.mark.parametrize("part", PARTS)
def test_the_gate_catches_a_bad_edit_to_each_part(sglang_target, part, tmp_path):
    module, name, caught_by = PARTS[part]
    edits = _edits(module, name)
    site = altered_copy(tmp_path, edits, name)
    # the file the alteration edited, as the PR's diff would list it
    pkg = site / "sglang"
    edited = sorted((Path(d) / f).relative_to(pkg).as_posix() for d, _, files in os.walk(pkg)  # links not followed
                    for f in files if not (Path(d) / f).is_symlink())
    assert edited, "the alteration edited no file"
    proc, out, summary = _gate(tmp_path, site, edited[0], () if part == WHOLE_GATE_PART else caught_by)
    assert proc.returncode == 1, out
    assert "FAILED" in proc.stdout, out
    assert_caught_by(tmp_path / "report", *caught_by, out=out)
    # Measured, not declared: the mask-path function holding the edit ran under a property. (The file
    # as a whole need not be "exercised": the finding ends its property's search, so functions after
    # the failing step may never run, and a changed-files list without a diff asks for all of them.)
    holders = _functions_holding_the_edit(edited[0], pkg, summary)
    assert holders and all(f["entered"] for f in holders.values()), (holders, summary["gate"])


def _functions_holding_the_edit(rel: str, pkg: Path, summary: dict) -> dict:
    """The gate's measured mask-path functions of ``rel`` that hold a line the alteration changed."""
    import difflib
    from importlib.util import find_spec

    from vmfuzz.harness.engine.campaign.diff_coverage import parse
    pristine = (Path(find_spec("sglang").origin).parent / rel).read_text().splitlines()
    altered = (pkg / rel).read_text()
    changed = {j + 1 for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, pristine, altered.splitlines())
               .get_opcodes() if tag != "equal" for j in range(j1, max(j2, j1 + 1))}
    functions = parse(altered).functions
    (measured,) = [f for f in summary["gate"]["lines"] if f["path"] == f"python/sglang/{rel}"]
    return {q: f for q, f in measured["functions"].items()
            if any(functions[q][0] <= n <= functions[q][1] for n in changed)}
