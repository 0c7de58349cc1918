"""The gate tests the code under review: the SGLang checkout it runs in, not the installed SGLang.

A contributor runs ``vmfuzz gate --target sglang --base main`` inside their
SGLang checkout, with nothing on PYTHONPATH pointing at it (here PYTHONPATH
holds only this harness, the way an installed vmfuzz would be found). The
installed SGLang is correct, so a gate that tested it would pass a branch that
plants ``fits: bs <= max_bs + 1``; the gate must fail that branch, on the
checkout's code, in the spawned workers too, and say which code it tested. A
checkout whose SGLang cannot be the one loaded is a refusal: exit 2, one line; one
whose SGLang does not import could not be checked: exit 3, and its reports say so.

The stand-in checkout is built from the installed package (tests/sglang_repo.py).
Skipped unless SGLang imports (``VMFUZZ_REQUIRE_SGLANG=1``: must run).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from vmfuzz.harness.engine.campaign.changes import sglang_checkout
from tests import zygote
from tests import sglang_repo

ROOT = Path(__file__).resolve().parent.parent

#: Off by one: a batch one request past the captured max_bs reuses the buffer.
OFF_BY_ONE = ("python/sglang/srt/layers/attention/verify_mask.py",
              r"(\n\s+return bs <= self\.max_bs)\n", r"\1 + 1\n")

#: Runs the CLI, then says where the sglang it loaded came from (None: never imported).
CLI = ("import sys; from vmfuzz.harness.cli import main; rc = main(sys.argv[1:]); "
       "m = sys.modules.get('sglang'); print('sglang from', m and m.__file__, flush=True); sys.exit(rc)")

#: The same, after an SGLang from elsewhere was imported first (a stub: importing it is free).
PREIMPORTED = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import sglang; " + CLI)


@pytest.fixture(scope="module")
def repo(stand_in_checkout):
    return stand_in_checkout


def harness_only_env() -> dict:
    """PYTHONPATH names the harness alone: nothing points Python at the checkout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1", CI="true")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    return env


def gate(repo: Path, report: Path, *extra: str, program: str = CLI, before: tuple[str, ...] = (),
         change: tuple[str, ...] = ("--base", "main"), cwd: Path | None = None):
    """The gate run from inside the checkout (or from ``cwd``, pointed at it with ``--repo``)."""
    cmd = [sys.executable, "-c", program, *before, "gate", "--target", "sglang", *change,
           "--report-dir", str(report), *extra]
    proc = zygote.run(cmd, cwd=cwd or repo, env=harness_only_env(), timeout=900)
    return proc, proc.stdout + proc.stderr


def branch(repo: Path, name: str, message: str, *changes, touch: str | None = None) -> None:
    sglang_repo.git(repo, "checkout", "-q", "-B", name, "main")
    sglang_repo.commit(repo, message, *changes, touch=touch)


def checkout_package(repo: Path) -> str:
    return str(repo / "python" / "sglang")


@pytest.mark.slow
def test_the_gate_fails_a_regression_planted_in_the_checkout(repo, tmp_path):
    branch(repo, "pr-off-by-one", "verify_mask: one request of slack", OFF_BY_ONE)
    # Two properties over two spawned workers: capacity-soundness is searched in a
    # worker process, which must import the checkout's code too to see the bug.
    proc, out = gate(repo, tmp_path / "report", "--property", "capacity-soundness",
                     "--property", "capacity-liveness", "--workers", "2")
    assert proc.returncode == 1, out
    assert f"sglang from {checkout_package(repo)}" in out, out
    assert "code under test: sglang" in out and f"from {checkout_package(repo)} (the checkout at {repo})" in out, out
    findings = {p.name for p in (tmp_path / "report" / "findings").glob("*.json")}
    assert "capacity-soundness.json" in findings, (findings, out)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["versions"]["sglang path"] == checkout_package(repo), summary["versions"]
    assert summary["gate"]["checkout"] == str(repo), summary["gate"]
    # the saved pr33127 repros replay on SGLang's real call site and kernel: one request past
    # max_bs writes past the reused buffer
    assert "no-oob-write" in {f["property"] for f in summary["findings"]}, summary["findings"]
    failed = {p["name"] for p in summary["properties"] if p["status"] == "failed"}
    assert failed == {"capacity-soundness"}, summary["properties"]  # liveness still holds: fits is not stricter
    md = (tmp_path / "report" / "summary.md").read_text()
    assert f"from `{checkout_package(repo)}` (the checkout at `{repo}`)" in md, md


