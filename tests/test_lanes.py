"""Lanes: a fixed-count search spread over processes forked after the target loaded.

The scheduler is tested with fake searches, as pytest-xdist tests its schedulers
with fake nodes; a run through the CLI shows lanes change no verdict and no count.
"""

from __future__ import annotations

import json
import os
import resource
import sys

import pytest

from tests.helpers import vmfuzz
from vmfuzz.harness.engine.core.stack_room import roomy
from vmfuzz.harness.engine.search.lanes import Lanes, lanes_available


def _search(slot):
    if slot == ["dies"]:
        os._exit(7)
    if slot == ["raises"]:
        raise ValueError("the search's own error")
    return [(name, os.getpid()) for name in slot]


def _run(slots, count=2):
    got, lost = [], []
    lanes = Lanes(_search, count)
    lanes.run(slots, got.extend, lambda slot, why: lost.append((slot, why)))
    return lanes, got, lost


def test_every_slot_is_searched_once_across_the_lanes():
    slots = [["a", "b"], ["c"], ["d"], ["e"], ["f"]]
    lanes, got, lost = _run(slots)
    assert sorted(n for n, _ in got) == ["a", "b", "c", "d", "e", "f"] and not lost
    pids = {pid for _, pid in got}
    assert len(pids) == 2 and os.getpid() not in pids  # two lanes, neither of them this process
    assert lanes.busy_seconds > 0


def test_a_lane_that_dies_loses_its_slot_alone():
    lanes, got, lost = _run([["dies"], ["b"], ["c"], ["d"]])
    assert sorted(n for n, _ in got) == ["b", "c", "d"]
    assert lost == [(["dies"], "its search lane died: exited with status 7")]


def test_the_searchs_own_error_is_raised_here():
    with pytest.raises(ValueError, match="the search's own error"):
        _run([["a"], ["raises"], ["c"]])


def test_every_lane_gone_leaves_the_rest_lost_not_held():
    lanes, got, lost = _run([["dies"], ["dies"], ["c"]], count=2)
    assert [slot for slot, _ in lost] == [["dies"], ["dies"], ["c"]] and not got
    assert lost[-1][1] == "no search lane left"


def _orphaning_search(slot):
    """A lane whose watched checker is running when the lane is killed (the OOM killer's pick): the
    checker, forked from the lane, holds the lane's end of its pipe."""
    if slot == ["killed"]:
        import signal
        from vmfuzz.harness.engine.core.isolation import IsolatedChecker
        from vmfuzz.harness.targets import resolve
        checker = IsolatedChecker(resolve("reference"))
        checker._start()
        with open(os.environ["VMFUZZ_TEST_CHECKER_PID"], "w") as f:
            f.write(str(checker._proc.pid))
        os.kill(os.getpid(), signal.SIGKILL)
    if slot == ["forever"]:
        import time
        time.sleep(600)
    return [(name, os.getpid()) for name in slot]


def _gone(pid: int, within: float) -> bool:
    import time
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds processes through /proc")
def test_a_killed_lane_loses_its_slot_at_once_and_its_checker_dies_with_it(tmp_path, monkeypatch):
    """Before: the lane's checker held its pipe, so the run waited on a dead lane past its cap."""
    import time
    pid_file = tmp_path / "checker.pid"
    monkeypatch.setenv("VMFUZZ_TEST_CHECKER_PID", str(pid_file))
    got, lost = [], []
    t0 = time.monotonic()
    Lanes(_orphaning_search, 2).run([["killed"], ["b"]], got.extend, lambda slot, why: lost.append((slot, why)))
    assert time.monotonic() - t0 < 60
    assert lost == [(["killed"], "its search lane died: killed by signal SIGKILL")]
    assert [n for n, _ in got] == ["b"]
    assert _gone(int(pid_file.read_text()), within=20), "the killed lane's checker lives on"


def test_a_lane_still_searching_at_the_runs_cap_is_killed_and_its_slot_lost():
    import time
    got, lost = [], []
    t0 = time.monotonic()
    lanes = Lanes(_orphaning_search, 2, deadline=time.monotonic() + 3)
    lanes.run([["forever"], ["b"], ["c"]], got.extend, lambda slot, why: lost.append((slot, why)))
    assert time.monotonic() - t0 < 30
    assert sorted(n for n, _ in got) == ["b", "c"]
    assert lost == [(["forever"], "its search lane was still searching past the run's cap, and was killed")]


