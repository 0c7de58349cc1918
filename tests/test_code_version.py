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

from vmfuzz.harness.targets.sglang.loader import code_version


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
