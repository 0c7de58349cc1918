"""The gate's time cap is the whole gate's: from its start to its exit, every phase under it.

A release diff gated on a loaded machine reported "used 309 s of a 300 s cap"
while the command took 526 s: the cap counted the search alone, not the
trigger, the base's replay, the import of the code under test, the watch's
set-up or the coverage. Here the slow phase is a plug-in whose loading sleeps
(tests/plugins.py:SlowToLoadTarget), so no test depends on this machine's speed.
"""

from __future__ import annotations

import json
import time

from tests.helpers import vmfuzz
from vmfuzz.harness.engine.core.clock import grace

SLOW_LOAD = "tests.plugins:SlowToLoadTarget"
CAP = 2.0
#: a forked CLI run's start and end, beside the gate's own time (forked from a warm interpreter)
START = 2.0


def _verdict(s: dict) -> tuple[str, str]:
    """(kind, why) of a gate's summary.json: a run's record, or the one-check record of a gate the cap
    ended before its search."""
    if isinstance(s.get("verdict"), dict):
        return s["verdict"]["kind"], s["verdict"]["why"]
    return s["verdict_kind"], s["headline"]


def _gate(tmp_path, load: float, *, hang: bool = False):
    rep = tmp_path / "rep"
    vmfuzz("--version")  # the warm interpreter the run forks from is started first, outside the timing
    began = time.monotonic()
    proc = vmfuzz("gate", "--target", SLOW_LOAD, "--property", "capacity-liveness", "--time-cap", f"{CAP:g}",
                  "--db", str(tmp_path / "db"), "--report-dir", str(rep), timeout=60,
                  env={"VMFUZZ_TEST_SLOW_LOAD": str(load), "VMFUZZ_TEST_SLOW_LOAD_HANG": "1" if hang else "0"})
    return proc, time.monotonic() - began, rep


def test_a_gate_counts_its_cap_from_its_start_and_says_could_not_check_when_a_phase_spent_it(tmp_path):
    # loading the code under test alone takes longer than the cap: no property can be checked in it
    load = CAP + 0.5
    proc, wall, rep = _gate(tmp_path, load)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert wall <= CAP + grace(CAP) + START, wall
    s = json.loads((rep / "summary.json").read_text())
    used = s["time_cap"]["used_seconds"]
    assert s["time_cap"]["reached"] and load <= used <= wall, (used, wall)  # the gate's wall, the load in it
    assert f"time: used {used:.1f} s of a {CAP:g} s cap (reached)" in proc.stdout
    kind, why = _verdict(s)
    assert kind == "could not check" and "held" not in why, why
    # every property the search could not reach says so (when the gate got that far), none held
    assert all(p["status"] == "could not check" for p in s.get("properties", [])), s["properties"]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("could not check") and "held" not in last, last


def test_a_gate_hung_in_a_phase_ends_within_its_grace_with_reports_saying_where(tmp_path):
    # one sleep that no Python-level interruption ends: the watch ends the process itself
    proc, wall, rep = _gate(tmp_path, 40.0, hang=True)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert wall <= CAP + grace(CAP) + START, wall
    s = json.loads((rep / "summary.json").read_text())
    kind, why = _verdict(s)
    assert kind == "could not check" and "while importing the code under test" in why, why
    assert s["time_cap"]["reached"] and s["time_cap"]["used_seconds"] <= wall
    assert f"the time cap of {CAP:g} s was reached" in why and "(reached)" in proc.stdout
    assert "**COULD NOT CHECK**" in (rep / "summary.md").read_text()


def test_a_search_whose_check_runs_into_the_cap_is_cut_there_never_a_hang_finding(tmp_path, monkeypatch):
    """The check in flight at the cap (a lane's, a replay's) is stopped at the cap, not at its example
    timeout, and that is could not check: no target-hang finding, no example timeout waited for."""
    from vmfuzz.harness.engine.core import clock
    from vmfuzz.harness.engine.core.isolation import IsolatedChecker
    from vmfuzz.harness.engine.search.search import run_property
    from vmfuzz.harness.model.bounds import Bounds
    from vmfuzz.harness.properties import PROPERTIES
    from vmfuzz.harness.targets import resolve
    monkeypatch.setenv("VMFUZZ_TEST_SLOW", "2")  # each allocation: longer than the cap
    target = resolve("tests.plugins:SlowTarget")
    clock.entered(process_entry=False)
    clock.start(1.0, watched=False)
    try:
        began = time.monotonic()
        with IsolatedChecker(target, 30) as check:
            res = run_property(target, PROPERTIES["capacity-liveness"], seed=1, max_examples=5, bounds=Bounds(),
                               findings_dir=tmp_path, check=check)
        assert time.monotonic() - began < 1.0 + 1.5
    finally:
        clock.stop()
    assert res.cut_short and not res.faults and res.finding is None, res
