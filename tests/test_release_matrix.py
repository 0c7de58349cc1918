"""An older SGLang release installed beside the default, and the gate run on it.

0.5.21 carries a real defect that upstream fixed in 0.5.23 (DFlash's policy
behind a router, ``known/``) and differs from 0.5.23 in the API shapes the
seams bind. The gate on it must give no false finding: exit 0, the known
finding listed, nothing else.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RELEASE = "0.5.21"

#: Not in CI's command (-m "not release"): scripts/release_matrix.sh runs this gate and run on every
#: release, 0.5.21 among them, and the nightly workflow runs that script; the binding against every
#: release's sources without installing it is tests/test_release_sources.py's, in CI.
pytestmark = [pytest.mark.slow, pytest.mark.release]


def _sh(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def old_release(tmp_path_factory):
    if not os.environ.get("VMFUZZ_REQUIRE_SGLANG"):
        pytest.skip("installs SGLang 0.5.21 (minutes): run with VMFUZZ_REQUIRE_SGLANG=1, as CI does")
    venv = tmp_path_factory.mktemp("release") / f"venv-{RELEASE}"
    env = {**os.environ, "VMFUZZ_VENV": str(venv)}
    env.pop("PYTHONPATH", None)
    for step in (["bash", "scripts/bootstrap.sh"], ["bash", "scripts/install_sglang.sh", "--version", RELEASE]):
        r = _sh(step, env, 1800)
        assert r.returncode == 0, f"{' '.join(step)}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
    return venv


def test_gate_on_an_older_release_lists_the_known_finding_and_nothing_false(old_release, tmp_path):
    changed = tmp_path / "changed.txt"
    changed.write_text("python/sglang/srt/layers/attention/verify_mask.py\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_USE_CPU_ENGINE")}
    r = _sh([str(old_release / "bin" / "vmfuzz"), "gate", "--target", "sglang", "--changed-files", str(changed),
             "--report-dir", str(tmp_path / "gate")], {**env, "CI": "true"}, 1800)
    out = r.stdout + r.stderr
    s = json.loads((tmp_path / "gate" / "summary.json").read_text())
    assert s["versions"]["sglang"] == RELEASE, s["versions"]
    assert r.returncode == 0, out
    assert s["findings"] == [], s["findings"]
    assert [p["name"] for p in s["properties"] if p["status"] in ("failed", "out of step")] == [], out
    known = {k["name"]: k["status"] for k in s["known_findings"]}
    assert known.get("dflash-policy-behind-router") == "reproduces", known
    assert "known finding (upstream's to fix, not a new cause): dflash-policy-behind-router" in out, out
