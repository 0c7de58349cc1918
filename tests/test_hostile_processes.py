"""Processes as an operator meets them: a plug-in that leaves a thread running,
a worker the OOM killer ends, a resource tracker killed along with it.

Each runs the CLI in a subprocess with real signals and a real non-daemon thread
and holds the contract: the run ends once its reports are written, with its
true verdict (or 130 on Ctrl-C), a dead worker's property is a ``target-crash``
finding, and no multiprocessing traceback reaches the user.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_hostile import ROOT, TIMEOUT, _cap, _env, _interrupt, no_traceback, vmfuzz

LEAVER = "tests.plugins:ThreadLeavingTarget"
KILLER = "tests.plugins:KillingTarget"


def _reports(report_dir) -> dict:
    for name in ("summary.json", "summary.md", "junit.xml", "report.html"):
        assert (report_dir / name).is_file(), name
    return json.loads((report_dir / "summary.json").read_text())


def _status(summary: dict) -> dict:
    return {p["name"]: p["status"] for p in summary["properties"]}


@pytest.mark.slow
@pytest.mark.parametrize("target, prop, workers, isolate, code", [
    (LEAVER, "capacity-liveness", "1", "off", 0),
    (LEAVER + "+pr33127", "no-oob-write", "1", "off", 1),
    (LEAVER + "+pr33127", "no-oob-write", "2", "on", 1),  # each worker watches its own isolated child
])
def test_a_plugin_thread_does_not_keep_a_finished_run_alive(tmp_path, target, prop, workers, isolate, code):
    # Before: every property printed "held" and the process never exited.
    r = vmfuzz(tmp_path, "run", "--target", target, "--property", prop, "--property", "capacity-soundness",
               "--seed", "1", "--max-examples", "10", "--workers", workers, "--isolate", isolate,
               "--report-dir", tmp_path / "r", timeout=TIMEOUT)
    no_traceback(r)
    assert r.returncode == code, (r.stdout[-2000:], r.stderr[-2000:])
    assert _status(_reports(tmp_path / "r"))[prop] == ("held" if code == 0 else "failed")


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_with_a_plugin_thread_alive_ends_130_with_the_reports(tmp_path, workers):
    r = _interrupt(tmp_path, signal.SIGINT, ["run", "--target", LEAVER, "--time-budget", "120", "--isolate", "off",
                                             "--workers", workers, "--report-dir", tmp_path / "r"], "vmfuzz run:")
    no_traceback(r)
    assert r.returncode == 130, r.stderr
    assert _reports(tmp_path / "r")["interrupted"] is True


def _killed_worker_run(tmp_path, props, kill_tracker=False):
    """``run --workers 2`` on a target that SIGKILLs its own process; optionally the
    resource tracker is SIGKILLed as soon as it is up."""
    args = [sys.executable, "-m", "vmfuzz.harness.cli", "run", "--target", KILLER, "--seed", "1", "--max-examples", "30",
            "--workers", "2", "--isolate", "off", "--report-dir", str(tmp_path / "r")]
    for p in props:
        args += ["--property", p]
    proc = subprocess.Popen(args, cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=_cap)
    deadline = time.monotonic() + 60
    while kill_tracker and time.monotonic() < deadline:
        ps = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(proc.pid)], capture_output=True, text=True)
        tracker = [int(line.split()[0]) for line in ps.stdout.splitlines() if "resource_tracker" in line]
        if tracker:
            subprocess.run(["kill", "-KILL", str(tracker[0])])
            break
        time.sleep(0.1)
    else:
        assert not kill_tracker, "the resource tracker never started"
    out, err = proc.communicate(timeout=TIMEOUT)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.mark.slow
@pytest.mark.parametrize("kill_tracker", [False, True])
def test_a_worker_killed_by_sigkill_is_a_target_crash_finding_and_the_run_goes_on(tmp_path, kill_tracker):
    # Before: "vmfuzz: failed: BrokenProcessPool", exit 2, no reports, the other properties never reported.
    props = ["no-oob-write", "capacity-soundness", "capacity-liveness"]
    r = _killed_worker_run(tmp_path, props, kill_tracker)
    no_traceback(r)
    assert "BrokenProcessPool" not in r.stderr and "KeyError" not in r.stderr, r.stderr
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
    summary = _reports(tmp_path / "r")
    assert _status(summary) == {"no-oob-write": "failed", "capacity-soundness": "held", "capacity-liveness": "held"}
    crashes = [f for f in summary["findings"] if f["kind"] == "target-crash"]
    assert [f["property"] for f in crashes] == ["no-oob-write"], summary["findings"]
    assert "SIGKILL" in crashes[0]["detail"]
    # The case it died on is the repro, and it still kills the code under test.
    again = vmfuzz(tmp_path, "replay", str(tmp_path / "r" / crashes[0]["repro"]), "--target", KILLER)
    assert again.returncode == 1 and "target-crash" in again.stdout, (again.stdout, again.stderr)


def test_a_case_noted_while_it_runs_is_gone_once_it_answered(tmp_path, monkeypatch):
    """A worker notes the case it checks so the parent can name it if the worker dies;
    a case that answered is no longer "the case it died on"."""
    import pickle

    from vmfuzz.harness.engine.campaign import workers
    monkeypatch.setattr(workers, "_case_file", tmp_path / "p.case")
    seen = []

    def check(prop, config, steps, device):
        seen.append(pickle.loads((tmp_path / "p.case").read_bytes()))
        return "observation"

    assert workers.remembering(check)("prop", "config", ["step"], "cpu") == "observation"
    assert seen == [(1, "config", ["step"])] and not (tmp_path / "p.case").exists()


@pytest.mark.slow
def test_a_run_killed_by_sigkill_leaves_no_worker_searching(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "vmfuzz.harness.cli", "run", "--time-budget", "120", "--workers", "2",
                             # workers that would search on for the whole budget: hung past max_bs
                             "--target", "tests.plugins:HangingTarget", "--isolate", "off", "--report-dir", str(tmp_path / "r")], cwd=tmp_path, env=_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=_cap)
    assert "vmfuzz run:" in proc.stdout.readline()
    workers, deadline = [], time.monotonic() + 240  # the saved repros replay first
    while len(workers) < 2 and time.monotonic() < deadline:
        ps = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(proc.pid)], capture_output=True, text=True)
        workers = [int(line.split()[0]) for line in ps.stdout.splitlines() if "spawn_main" in line]
        time.sleep(0.2)
    assert len(workers) == 2, (ps.stdout, proc.poll())
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _running(workers) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _running(workers), "workers went on searching after their run was killed"


def _running(pids) -> list[int]:
    """Those of ``pids`` still running (a zombie waiting to be reaped has ended)."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            alive.append(pid)
    return alive