def test_a_lost_lane_stops_the_gate_whatever_the_change_touches():
    """A slot whose lane was lost was never searched: exit 3, never a warning for an untouched file."""
    from types import SimpleNamespace

    from vmfuzz.harness.engine.campaign.watch import out_of_step_coverage
    from vmfuzz.harness.engine.search.results import PropertyResult
    why = "search lane in vmfuzz: its search lane died: killed by signal SIGKILL; not checked"
    lost = PropertyResult("chain-writer", out_of_step=why, lane_lost=True)
    other = PropertyResult("routing", out_of_step="route in tbo_backend.py: gone")
    outcome = SimpleNamespace(results=[lost, other], out_of_step=[("chain-writer", why), ("routing", other.out_of_step)])
    cov = out_of_step_coverage(["docs/speculative_decoding.md"], outcome)
    assert cov["out_of_step"] == [f"{why} (chain-writer: its search was lost, whatever the change touched)"]
    assert len(cov["warnings"]) == 1 and cov["warnings"][0].startswith("routing could not be checked")


def test_lanes_available_follows_the_setting_and_the_cores(monkeypatch):
    monkeypatch.setenv("VMFUZZ_LANES", "1")
    assert lanes_available() == 1
    monkeypatch.setenv("VMFUZZ_LANES", "3")
    assert lanes_available() == 3
    monkeypatch.delenv("VMFUZZ_LANES")
    assert 1 <= lanes_available() <= min(2, len(os.sched_getaffinity(0)))


def test_the_heaviest_search_starts_first(tmp_path):
    from types import SimpleNamespace

    from vmfuzz.harness.engine.campaign.parallel import lane_slots
    from vmfuzz.harness.targets import resolve
    plan = SimpleNamespace(profile=SimpleNamespace(rounds=False), isolate=True, device="cpu", deployment=None,
                           share=True)
    names = ["no-oob-write", "fallback-equivalence", "trivial-path", "routing", "allocation-soundness"]
    os.environ["VMFUZZ_LANES"] = "2"
    try:
        slots = lane_slots(plan, resolve("reference"), names)
        assert slots[0] == ["routing"] and slots[-1] == ["trivial-path"]
        assert ["no-oob-write", "fallback-equivalence"] in slots  # a shared run stays one search
        # a deployment-scoped search keeps each property's own cases: nothing shares, so each is a slot
        plan.deployment = object()
        assert sorted(lane_slots(plan, resolve("reference"), names)) == sorted([n] for n in names)
        plan.deployment = None
        plan.profile.rounds = True  # a budgeted search keeps one process
        assert lane_slots(plan, resolve("reference"), names) is None
    finally:
        del os.environ["VMFUZZ_LANES"]


def _summary_without_times(report_dir):
    data = json.loads((report_dir / "summary.json").read_text())
    return {p["name"]: (p["status"], p["examples"], sorted(p.get("classes", {})))
            for p in data["properties"]}, data["kernel"], data["counts"]


@pytest.mark.slow
def test_lanes_change_no_verdict_and_no_count(tmp_path):
    runs = {}
    for lanes in ("1", "2"):
        out = tmp_path / lanes
        proc = vmfuzz("run", "--target", "reference", "--profile", "pr", "--isolate", "on",
                      "--report-dir", str(out), "--db", str(tmp_path / f"db{lanes}"),
                      env={**os.environ, "VMFUZZ_LANES": lanes})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs[lanes] = _summary_without_times(out)
    (one, kernel_one, counts_one), (two, kernel_two, counts_two) = runs["1"], runs["2"]
    assert one == two and counts_one == counts_two
    assert "lanes" not in kernel_one and kernel_two["lanes"] == 2


_CHUNK_PROBE = """
import json, resource, sys
from vmfuzz.harness.engine.core.stack_room import roomy

def leaf():
    return 1

def loop():
    for _ in range(3000):
        leaf()

def at_depth(d, fn):
    return fn() if d == 0 else at_depth(d - 1, fn)

def faults(fn):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

def plain(d):
    return faults(lambda: at_depth(d, loop))

def through_roomy(d):
    return faults(lambda: roomy(at_depth, d, loop))

json.dump({"plain": max(map(plain, range(300))), "roomy": max(map(through_roomy, range(250)))}, sys.stdout)
"""


@pytest.mark.skipif(sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11),
                    reason="the frame-chunk stack is CPython 3.11's")
def test_a_hot_loop_across_a_frame_chunks_end_maps_no_pages_under_roomy():
    """Measured in a plain interpreter (pytest's own machinery moves where the chunks end)."""
    import subprocess
    proc = subprocess.run([sys.executable, "-c", _CHUNK_PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    # Within a chunk's worth of depth (about 136 of these frames) leaf's frame lands across the
    # chunk's end: every call maps a chunk, and touching it faults.
    assert got["plain"] >= 3000, got
    # Through roomy, no depth of about as wide a range reaches its chunk's end.
    assert got["roomy"] < 100, got
    assert roomy(lambda a, b: a + b, 2, 3) == 5


def test_the_roomy_frame_is_big_enough_for_a_chunk_of_its_own():
    from vmfuzz.harness.engine.core import stack_room
    built = stack_room._build()
    assert built(lambda *a: sum(a), 1, 2, 3) == 6
    # over 32 KiB of locals: CPython 3.11 rounds such a frame's chunk up to 64 KiB
    assert built.__code__.co_nlocals * 8 > 32 * 1024
