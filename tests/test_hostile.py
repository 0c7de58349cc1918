"""Hostile input, resource bombs and faults: every class fails closed.

Each case runs the CLI as a user would, in a subprocess under a memory cap
(RLIMIT_AS) and a timeout, and asserts the contract: the right exit code
(2 bad input, 1 a finding with its repro on disk, 130 Ctrl-C, 143 SIGTERM,
0 only when earned), exactly one stderr line for exit 2, never a traceback.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from vmfuzz.harness.model import limits
from tests import zygote

ROOT = Path(__file__).resolve().parents[1]
MEMORY_CAP = 3 << 30  # address space: RSS stays well below; a 6.9 GB bomb dies at once
TIMEOUT = 120

GOOD_REPRO = {
    "target": "reference", "property": "no-oob-write",
    "config": {"mode": "FULL_MASK", "max_bs": 1, "max_context_len": 4, "num_draft_tokens": 2,
               "topk": 1, "spec_steps": 1, "is_read": True},
    "batches": [{"seq_lens": [4, 4]}],
}
GOOD_DEPLOYMENT = {"cuda_graph_max_bs": 8, "max_running_requests": 48, "context_length": 64,
                   "num_draft_tokens": 4, "topk": 2, "spec_steps": 2}


def _cap():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _env(tmp_path, extra=None):
    return {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true", "XDG_CACHE_HOME": str(tmp_path / "cache"),
            **(extra or {})}


def vmfuzz(tmp_path, *args, timeout=TIMEOUT, env=None):
    """The CLI under the memory cap, forked from the test zygote (tests/zygote.py) with the cap applied."""
    return zygote.run([sys.executable, "-m", "vmfuzz.harness.cli", *map(str, args)], cwd=tmp_path,
                      env=_env(tmp_path, env), timeout=timeout, address_space=MEMORY_CAP)


def no_traceback(r) -> None:
    assert "Traceback" not in r.stderr and "Traceback" not in (r.stdout or ""), r.stderr[-3000:]


def refused(r, *words) -> None:
    """Exit 2, one line on stderr naming what was wrong, no traceback."""
    no_traceback(r)
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def write(tmp_path, name, data) -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def repro(**changes):
    data = json.loads(json.dumps(GOOD_REPRO))
    for key, value in changes.items():
        if key in data["config"]:
            data["config"][key] = value
        else:
            data[key] = value
    return data


def deployment(**changes):
    return {**GOOD_DEPLOYMENT, **changes}


# -- the nightly database poisons itself -------------------------------------------

@pytest.mark.slow
def test_nightly_after_one_whose_target_raised_completes_and_sets_the_case_aside(tmp_path):
    common = ["--profile", "nightly", "--time-budget", "6", "--property", "no-oob-write",
              "--db", tmp_path / "db", "--isolate", "off"]
    first = vmfuzz(tmp_path, "run", "--target", "tests.plugins:RaisingTarget", "--report-dir", tmp_path / "r1", *common)
    no_traceback(first)
    assert first.returncode == 1
    assert list((tmp_path / "db" / "last-failures").glob("*.json"))
    second = vmfuzz(tmp_path, "run", "--target", "tests.plugins:RaisingTarget", "--report-dir", tmp_path / "r2", *common)
    no_traceback(second)
    assert second.returncode == 1, second.stderr
    assert "set aside" in second.stdout
    assert list((tmp_path / "db" / "quarantine").glob("*.json"))
    summary = json.loads((tmp_path / "r2" / "summary.json").read_text())
    assert any(r["source"] == "last run" and r["status"] == "failed" for r in summary["replays"])


@pytest.mark.slow
def test_nightly_sets_aside_an_invalid_or_oversized_last_failure_and_still_earns_its_verdict(tmp_path):
    last = tmp_path / "db" / "last-failures"
    last.mkdir(parents=True)
    write(last, "bomb.json", repro(max_bs=10**12))
    write(last, "junk.json", "{not json")
    r = vmfuzz(tmp_path, "run", "--profile", "nightly", "--time-budget", "4", "--property", "capacity-liveness",
               "--db", tmp_path / "db", "--report-dir", tmp_path / "r")
    no_traceback(r)
    assert (tmp_path / "r" / "summary.json").is_file()
    assert sorted(p.name for p in (tmp_path / "db" / "quarantine").iterdir()) == ["bomb.json", "junk.json"]
    assert not list(last.glob("*.json"))


# -- false findings -----------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("running", [8193, 100_000])
def test_deployment_with_many_running_requests_holds_on_reference(tmp_path, running):
    dep = write(tmp_path, "dep.json", deployment(max_running_requests=running))
    r = vmfuzz(tmp_path, "run", "--deployment", dep, "--max-examples", "20", "--seed", "1",
               "--report-dir", tmp_path / "r")
    no_traceback(r)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "cannot write out of range" in r.stdout


@pytest.mark.slow
def test_cyclic_tree_is_refused_not_blamed_on_the_target(tmp_path):
    cyc = repro(mode="QLEN_ONLY", is_read=True, topk=2, spec_steps=3, num_draft_tokens=4,
                batches=[{"seq_lens": [4], "top_scores_index": [[2, 3, 4]], "parent_list": [[-1, 4, 2, 2, 3]]}])
    path = write(tmp_path, "cyc.json", cyc)
    refused(vmfuzz(tmp_path, "replay", path, "--isolate", "on", timeout=60), "parent_list[1]")
    refused(vmfuzz(tmp_path, "minimize", path, timeout=60), "parent_list[1]")


# -- fails open -----------------------------------------------------------------------

@pytest.mark.slow
def test_gate_never_passes_a_revision_to_git_as_an_option(tmp_path):
    target = tmp_path / "X"
    refused(vmfuzz(tmp_path, "gate", "--target", "reference", f"--base=--output={target}", "--report-dir", tmp_path / "r"), "--base")
    assert not list(tmp_path.glob("X*"))
    refused(vmfuzz(tmp_path, "gate", "--target", "reference", "--base", "no-such-revision-xyz", "--report-dir", tmp_path / "r"),
            "not a commit")


@pytest.mark.slow
def test_gate_with_an_unreadable_saved_repro_exits_2_before_the_search(tmp_path):
    root = tmp_path / "repros"
    (root / "broken").mkdir(parents=True)
    write(root / "broken", "case.json", "{\"target\": \"reference\", \x01")
    changed = write(tmp_path, "changed.txt", "python/sglang/srt/layers/attention/verify_mask.py\n")
    refused(vmfuzz(tmp_path, "gate", "--target", "reference", "--changed-files", changed, "--repro-root", root,
                   "--report-dir", tmp_path / "r"), "saved repro")
    assert not (tmp_path / "r" / "summary.md").exists()


@pytest.mark.slow
def test_junit_stays_valid_xml_when_a_finding_carries_control_characters(tmp_path):
    r = vmfuzz(tmp_path, "run", "--target", "tests.plugins:ControlCharTarget", "--property", "no-oob-write",
               "--seed", "1", "--isolate", "off", "--report-dir", tmp_path / "r")
    no_traceback(r)
    assert r.returncode == 1
    ET.parse(tmp_path / "r" / "junit.xml")  # raises on invalid XML
    assert "FAILED" in (tmp_path / "r" / "summary.md").read_text()


# -- plug-ins that are not targets ------------------------------------------------------

@pytest.mark.parametrize("spec", ["sys:exit", "builtins:exit", "os:abort", "os:system", "time:sleep",
                                  "vmfuzz.harness.cli:main", "tests.plugins:ExitOnConstruction",
                                  "tests.plugins:BadVersions"])
@pytest.mark.slow
def test_a_plugin_that_is_not_a_target_is_refused_before_anything_is_called(tmp_path, spec):
    refused(vmfuzz(tmp_path, "run", "--target", spec, "--report-dir", tmp_path / "r"), spec)


@pytest.mark.parametrize("command", [["selftest"], ["verify-policy"], ["exhaustive"],
                                     ["gate", "--changed-files", "CHANGED"]])
@pytest.mark.slow
def test_every_command_refuses_a_callable_plugin(tmp_path, command):
    changed = write(tmp_path, "changed.txt", "python/sglang/srt/layers/attention/verify_mask.py\n")
    argv = [changed if a == "CHANGED" else a for a in command]
    if command[0] != "selftest":
        argv += ["--report-dir", tmp_path / "r"]
    refused(vmfuzz(tmp_path, *argv, "--target", "sys:exit"), "sys:exit")


def test_a_saved_repro_naming_a_callable_plugin_is_refused(tmp_path):
    refused(vmfuzz(tmp_path, "replay", write(tmp_path, "r.json", repro(target="builtins:exit"))), "builtins:exit")


@pytest.mark.slow
@pytest.mark.parametrize("plugin, words", [("ExitingTarget", "SystemExit"),
                                           ("InterruptingTarget", "KeyboardInterrupt"),
                                           ("RecursingTarget", "RecursionError"),
                                           ("JunkTarget", "AttributeError")])
def test_a_plugin_that_exits_raises_recurses_or_returns_junk_is_a_finding(tmp_path, plugin, words):
    r = vmfuzz(tmp_path, "run", "--target", f"tests.plugins:{plugin}", "--property", "no-oob-write",
               "--seed", "1", "--isolate", "off", "--report-dir", tmp_path / "r")
    no_traceback(r)
    assert r.returncode == 1, r.stdout[-2000:]
    found = list((tmp_path / "r" / "findings").glob("*.json"))
    assert found and words in found[0].read_text()


@pytest.mark.slow
def test_a_plugin_that_exits_outside_a_property_check_is_exit_2_never_0(tmp_path):
    refused(vmfuzz(tmp_path, "verify-policy", "--target", "tests.plugins:ExitingFits",
                   "--report-dir", tmp_path / "r"), "exit")


# -- resource bombs -------------------------------------------------------------------

@pytest.mark.parametrize("changes, words", [
    (dict(max_bs=10**12), "MAX_REQUESTS"),
    (dict(max_context_len=10**12), "MAX_CONTEXT_LEN"),
    (dict(num_draft_tokens=10**6, topk=64, spec_steps=64), "MAX_DRAFT_TOKENS"),
    (dict(topk=10**9), "MAX_TOPK"),
    (dict(spec_steps=2**63 - 1), "MAX_SPEC_STEPS"),
    (dict(max_context_len=10**9, batches=[{"seq_lens": [10**9]}]), "MAX_BUFFER_CELLS"),
    (dict(batches=[{"seq_lens": [1]}] * (limits.MAX_STEPS + 1)), "MAX_STEPS"),
    (dict(property="multi-step-reuse", max_bs=16, max_context_len=16000, num_draft_tokens=64, topk=8,
          spec_steps=8, batches=[{"seq_lens": [16000] * 16}] * 16), "MAX_CASE_CELLS"),
    (dict(max_bs=2**64), "max_bs"),
])
@pytest.mark.slow
def test_resource_bombs_in_a_repro_exit_2_naming_the_limit(tmp_path, changes, words):
    refused(vmfuzz(tmp_path, "replay", write(tmp_path, "bomb.json", repro(**changes)), timeout=60), words)


def test_a_huge_arithmetic_repro_replays_without_allocating(tmp_path):
    big = repro(property="capacity-soundness", max_bs=10**9, max_context_len=10**6,
                batches=[{"seq_lens": [0] * 1000}])
    r = vmfuzz(tmp_path, "replay", write(tmp_path, "big.json", big), timeout=60)
    no_traceback(r)
    assert r.returncode == 0 and "held capacity-soundness" in r.stdout


@pytest.mark.parametrize("changes, words", [
    (dict(max_running_requests=10**12), "MAX_REQUESTS"),
    (dict(cuda_graph_max_bs=10**12), "MAX_REQUESTS"),
    (dict(topk=10**9), "MAX_TOPK"),
])
@pytest.mark.slow
def test_resource_bombs_in_a_deployment_exit_2(tmp_path, changes, words):
    dep = write(tmp_path, "dep.json", deployment(**changes))
    refused(vmfuzz(tmp_path, "run", "--deployment", dep, "--report-dir", tmp_path / "r", timeout=60), words)


@pytest.mark.slow
def test_a_deployment_with_a_huge_context_gets_its_verdict_by_arithmetic(tmp_path):
    dep = write(tmp_path, "dep.json", deployment(context_length=10**9))
    r = vmfuzz(tmp_path, "run", "--deployment", dep, "--max-examples", "10", "--report-dir", tmp_path / "r")
    no_traceback(r)
    assert r.returncode == 0 and "not driven" in r.stdout and "cannot write out of range" in r.stdout
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert {p["name"]: p["status"] for p in summary["properties"]}["capacity-soundness"] == "held"


# -- input that is not a regular file ---------------------------------------------------

@pytest.mark.slow
def test_inputs_that_are_not_regular_files_are_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused(vmfuzz(tmp_path, "replay", "/dev/zero", timeout=30), "not a regular file")
    refused(vmfuzz(tmp_path, "minimize", fifo, timeout=30), "not a regular file")
    refused(vmfuzz(tmp_path, "run", "--deployment", tmp_path, timeout=30), "directory")
    deep = write(tmp_path, "deep.json", "[" * 100_000 + "]" * 100_000)
    refused(vmfuzz(tmp_path, "minimize", deep, timeout=30), "deep.json")
    refused(vmfuzz(tmp_path, "replay", deep, timeout=30), "deep.json")
    binary = tmp_path / "changed.bin"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    refused(vmfuzz(tmp_path, "gate", "--target", "reference", "--changed-files", binary, timeout=30), "UTF-8")


# -- unusable output places ---------------------------------------------------------------

@pytest.mark.slow
def test_unusable_output_places_are_refused_before_the_search(tmp_path):
    afile = write(tmp_path, "afile", "x")
    refused(vmfuzz(tmp_path, "run", "--report-dir", afile), "--report-dir")
    refused(vmfuzz(tmp_path, "run", "--report-dir", "/proc/vmfuzz-reports"), "--report-dir")
    refused(vmfuzz(tmp_path, "run", "--profile", "nightly", "--db", afile, "--report-dir", tmp_path / "r"), "--db")
    db = tmp_path / "db"
    db.mkdir()
    write(db, "last-failures", "x")
    refused(vmfuzz(tmp_path, "run", "--profile", "nightly", "--db", db, "--report-dir", tmp_path / "r"),
            "last-failures")
    failing = write(tmp_path, "f.json", repro(target="reference+pr33127"))
    refused(vmfuzz(tmp_path, "minimize", failing, "-o", tmp_path), "directory")


@pytest.mark.slow
def test_a_report_dir_that_breaks_mid_run_still_leaves_the_repro_on_disk_and_says_where(tmp_path):
    reports = tmp_path / "r"
    r = vmfuzz(tmp_path, "run", "--target", "tests.plugins:BreaksReportDir+pr33127", "--property", "no-oob-write",
               "--seed", "3", "--isolate", "off", "--report-dir", reports,
               env={"VMFUZZ_TEST_BREAK_DIR": str(reports)})
    no_traceback(r)
    assert r.returncode == 1, r.stderr
    said = [line.split("the repro is at ")[1] for line in r.stderr.splitlines() if "the repro is at " in line]
    assert said and Path(said[0]).is_file()
    assert json.loads(Path(said[0]).read_text())["property"] == "no-oob-write"


# -- Ctrl-C and SIGTERM -------------------------------------------------------------------------

def _interrupt(tmp_path, sig, args, wait_for: str, env=None):
    proc = subprocess.Popen([sys.executable, "-m", "vmfuzz.harness.cli", *map(str, args)], cwd=tmp_path,
                            env=_env(tmp_path, env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_cap)
    seen = ""
    deadline = time.monotonic() + 90
    if wait_for is None:
        time.sleep(8)  # the command prints nothing before it ends: give it time to start
    while wait_for is not None and wait_for not in seen and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    time.sleep(1.0)
    os.killpg(proc.pid, sig)  # the whole group, as a terminal's Ctrl-C does
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, seen + out, err)


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, workers", [(signal.SIGINT, 130, "1"), (signal.SIGINT, 130, "2"),
                                                (signal.SIGTERM, 143, "2")])
def test_an_interrupt_ends_with_its_code_reports_written_and_no_traceback(tmp_path, sig, code, workers):
    r = _interrupt(tmp_path, sig, ["run", "--time-budget", "120", "--workers", workers,
                                   "--report-dir", tmp_path / "r"], "vmfuzz run:")
    no_traceback(r)
    assert r.returncode == code, r.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["interrupted"] is True


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1])
def test_a_hang_up_quit_or_user_signal_ends_a_nightly_as_sigterm_does(tmp_path, sig):
    # Before: each killed the process where it stood, with no report. (Like SIGTERM's, a night cut short
    # adds to last-failures but is no night of the history: it would read as a night that reached less.)
    r = _interrupt(tmp_path, sig, ["run", "--profile", "nightly", "--time-budget", "120", "--workers", "2",
                                   "--db", tmp_path / "db", "--report-dir", tmp_path / "r"], "vmfuzz run:")
    no_traceback(r)
    assert r.returncode == 143, (r.stdout, r.stderr)
    assert f"interrupted by {sig.name}" in r.stderr, r.stderr
    for name in ("summary.json", "summary.md", "junit.xml", "report.html"):
        assert (tmp_path / "r" / name).is_file(), name
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["interrupted"] is True


@pytest.mark.slow
def test_ctrl_c_during_the_nightly_replay_keeps_last_failures(tmp_path):
    last = tmp_path / "db" / "last-failures"
    last.mkdir(parents=True)
    hang = repro(target="tests.plugins:HangingTarget")
    write(last, "hang.json", hang)
    r = _interrupt(tmp_path, signal.SIGINT, ["run", "--profile", "nightly", "--db", tmp_path / "db",
                                             "--example-timeout", "60", "--report-dir", tmp_path / "r",
                                             "--target", "tests.plugins:HangingTarget"], "vmfuzz run:")
    no_traceback(r)
    assert r.returncode == 130
    assert (last / "hang.json").is_file()
    assert (tmp_path / "r" / "summary.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_replay_is_its_signal_never_a_finding(tmp_path, sig, code):
    hang = write(tmp_path, "hang.json", repro(target="tests.plugins:HangingTarget"))
    r = _interrupt(tmp_path, sig, ["replay", hang, "--isolate", "off", "--target", "tests.plugins:HangingTarget"],
                   None)
    no_traceback(r)
    assert r.returncode == code and "FAILED" not in r.stdout, (r.stdout, r.stderr)


# -- numbers --------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["--time-budget", "nan"], "--time-budget"), (["--time-budget", "inf"], "--time-budget"),
    (["--time-budget", "0"], "--time-budget"), (["--example-timeout", "0"], "--example-timeout"),
    (["--example-timeout", "-1"], "--example-timeout"), (["--example-timeout", "nan"], "--example-timeout"),
    (["--example-timeout", "1e-9"], "--example-timeout"), (["--workers", "0"], "--workers"),
    (["--workers", "1000"], "--workers"), (["--max-examples", "0"], "--max-examples"),
    (["--seed", "-1"], "--seed"),
])
def test_bad_numbers_are_refused_in_process(tmp_path, capsys, argv, words):
    from vmfuzz.harness.cli import main
    assert main(["run", *argv, "--report-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


# -- collisions ---------------------------------------------------------------------------------------

def test_default_report_dirs_are_unique_per_run(tmp_path, monkeypatch):
    from vmfuzz.harness.report.summary import default_report_dir
    monkeypatch.chdir(tmp_path)
    first = default_report_dir()
    first.mkdir(parents=True)
    second = default_report_dir()
    assert second != first and str(os.getpid()) in first.name
    other = subprocess.run([sys.executable, "-c", "from vmfuzz.harness.report.summary import default_report_dir as d; print(d())"],
                           cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert other.stdout.strip() != str(first)


# -- pipes ----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_closed_stdout_ends_quietly_with_the_true_verdict(tmp_path):
    args = [sys.executable, "-m", "vmfuzz.harness.cli", "run", "--target", "reference+pr33127", "--seed", "1",
            "--max-examples", "10", "--property", "capacity-soundness", "--report-dir", str(tmp_path / "r")]
    proc = subprocess.Popen(args, cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_cap)
    proc.stdout.readline()
    proc.stdout.close()  # `| head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=TIMEOUT) == 1 and "Traceback" not in err and "Broken" not in err, err
    with open("/dev/full", "w") as full:
        r = subprocess.run(args[:-1] + [str(tmp_path / "r2")], cwd=ROOT, env=_env(tmp_path), stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=TIMEOUT, preexec_fn=_cap)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr


# -- mutated files (Hypothesis) ----------------------------------------------------------------------------

_junk = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                  st.text(max_size=5), st.just([]), st.just({}), st.just([[[[[]]]]]),
                  st.integers(0, 2**40), st.sampled_from([0, 1, 2, 8, 8193, 10**6, 10**12, 2**63]))


def _paths(data, prefix=()):
    yield prefix
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, prefix + (i,))


def _mutate(base, draw):
    data = json.loads(json.dumps(base))
    paths = [p for p in _paths(data) if p]
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        parent = data
        try:
            for k in path[:-1]:
                parent = parent[k]
            parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or replaced this place
        action = draw(st.sampled_from(["replace", "delete", "wrap", "repeat"]))
        old = parent[path[-1]]
        if action == "replace":
            parent[path[-1]] = draw(_junk)
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "wrap":
            parent[path[-1]] = [old]
        elif action == "repeat" and isinstance(old, list) and old:
            parent[path[-1]] = old * draw(st.sampled_from([2, 3, 100]))
    return data


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.data())
def test_mutated_repro_and_deployment_files_keep_the_contract(tmp_path_factory, data):
    from vmfuzz.harness.cli import main
    from vmfuzz.harness.model.deployment_file import DeploymentError, loads
    from vmfuzz.harness.model.validate import buffer_cells

    tmp = tmp_path_factory.mktemp("mut")
    mutated = _mutate(GOOD_REPRO, data.draw)
    path = tmp / "r.json"
    path.write_text(json.dumps(mutated))
    import contextlib
    import io
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["replay", str(path), "--isolate", "off"])
    assert time.monotonic() - t0 < 30
    assert code in (0, 1, 2), code
    assert "Traceback" not in err.getvalue()
    if code == 2:
        assert len(err.getvalue().strip().splitlines()) == 1, err.getvalue()

    dep = _mutate(GOOD_DEPLOYMENT, data.draw)
    try:
        loaded = loads(json.dumps(dep).encode())
    except DeploymentError as exc:
        assert "\n" not in str(exc)
    else:
        config = loaded.config()
        assert loaded.max_running_requests <= limits.MAX_REQUESTS
        assert buffer_cells(config) <= limits.MAX_ARITHMETIC_CELLS
        assert config.topk <= limits.MAX_TOPK and config.spec_steps <= limits.MAX_SPEC_STEPS


# -- in-process seams ------------------------------------------------------------------------------------------

def test_an_interrupt_a_library_swallowed_still_ends_the_search(tmp_path, monkeypatch):
    from vmfuzz.harness.engine.core import signals
    from vmfuzz.harness.engine.search.search import run_property
    from vmfuzz.harness.model.bounds import Bounds
    from vmfuzz.harness.properties import PROPERTIES
    from vmfuzz.harness.targets import resolve
    monkeypatch.setattr(signals, "_received", signal.SIGINT)  # the signal came; its exception was lost
    with pytest.raises(KeyboardInterrupt):
        run_property(resolve("reference"), PROPERTIES["no-oob-write"], seed=0, max_examples=5, bounds=Bounds(),
                     findings_dir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_an_error_while_generating_is_the_harness_s_never_a_finding(tmp_path):
    from hypothesis.errors import InvalidArgument

    from vmfuzz.harness.engine.search.search import run_property
    from vmfuzz.harness.model.bounds import Bounds
    from vmfuzz.harness.model.errors import HarnessError
    from vmfuzz.harness.properties import PROPERTIES
    from vmfuzz.harness.targets import resolve

    def refuse(_):
        raise InvalidArgument("a strategy that can never generate a value")

    with pytest.raises(HarnessError, match="search itself failed"):
        run_property(resolve("reference"), PROPERTIES["capacity-liveness"], seed=0, max_examples=5,
                     bounds=Bounds(), findings_dir=tmp_path, strategy=st.integers(0, 3).map(refuse))
    assert not (tmp_path / "capacity-liveness.json").exists()


def test_the_oracle_walk_ends_even_on_a_cyclic_tree_that_slipped_past_validation():
    from vmfuzz.harness.model.config import DraftTree
    from vmfuzz.harness.model.oracle import tree_facts
    cyclic = DraftTree((2, 3, 4), (-1, 4, 2, 2, 3))  # node 1 -> node 3 -> node 1 -> ...
    visible, depth, _, _ = tree_facts(cyclic, 2, 4)
    assert max(depth) <= 3
