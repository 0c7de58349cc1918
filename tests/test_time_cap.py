"""The pr verdict is a function of the code, the seed and the cached database, never of the machine.

Every property runs its fixed example count; the time cap is only a hang guard,
and reaching it is "could not check" (exit 3) naming how far each property got,
never "held". A budget (dev, nightly) bounds a search, but one that never
searched is could-not-check too. The slowness here is a plug-in that sleeps per
allocation (tests/plugins.py:SlowTarget): no test depends on how fast this
machine is, only on the sleeps being at least as long as they say.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from tests.helpers import vmfuzz

SLOW = "tests.plugins:SlowTarget"
#: a shared pair (one search judges both) and one searched alone
PROPS = ("no-oob-write", "capacity-liveness", "trivial-path")


def _pr(tmp_path, name: str, target: str, *budget: str, slow: str = "0.02"):
    rep = tmp_path / name
    props = [a for p in PROPS for a in ("--property", p)]
    proc = vmfuzz("run", "--profile", "pr", "--target", target, *props, "--max-examples", "60", *budget,
                  "--db", str(tmp_path / "db"), "--report-dir", str(rep), env={"VMFUZZ_TEST_SLOW": slow})
    summary = json.loads((rep / "summary.json").read_text())
    return proc, summary, rep


def _counts(summary: dict) -> dict:
    return {p["name"]: (p["status"], p["examples"]) for p in summary["properties"]}


def _page_says_why(rep, last: str) -> None:
    """report.html's verdict is "could not check" and it says why, in the words of the run's last line."""
    import html
    page = html.unescape((rep / "report.html").read_text())
    assert ">could not check</span></h1>" in page and last in page, last


def _says_could_not_check(proc, summary: dict, rep) -> None:
    """Exit 3; the last line, summary.json, summary.md and junit.xml all say could not check,
    naming each cut-short property's examples of its fixed count, and none says held."""
    assert proc.returncode == 3, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("could not check: the time cap of") and "held" not in last, last
    cut = [p for p in summary["properties"] if p["status"] == "could not check"]
    assert cut and summary["counts"]["could_not_check"] == len(cut)
    # a search that ran its whole count inside the cap (beside the others, in a lane) held on it; none on fewer
    held = [p for p in summary["properties"] if p["status"] == "held"]
    assert summary["counts"]["held"] == len(held) and all(p["examples"] == p["planned"] for p in held), held
    for p in cut:
        assert p["examples"] < p["planned"] and f"{p['name']} {p['examples']}/{p['planned']} examples" in last, last
    assert summary["time_cap"]["reached"] is True
    assert "**COULD NOT CHECK**" in (rep / "summary.md").read_text()
    _page_says_why(rep, last)
    suite = ET.parse(rep / "junit.xml").getroot().find("testsuite")
    assert int(suite.get("errors")) == len(cut) and int(suite.get("failures")) == 0


@pytest.mark.slow
def test_a_pr_search_its_cap_cuts_short_could_not_check_naming_how_far_each_got(tmp_path):
    # 0.05 s an allocation: the three searches need well over 20 s, the cap is 2 s
    proc, summary, rep = _pr(tmp_path, "cut", SLOW, "--time-budget", "2", slow="0.05")
    _says_could_not_check(proc, summary, rep)
    assert {p["name"] for p in summary["properties"] if p["status"] == "could not check"} == set(PROPS)


def test_pr_time_budget_0_01_is_exit_3_never_held(tmp_path):
    proc, summary, rep = _pr(tmp_path, "tiny", "reference", "--time-budget", "0.01")
    _says_could_not_check(proc, summary, rep)


@pytest.mark.slow
def test_a_slow_machine_gets_the_fast_ones_verdict_and_counts_or_could_not_check(tmp_path):
    """Slowed down with room under its cap, pr runs exactly the fast run's examples to the
    same verdict; slowed past its cap it says could not check, never held on fewer."""
    fast, fast_summary, _ = _pr(tmp_path, "fast", "reference")
    assert fast.returncode == 0, fast.stdout + fast.stderr
    slow, slow_summary, _ = _pr(tmp_path, "slow", SLOW, "--time-budget", "600")
    assert slow.returncode == 0, slow.stdout + slow.stderr
    assert _counts(slow_summary) == _counts(fast_summary)
    assert all(p["examples"] == p["planned"] for p in slow_summary["properties"]), slow_summary["properties"]
    assert "time: used" in slow.stdout and "of a 600 s cap" in slow.stdout
    capped, capped_summary, rep = _pr(tmp_path, "capped", SLOW, "--time-budget", "3")
    _says_could_not_check(capped, capped_summary, rep)


@pytest.mark.slow
def test_a_budget_spent_before_a_search_is_could_not_check_not_held(tmp_path):
    # dev searches in rounds: a 1 s share is less than the boundary cases' sleeps (0.3 s an allocation)
    rep = tmp_path / "r"
    proc = vmfuzz("run", "--target", SLOW, "--property", "trivial-path", "--time-budget", "1",
                  "--report-dir", str(rep), env={"VMFUZZ_TEST_SLOW": "0.3"})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("could not check: the time budget of 1 s ran out") and "trivial-path" in last, last
    assert json.loads((rep / "summary.json").read_text())["properties"][0]["status"] == "could not check"
    _page_says_why(rep, last)


def test_a_budget_below_the_first_bound_step_is_never_all_0_held(tmp_path):
    rep = tmp_path / "r"
    proc = vmfuzz("run", "--target", "tests.plugins:LadderTarget", "--property", "routing", "--property",
                  "capacity-soundness", "--time-budget", "0.5", "--report-dir", str(rep))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert "held" not in last and "routing not started" in last and "capacity-soundness not started" in last, last
    summary = json.loads((rep / "summary.json").read_text())
    assert [p["status"] for p in summary["properties"]] == ["could not check"] * 2
