"""tests/properties as a way in: a failure names the case, leaves a repro, and says how to replay it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, vmfuzz


def _pytest(tmp_path, target: str, *args: str):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VMFUZZ_TARGET": target,
           "VMFUZZ_REPORT_DIR": str(tmp_path / "rep"), "VMFUZZ_MAX_EXAMPLES": "10"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "properties"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_failure_names_the_config_writes_the_repro_and_the_replay_command(tmp_path):
    proc = _pytest(tmp_path, "reference+pr33127", "-k", "no-oob-write")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "config: mode=FULL_MASK, max_bs=1, max_context_len=" in out, out
    path = tmp_path / "rep" / "findings" / "no-oob-write.json"
    assert f"replay: vmfuzz replay {path} --target reference+pr33127" in out, out
    repro = json.loads(path.read_text())
    assert repro["target"] == "reference+pr33127" and repro["property"] == "no-oob-write"
    assert [len(b["seq_lens"]) for b in repro["batches"]] == [2]  # the shrunk case, not the first one
    # the same file `vmfuzz run` would have written: replay fails on the variant, holds on the fix
    assert vmfuzz("replay", str(path), "--report-dir", str(tmp_path / "r1")).returncode == 1
    assert vmfuzz("replay", str(path), "--target", "reference", "--report-dir", str(tmp_path / "r2")).returncode == 0


@pytest.mark.slow
def test_pristine_reference_passes_and_writes_nothing(tmp_path):
    proc = _pytest(tmp_path, "reference", "-k", "no-oob-write or capacity")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (tmp_path / "rep").exists()


@pytest.mark.slow
def test_sglang_target_brings_its_bounds_budget_and_isolation(tmp_path):
    from vmfuzz.harness.targets import TargetUnavailable, resolve
    try:
        target = resolve("sglang")
    except TargetUnavailable as exc:
        if os.environ.get("VMFUZZ_REQUIRE_SGLANG") == "1":
            pytest.fail(f"VMFUZZ_REQUIRE_SGLANG=1 but the sglang target is unavailable: {exc}")
        pytest.skip(f"sglang target unavailable: {exc}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VMFUZZ_TARGET": "sglang"}
    env.pop("VMFUZZ_MAX_EXAMPLES", None)
    probe = ("import json, tests.properties.test_properties as t; "
             "print(json.dumps([t.BOUNDS.max_bs, t.BOUNDS.max_context_len, t.EXAMPLES, t.ISOLATE]))")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", probe], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == [target.bounds.max_bs, target.bounds.max_context_len, target.budget["dev"], True]
