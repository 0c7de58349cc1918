"""What the terminal shows: plurals, colour only on a terminal, the short classes line."""

from __future__ import annotations

import io
import json

from harness.report import terminal
from harness.report.terminal import classes_line
from tests.helpers import vmfuzz


def test_plural():
    assert terminal.plural(1, "example") == "1 example"
    assert terminal.plural(2, "example") == "2 examples"
    assert terminal.plural(1, "property", "properties") == "1 property"
    assert terminal.plural(1200, "example") == "1,200 examples"


def test_colour_only_on_a_terminal(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr("sys.stdout", Tty())
    assert terminal.paint("held") == "\033[32mheld\033[0m"
    assert terminal.paint("FAILED", width=8).startswith("\033[1;31mFAILED\033[0m  ")
    monkeypatch.setenv("NO_COLOR", "1")
    assert terminal.paint("held") == "held"
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("CI", "true")
    assert terminal.paint("FAILED", width=7) == "FAILED "


def test_classes_line_is_short_unless_verbose():
    classes = {"path reuse": 40, "path fallback": 12, "layout FULL_MASK": 30, "layout QLEN_ONLY": 22,
               "bs = max_bs+1": 9, "seq_len 0": 4, "tree with unselected parent": 2}
    short = classes_line(classes)
    assert short == "classes: 7 classes reached; reuse 40, fallback 12; FULL_MASK/QLEN_ONLY (-v: every class)"
    full = classes_line(classes, verbose=True)
    assert all(f"{k} ({v})" in full for k, v in classes.items())


def test_run_output_under_ci_is_plain_and_counts_right(tmp_path):
    r = vmfuzz("run", "--seed", "1", "--max-examples", "1", "--property", "capacity-liveness",
               "--report-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "\033[" not in r.stdout
    assert "1 example per property, 1 worker" in r.stdout
    assert "capacity-liveness held" in r.stdout and "1 properties" not in r.stdout


def test_a_run_whose_budget_ran_out_never_says_all_held(tmp_path):
    """The pr profile's budget is a safety cap: a property it reaches too late ran only its
    fixed cases, and the last line says so instead of counting it held."""
    proc = vmfuzz("run", "--profile", "pr", "--time-budget", "1", "--report-dir", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert "all " not in last and "skipped (the time budget ran out" in last, last
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    skipped = [p["name"] for p in summary["properties"] if p["status"] == "skipped"]
    assert skipped and all(name in last for name in skipped), (skipped, last)
