"""The version of the code under test is read from that code, never from whatever wheel is installed.

A git checkout of SGLang has no generated ``_version.py``; SGLang's own fallback
then reports the installed wheel's version, and known findings whose range closes
at that release would excuse newer code. ``code_version`` reads the checkout's
``git describe`` instead, and says where it read the version.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from vmfuzz.harness.targets.sglang.code_version import code_version


def _git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def _checkout(tmp_path: Path, tag: str | None = "v0.5.23") -> Path:
    repo = tmp_path / "sglang"
    (repo / "python" / "sglang").mkdir(parents=True)
    (repo / "python" / "sglang" / "__init__.py").write_text("")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "release" if tag else "untagged")
    if tag:
        _git(repo, "tag", tag)
    return repo


def test_a_checkout_at_a_release_tag_is_that_release(tmp_path):
    repo = _checkout(tmp_path)
    version, where = code_version(repo / "python" / "sglang", "0.5.20")  # the installed wheel's answer
    assert version == "0.5.23" and "git describe" in where


def test_a_checkout_past_the_tag_is_newer_so_a_range_closed_at_the_tag_no_longer_applies(tmp_path):
    repo = _checkout(tmp_path)
    (repo / "python" / "sglang" / "x.py").write_text("y = 1\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "work")
    version, _ = code_version(repo / "python" / "sglang", "0.5.23")
    assert version.startswith("0.5.23.post1+g")
    assert not _applies(">=0.5.19,<=0.5.23", version) and _applies(">=0.5.19", version)
    (repo / "python" / "sglang" / "x.py").write_text("y = 2\n")  # uncommitted: newer still
    assert code_version(repo / "python" / "sglang", "0.5.23")[0].endswith(".dirty")


def test_a_checkout_without_a_tag_is_unknown_and_no_closed_range_applies(tmp_path):
    repo = _checkout(tmp_path, tag=None)
    version, where = code_version(repo / "python" / "sglang", "0.5.23")
    assert version == "unknown" and "no release tag" in where
    assert not _applies(">=0.5.19,<=0.5.23", version)


def test_a_built_package_keeps_its_own_generated_version(tmp_path):
    package = tmp_path / "site" / "sglang"
    package.mkdir(parents=True)
    (package / "_version.py").write_text("__version__ = '0.5.21'\n")
    assert code_version(package, "0.5.21") == ("0.5.21", "the package's generated _version.py")


def test_a_checkout_past_the_tag_is_read_from_git_not_from_the_version_file_its_install_generated(tmp_path):
    repo = _checkout(tmp_path)
    (repo / "python" / "sglang" / "_version.py").write_text("__version__ = '0.5.23'\n")  # stale from here on
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "work past the release")
    version, where = code_version(repo / "python" / "sglang", "0.5.23")
    assert version.startswith("0.5.23.post1+g") and "git describe" in where
    assert not _applies(">=0.5.19,<=0.5.23", version)


def _copy_without_version_file(tmp_path: Path, pyproject: str | None) -> Path:
    """SGLang's layout (``python/sglang``) with no .git and no generated ``_version.py``."""
    package = tmp_path / "copy" / "python" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    if pyproject is not None:
        (package.parent / "pyproject.toml").write_text(pyproject)
    return package


def test_a_copy_without_checkout_or_version_file_reads_its_pyproject_not_the_installed_wheel(tmp_path):
    package = _copy_without_version_file(tmp_path, '[project]\nname = "sglang"\nversion = "0.6.0"\n')
    version, where = code_version(package, "0.5.23")  # the installed wheel's answer
    assert version == "0.6.0" and "pyproject.toml" in where
    assert not _applies(">=0.5.19,<=0.5.23", version)


@pytest.mark.parametrize("pyproject", [
    None,
    '[project]\nname = "sglang"\ndynamic = ["version"]\n',  # setuptools-scm: the version is git's, and git is absent
    '[project]\nname = "someone-else"\nversion = "9.9.9"\n',
    "not toml [",
])
def test_a_copy_whose_own_version_cannot_be_read_is_unknown_and_no_closed_range_applies(tmp_path, pyproject):
    package = _copy_without_version_file(tmp_path, pyproject)
    version, where = code_version(package, "0.5.23")
    assert version == "unknown" and "installed distribution" in where
    assert not _applies(">=0.5.19,<=0.5.23", version)


def _applies(spec: str, version: str) -> bool:
    """Whether a known entry with range ``spec`` applies to ``version`` (the entries' own rule)."""
    from types import SimpleNamespace

    from vmfuzz.harness.model.known_file import Known
    return Known.applies_to(SimpleNamespace(sglang=spec), version)


@pytest.fixture(autouse=True)
def _git_present():
    import shutil
    if shutil.which("git") is None:
        pytest.skip("needs git")


@pytest.mark.slow
def test_a_copy_of_newer_code_without_its_version_file_is_not_excused_by_a_range_closed_at_the_wheel(tmp_path):
    """End to end: the gate on a copy whose pyproject says 0.6.0 (no .git, no ``_version.py``) sees
    DFlash's known policy defect as new: the shipped entry's range closes at an older release."""
    import json

    from tests.helpers import sglang_or_skip
    from tests.sglang_copies import altered_copy, run_on_copy
    sglang_or_skip()
    site = altered_copy(tmp_path, [], "no-version-file")
    (site / "sglang" / "_version.py").unlink()
    (site / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "0.6.0"\n')
    changed = tmp_path / "changed.txt"
    changed.write_text("python/sglang/srt/speculative/dflash_utils.py\n")
    proc, out = run_on_copy(site, tmp_path, "gate", "--target", "sglang", "--changed-files", str(changed),
                            "--property", "routing", "--report-dir", str(tmp_path / "report"))
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["versions"]["sglang"] == "0.6.0", out
    assert "pyproject.toml" in summary["versions"]["sglang version from"]
    assert proc.returncode == 1 and summary["counts"]["new_groups"] >= 1, out
    assert not summary["known_findings"] or all(k["status"] != "reproduces" for k in summary["known_findings"])
