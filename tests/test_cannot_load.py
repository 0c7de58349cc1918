"""Reports always, and the right culprit, when the code under test cannot load.

A checkout pins its dependencies in ``python/pyproject.toml``; the environment has
what it has. When the checkout then fails to import, and the failure passed
through a package it pins that this environment lacks (or has at another
version), the run could not check (exit 3) and says which: "cannot load the code
under test: <pkg> pinned ==X, installed Y" -- never "vmfuzz is out of step", never
a finding. And whatever stopped the load, every report is written, each saying
"could not check".
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests import sglang_repo, zygote
from vmfuzz.harness.targets.sglang.pins import culprit, modules_on_path, pinned

ROOT = Path(__file__).resolve().parent.parent


def _package(tmp_path: Path, deps: list[str]) -> Path:
    """A folder laid out as a checkout's ``python/``: ``sglang/`` beside a pyproject pinning ``deps``."""
    (tmp_path / "sglang").mkdir()
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "sglang"\nversion = "0.0.1"\ndependencies = ' + json.dumps(deps) + "\n")
    return tmp_path / "sglang"


def _raised(code: str) -> BaseException:
    try:
        exec(code, {"__name__": "sglang.srt.somewhere"})
    except Exception as exc:  # noqa: BLE001 - the failure under test
        return exc
    raise AssertionError(f"{code!r} raised nothing")


def test_a_pinned_package_that_is_not_installed_is_named(tmp_path):
    package = _package(tmp_path, ["nonexistent_pkg==1.0", "msgspec"])
    exc = _raised("import nonexistent_pkg")
    assert culprit(exc, package) == "nonexistent_pkg pinned ==1.0, not installed"


def test_a_pinned_package_at_another_version_is_named_with_both_versions(tmp_path):
    from importlib.metadata import version
    package = _package(tmp_path, ["msgspec==0.0.1"])
    exc = _raised("from msgspec import no_such_name_in_msgspec")
    assert culprit(exc, package) == f"msgspec pinned ==0.0.1, installed {version('msgspec')}"


def test_a_pin_the_environment_meets_or_that_the_failure_never_touched_blames_nothing(tmp_path):
    package = _package(tmp_path, ["msgspec>=0.1", "nonexistent_pkg==1.0"])
    assert culprit(_raised("from msgspec import no_such_name_in_msgspec"), package) is None  # met: not the cause
    assert culprit(_raised("import another_missing_pkg"), package) is None  # not pinned
    assert culprit(_raised("raise ValueError('sglang itself')"), package) is None


def test_a_pin_for_another_platform_is_not_this_ones(tmp_path):
    package = _package(tmp_path, ['nonexistent_pkg==1.0; sys_platform == "nonexistent-os"'])
    assert pinned(package) == {}
    assert culprit(_raised("import nonexistent_pkg"), package) is None


def test_the_modules_on_the_failures_path_leave_sglang_out():
    exc = _raised("import nonexistent_pkg")
    assert modules_on_path(exc)[0] == "nonexistent_pkg" and "sglang" not in modules_on_path(exc)


# -- end to end: a gate on a checkout that does not load here --------------------------------

@pytest.fixture(scope="module")
def repo(stand_in_checkout):
    return stand_in_checkout


def _pin(repo: Path, branch: str, deps: list[str], *plants: tuple[str, str, str]) -> None:
    """A branch whose pyproject pins ``deps`` and whose code has ``plants`` (an import that fails here)."""
    sglang_repo.git(repo, "checkout", "-q", "-B", branch, "main")
    project = repo / "python" / "pyproject.toml"
    project.write_text(project.read_text().replace(
        'requires-python = ">=3.10"\n', 'requires-python = ">=3.10"\ndependencies = ' + json.dumps(deps) + "\n"))
    sglang_repo.commit(repo, f"{branch}: pins", *plants)


def _gate(repo: Path, report: Path):
    listed = report.parent / "changed.txt"
    listed.write_text("python/sglang/srt/layers/attention/verify_mask.py\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1", CI="true")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    return zygote.run([sys.executable, "-m", "vmfuzz", "gate", "--target", "sglang", "--repo", str(repo),
                       "--changed-files", str(listed), "--property", "capacity-soundness",
                       "--report-dir", str(report)], cwd=report.parent, env=env, timeout=600)


def _every_report_could_not_check(report: Path, why: str) -> None:
    s = json.loads((report / "summary.json").read_text())
    assert (s["verdict"], s["verdict_kind"], s["exit_code"]) == ("could not check", "cannot load", 3), s
    assert why in s["headline"], s["headline"]
    first = (report / "summary.md").read_text().splitlines()[0]
    assert "**COULD NOT CHECK** (cannot load the code under test)" in first, first
    assert "<title>vmfuzz sglang: could not check (cannot load the code under test)</title>" in (
        report / "report.html").read_text()
    assert 'errors="1"' in (report / "junit.xml").read_text()


@pytest.mark.slow
def test_a_checkout_pinning_a_package_this_environment_lacks_names_it_and_writes_every_report(repo, tmp_path):
    _pin(repo, "pr-missing-pin", ["nonexistent_pkg==1.0"],
         ("python/sglang/__init__.py", r"\A", "import nonexistent_pkg\n"))
    proc = _gate(repo, tmp_path / "report")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out
    why = "cannot load the code under test: nonexistent_pkg pinned ==1.0, not installed"
    assert why in proc.stderr and "out of step" not in out and "Traceback" not in out, out
    _every_report_could_not_check(tmp_path / "report", "nonexistent_pkg pinned ==1.0, not installed")


@pytest.mark.slow
def test_a_checkout_pinning_another_version_of_an_installed_package_names_both(repo, tmp_path):
    from importlib.metadata import version
    # met where a mask module imports it (decided by imports.decide, not at ``import sglang``)
    _pin(repo, "pr-other-version", ["msgspec==0.0.1"],
         ("python/sglang/srt/layers/attention/verify_mask.py", r"(from __future__ import annotations\n)",
          r"\1from msgspec import no_such_name_in_msgspec\n"))
    proc = _gate(repo, tmp_path / "report")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out
    said = f"msgspec pinned ==0.0.1, installed {version('msgspec')}"
    assert f"cannot load the code under test: {said}" in proc.stderr and "out of step" not in out, out
    _every_report_could_not_check(tmp_path / "report", said)