#: The checkout's own version, which the installed distribution's metadata (0.5.x) does not know.
DEV_VERSION = ("python/sglang/_version.py", r"__version__ = version = '[^']*'",
               "__version__ = version = '0.0.0+checkout'")


@pytest.mark.slow
def test_the_gate_passes_the_good_revision_of_the_checkout(repo, tmp_path):
    branch(repo, "pr-clean", "verify_mask: say why max_bs bounds every layout", sglang_repo.CLEAN, DEV_VERSION)
    proc, out = gate(repo, tmp_path / "report", "--property", "capacity-soundness")
    assert proc.returncode == 0, out
    assert f"sglang from {checkout_package(repo)}" in out, out
    assert "code under test: sglang 0.0.0+checkout from" in out, out
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["versions"]["sglang path"] == checkout_package(repo), summary["versions"]
    assert summary["versions"]["sglang"] == "0.0.0+checkout", summary["versions"]
    assert summary["counts"]["findings"] == 0 and summary["counts"]["held"] == 1, summary["counts"]


@pytest.mark.slow
def test_a_checkout_whose_sglang_does_not_import_could_not_be_checked_and_says_so_in_every_report(repo, tmp_path):
    branch(repo, "pr-broken", "verify_mask: comment, and a half-finished refactor",
           sglang_repo.CLEAN, sglang_repo.BREAKS_IMPORT)
    # Pointed at with --repo from elsewhere: the checkout is the code under test all the same.
    listed = tmp_path / "changed.txt"
    listed.write_text("python/sglang/__init__.py\npython/sglang/srt/layers/attention/verify_mask.py\n")
    proc, out = gate(repo, tmp_path / "report", "--property", "capacity-soundness",
                     change=("--changed-files", str(listed), "--repo", str(repo)), cwd=tmp_path)
    assert proc.returncode == 3, out
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"cannot load the code under test: the SGLang checkout at {repo} does not import" in proc.stderr, proc.stderr
    assert "half-finished refactor" in proc.stderr and "install_sglang" not in proc.stderr, proc.stderr
    assert "out of step" not in out, out  # not vmfuzz's fault
    report = tmp_path / "report"
    s = json.loads((report / "summary.json").read_text())
    assert (s["verdict"], s["verdict_kind"], s["exit_code"]) == ("could not check", "cannot load", 3), s
    assert "COULD NOT CHECK" in (report / "summary.md").read_text().splitlines()[0]
    assert "<title>vmfuzz sglang: could not check" in (report / "report.html").read_text()
    assert 'errors="1"' in (report / "junit.xml").read_text()


@pytest.mark.slow
def test_an_sglang_imported_from_elsewhere_first_is_refused(repo, tmp_path):
    stub = tmp_path / "elsewhere"
    (stub / "sglang").mkdir(parents=True)
    (stub / "sglang" / "__init__.py").write_text("__version__ = '0.0.0-stub'\n")
    branch(repo, "pr-off-by-one-2", "verify_mask: one request of slack", OFF_BY_ONE)
    proc, out = gate(repo, tmp_path / "report", "--property", "capacity-soundness",
                     program=PREIMPORTED, before=(str(stub),))
    assert proc.returncode == 2, out
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"cannot test the SGLang checkout at {repo}" in proc.stderr, proc.stderr
    assert f"already imported from {stub / 'sglang'}" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_docs_only_change_in_the_checkout_never_imports_sglang(repo, tmp_path):
    branch(repo, "pr-docs", "docs: speculative decoding flags", touch="docs/speculative_decoding.md")
    proc, out = gate(repo, tmp_path / "report")
    assert proc.returncode == 0, out
    assert "skipped: none of the 1 changed file(s)" in out and "sglang from None" in out, out


def test_the_checkout_is_found_from_inside_it_and_not_past_a_repository(tmp_path):
    checkout = tmp_path / "sglang"
    (checkout / "python" / "sglang").mkdir(parents=True)
    (checkout / "python" / "sglang" / "__init__.py").write_text("")
    (checkout / "docs").mkdir()
    assert sglang_checkout(checkout) == checkout.resolve()
    assert sglang_checkout(checkout / "docs") == checkout.resolve()
    nested = checkout / "third_party" / "other"
    (nested / ".git").mkdir(parents=True)
    assert sglang_checkout(nested) is None  # another repository inside it is not SGLang's
    assert sglang_checkout(tmp_path / "missing") is None
    assert sglang_checkout(ROOT) is None
