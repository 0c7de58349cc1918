"""The CI workflow's steps, end to end, inside a stand-in for SGLang's repository.

``examples/sglang-verify-mask-gate.yml`` runs ``vmfuzz gate --base <base>``
in the PR's checkout, against the PR's SGLang (installed editable from that
checkout). Here the checkout is a local git repo built from the installed
package (tests/sglang_repo.py) and the PR's code is put first on PYTHONPATH,
which is what an editable install of ``python/`` amounts to. A PR that brings
back the pre-#33127 ``fits`` must fail the gate with a repro; a correct change
to the same file must pass; a docs-only change must be skipped.

Skipped unless SGLang imports (``VMFUZZ_REQUIRE_SGLANG=1``: must run).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests import zygote
from tests import sglang_repo

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow

#: The gate's search kept to the arithmetic check, so a gate costs an import
#: and seconds; the saved repro/pr33127 replay (the pr profile's first step)
#: drives SGLang's real call site and kernel on the regression's case.
CHEAP = ("--property", "capacity-soundness")


@pytest.fixture(scope="module")
def repo(stand_in_checkout):
    return stand_in_checkout


def checkout_env(repo: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo / "python"), str(ROOT)]),
               TRITON_INTERPRET="1", CI="true")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    return env


#: Runs the CLI, then says where the sglang it loaded came from: proof the checkout's code ran.
CLI = ("import sys; from vmfuzz.harness.cli import main; rc = main(sys.argv[1:]); "
       "m = sys.modules.get('sglang'); print('sglang from', m and m.__file__, flush=True); sys.exit(rc)")


WORKFLOW = ROOT / "examples" / "sglang-verify-mask-gate.yml"


def workflow_gate_args(report: Path) -> list[str]:
    """The workflow's own gate command, its base branch and report folder made local."""
    # the gate step's script: its vmfuzz line, before the workflow's own handling of the exit status
    line = next(ln.strip() for ln in WORKFLOW.read_text().splitlines()
                if ln.strip().removeprefix("run: ").startswith("vmfuzz gate"))
    line = line.removeprefix("run: ").split(" || ")[0]
    args = shlex.split(line.removeprefix("vmfuzz ").replace("origin/${{ github.base_ref }}", "main"))
    return [str(report) if prev == "--report-dir" else a for prev, a in zip([None, *args], args)]


def test_workflow_installs_from_the_checkouts():
    text = WORKFLOW.read_text()
    yaml = pytest.importorskip("yaml")
    steps = yaml.safe_load(text)["jobs"]["gate"]["steps"]
    assert any("vmfuzz gate" in (st.get("run") or "") for st in steps)
    assert "pip install vmfuzz" not in text  # not on PyPI
    # vmfuzz's own scripts install it: the torch pin and dependencies are read from the project
    assert "bash .vmfuzz/scripts/bootstrap.sh" in text and "pip install torch" not in text
    assert 'install_sglang.sh --from . --python "$GITHUB_WORKSPACE/.vmfuzz/.venv/bin/python"' in text
    assert workflow_gate_args(Path("r"))[:3] == ["gate", "--target", "sglang"]


def test_install_sglang_refuses_a_folder_that_is_not_a_checkout(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "install_sglang.sh"), "--from", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not an SGLang checkout" in proc.stderr, proc.stderr


def gate(repo: Path, report: Path, *extra: str):
    proc = zygote.run([sys.executable, "-c", CLI, *workflow_gate_args(report), *extra],
                      cwd=repo, env=checkout_env(repo), timeout=600)
    return proc, proc.stdout + proc.stderr


def pull_request(repo: Path, branch: str, message: str, *changes, touch: str | None = None) -> None:
    sglang_repo.git(repo, "checkout", "-q", "-B", branch, "main")
    sglang_repo.commit(repo, message, *changes, touch=touch)


def test_regression_pr_fails_the_gate_with_a_repro(repo, tmp_path):
    pull_request(repo, "pr-regress", "verify_mask: FULL_MASK has context slack, skip the check",
                 sglang_repo.REGRESSION)
    proc, out = gate(repo, tmp_path / "report", *CHEAP)
    assert proc.returncode == 1, out
    assert f"sglang from {repo / 'python' / 'sglang'}" in out, out
    assert "Warning" not in out, out  # the import chain's warnings stay out of a gate's log
    assert "touch verify-mask code: python/sglang/srt/layers/attention/verify_mask.py" in out
    findings = sorted((tmp_path / "report" / "findings").glob("*.json"))
    assert findings, out
    repros = {p.name: json.loads(p.read_text()) for p in findings}
    replayed = repros.get("replay-pr33127-pr33127.json")
    assert replayed and replayed["target"] == "sglang" and replayed["config"]["mode"] == "FULL_MASK", repros
    assert "capacity-soundness.json" in repros, repros
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["command"] == "gate" and summary["counts"]["findings"] >= 2

    # The repro is replayable against the same checkout, and held on the pristine one.
    path = str(tmp_path / "report" / "findings" / "capacity-soundness.json")
    replay = zygote.run([sys.executable, "-c", CLI, "replay", path, "--isolate", "off"], cwd=repo,
                        env=checkout_env(repo), timeout=600)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    sglang_repo.git(repo, "checkout", "-q", "main")
    replay = zygote.run([sys.executable, "-c", CLI, "replay", path, "--isolate", "off"], cwd=repo,
                        env=checkout_env(repo), timeout=600)
    assert replay.returncode == 0, replay.stdout + replay.stderr


def test_clean_pr_passes_the_gate(repo, tmp_path):
    pull_request(repo, "pr-clean", "verify_mask: say why max_bs bounds every layout", sglang_repo.CLEAN)
    proc, out = gate(repo, tmp_path / "report", *CHEAP)
    assert proc.returncode == 0, out
    assert f"sglang from {repo / 'python' / 'sglang'}" in out, out
    assert "replay saved" in out and "pr33127.json: held" in out, out
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["counts"]["findings"] == 0 and summary["counts"]["held"] == 1


def test_docs_only_pr_is_skipped(repo, tmp_path):
    pull_request(repo, "pr-docs", "docs: speculative decoding flags", touch="docs/speculative_decoding.md")
    proc, out = gate(repo, tmp_path / "report")
    assert proc.returncode == 0, out
    assert "skipped: none of the 1 changed file(s) touches verify-mask code" in out, out