_HOLDER = ("import sys, time; from pathlib import Path; from vmfuzz.harness.model.report_claim import claim; "
           "Path(sys.argv[1]).mkdir(parents=True, exist_ok=True); claim(Path(sys.argv[1])); "
           "print('held', flush=True); time.sleep(120)")


@pytest.mark.parametrize("command", [
    ["run", "--target", "reference", "--property", "capacity-soundness", "--max-examples", "3", "--isolate", "off"],
    ["surface", "--target", "reference"],
])
def test_a_report_folder_another_run_holds_is_refused_and_free_once_it_ends(tmp_path, command):
    """Two runs started on one new --report-dir: the second is refused before any work (exit 2,
    one line), whatever the folder holds; once the first ends, however it ended, the folder is free."""
    from tests.test_hostile import refused
    report = tmp_path / "report"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(report)], env=_env(tmp_path), cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = vmfuzz(tmp_path, *command, "--report-dir", report)
        refused(r, "--report-dir", "in use by another vmfuzz run", f"pid {holder.pid}")
        assert sorted(p.name for p in report.iterdir()) == [".vmfuzz-claim"]
    finally:
        holder.kill()
        holder.wait()
    r = vmfuzz(tmp_path, *command, "--report-dir", report)
    no_traceback(r)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (report / "summary.json").is_file()
