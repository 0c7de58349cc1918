"""bench/mutation_score.py's parts that decide a mutant's fate, without running a gate.

The whole pipeline (cosmic-ray, a gate per mutant) takes a minute a mutant on
SGLang; PERFORMANCE.md records its runs. Here: a gate's exit is read as the
right outcome, the copy cosmic-ray edits is never the installed file, the
mutated file is found, and the sample stays inside the driven functions.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import mutation_kill  # noqa: E402
import mutation_score  # noqa: E402
from mutation_table import classify, killed_by, killing_properties, suspected_equivalent  # noqa: E402

pytest.importorskip("cosmic_ray")
from cosmic_ray.work_item import WorkerOutcome, WorkResult  # noqa: E402

CODE_DIFF = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-    return bs <= self.max_bs\n+    return bs < self.max_bs\n"
LOG_DIFF = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-    logger.info('a %d', 1 + 2)\n+    logger.info('a %d', 1 - 2)\n"


@pytest.mark.parametrize("output, diff, outcome", [
    ("vmfuzz-kill: exit 1 in 3s", CODE_DIFF, "killed"),
    ("vmfuzz-kill: exit 0 in 3s", CODE_DIFF, "survived"),
    ("vmfuzz-kill: exit 0 in 3s", LOG_DIFF, "suspected-equivalent"),
    ("vmfuzz-kill: exit 3 in 3s", CODE_DIFF, "out-of-step"),  # could not check: never a kill
    ("vmfuzz-kill: exit 2 in 3s", CODE_DIFF, "error"),
    ("timeout", CODE_DIFF, "timed-out"),
    ("Traceback ...", CODE_DIFF, "error"),  # the kill command itself broke: not a kill
])
def test_a_gates_exit_is_read_as_its_outcome(output, diff, outcome):
    result = WorkResult(worker_outcome=WorkerOutcome.NORMAL, output=output, diff=diff)
    assert classify(result) == outcome


def test_only_inert_lines_are_suspected_equivalent():
    assert suspected_equivalent(LOG_DIFF)
    assert not suspected_equivalent(CODE_DIFF)


def test_the_copy_cosmic_ray_edits_is_never_the_installed_file(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "a" / "b").mkdir(parents=True)
    (pkg / "a" / "b" / "m.py").write_text("x = 1\n")
    (pkg / "a" / "other.py").write_text("y = 2\n")
    (pkg / "a" / "__pycache__").mkdir()
    copy = tmp_path / "copy"
    mutation_score.mirror(pkg, copy, {Path("a/b/m.py")})
    assert not (copy / "a" / "b" / "m.py").is_symlink() and (copy / "a" / "other.py").is_symlink()
    assert not (copy / "a" / "__pycache__").exists()
    (copy / "a" / "b" / "m.py").write_text("x = 2\n")
    assert (pkg / "a" / "b" / "m.py").read_text() == "x = 1\n"

    os.chdir(tmp_path)
    (tmp_path / "python").mkdir()
    os.rename(copy, tmp_path / "python" / "sglang")
    driven = {"package": str(pkg), "files": {"a/b/m.py": ["p"], "a/other.py": ["q"]}}
    assert mutation_kill.mutated_files(driven) == ["a/b/m.py"]


def test_the_sample_stays_inside_the_driven_functions():
    src = "def f():\n    return 1\n\nclass C:\n    def g(self):\n        return 2\n\n    def h(self):\n        return 3\n"
    assert mutation_score.driven_lines(src, ["C.g"]) == [(5, 6)]
    assert mutation_score.driven_lines(src, ["f", "C.h"]) == [(1, 2), (8, 9)]
    assert mutation_score.driven_lines(src, ["", "f"]) is None  # a whole-file row: every line


def test_a_kill_by_the_mutant_raising_is_told_apart_from_a_property_s_check():
    """Read from the typed origins the kill command prints, never from finding text."""
    raised = 'vmfuzz-origin: {"effect": "raise", "exc_type": "IndexError", "property": "no-oob-write"}\n'
    checked = ('vmfuzz-origin: {"buffer": "tree_mask", "effect": "overrun", "property": "no-oob-write", '
               '"side": "above", "writer": "verify step"}\n')
    crashed = 'vmfuzz-origin: {"effect": "crash", "property": "routing"}\n'
    assert killed_by(raised) == "the mutant raising"
    assert killed_by(crashed) == "the mutant raising"
    assert killed_by(checked) == "a property's check"
    assert killed_by(raised + checked) == "a property's check"
    assert killing_properties(raised + checked + crashed) == ["no-oob-write"]
    # words that look like a finding credit nothing: only an origin does
    words = "      finding (property): out-of-bounds write on the reused buffer (bs 2)\n"
    assert killed_by(words) == "unknown" and killing_properties(words) == []


def test_a_run_with_no_output_credits_nothing():
    assert killed_by("") == "unknown" and killed_by(None) == "unknown"
    assert killing_properties("vmfuzz-kill: exit 1 in 3.0s") == []
