"""A known entry's replay that was stopped, not ended, is never a finding.

On a loaded machine the replay of multi-layer-native-prepare-stale-padded-slots
was once SIGKILLed twice by the per-example timeout and then read as "fails
differently": a crash finding, exit 1, for no change. A stopped replay (its
timeout ran out, or SIGKILL came from outside) is tried once more with twice
the timeout; stopped again, it is could not check (exit 3). The slowness is a
plug-in that sleeps on the entry's batch (tests/plugins.py:SlowKnownReplayOnOldSGLang).
"""

from __future__ import annotations

import json

from tests.helpers import vmfuzz
from tests.test_groups_agree import CHANGED_ENTRY
from vmfuzz.harness.engine.regression.known import replay_known
from vmfuzz.harness.model.known_file import DIFFERENT, UNCHECKED, decode
from vmfuzz.harness.targets import resolve

SLOW = "tests.plugins:SlowKnownReplayOnOldSGLang"
TIMEOUT = 0.5


def _replayed(tmp_path, monkeypatch, sleep: float, once: bool = False):
    monkeypatch.setenv("VMFUZZ_TEST_SLOW_ELEVEN", str(sleep))
    if once:
        monkeypatch.setenv("VMFUZZ_TEST_SLOW_ONCE", str(tmp_path / "slept"))
    entry = decode(json.dumps(CHANGED_ENTRY).encode(), "changed.json")
    [o] = replay_known([(tmp_path / "changed.json", entry)], resolve(SLOW), findings_dir=None, device="cpu",
                       isolate=True, timeout=TIMEOUT)
    return o


def test_a_replay_its_timeout_stopped_once_is_tried_again_and_judged_as_on_a_quiet_machine(tmp_path, monkeypatch):
    quiet = _replayed(tmp_path, monkeypatch, 0.0)
    assert quiet.status == DIFFERENT and quiet.origin.effect == "overrun"  # the entry's repro, fast
    loaded = _replayed(tmp_path, monkeypatch, 3 * TIMEOUT, once=True)
    assert (loaded.status, loaded.origin) == (quiet.status, quiet.origin), loaded.detail
    assert not loaded.unfinished


def test_a_replay_stopped_every_time_is_could_not_check_never_a_finding(tmp_path, monkeypatch):
    o = _replayed(tmp_path, monkeypatch, 5 * TIMEOUT)
    assert o.status == UNCHECKED and o.finding is None and o.repro is None, o.detail
    assert "known entry changed" in o.unfinished and "once more with 1 s" in o.unfinished, o.unfinished


def test_a_run_whose_known_replay_never_ends_exits_3_not_1(tmp_path):
    known = tmp_path / "known"
    known.mkdir()
    (known / "changed.json").write_text(json.dumps(CHANGED_ENTRY))
    rep = tmp_path / "rep"
    r = vmfuzz("run", "--target", SLOW, "--property", "no-oob-write", "--bounds", "max_bs=2,overshoot=2",
               "--isolate", "on", "--example-timeout", "1", "--seed", "1", "--max-examples", "10",
               "--known", str(known), "--report-dir", str(rep), env={"VMFUZZ_TEST_SLOW_ELEVEN": "4"})
    assert r.returncode == 3, r.stdout + r.stderr
    s = json.loads((rep / "summary.json").read_text())
    assert s["counts"]["new_groups"] == 0 and not s["findings"], s["findings"]
    assert [k["status"] for k in s["known_findings"]] == [UNCHECKED]
    assert s["verdict"]["kind"] == "could not check" and "known entry changed" in s["verdict"]["why"]
    assert "vmfuzz: could not check: known entry changed" in r.stderr


def test_a_stopped_fault_crosses_a_process_as_itself():
    """A lane hands its faults back through a pipe: pickled, the fault stays stopped."""
    import pickle

    from vmfuzz.harness.engine.core.failures import TargetFault
    back = pickle.loads(pickle.dumps(TargetFault("target-hang", "no answer", stopped=True)))
    assert (back.kind, back.detail, back.stopped) == ("target-hang", "no answer", True)
