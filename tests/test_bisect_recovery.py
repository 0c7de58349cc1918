"""What ``vmfuzz bisect`` owns in a user's repository, and how a rerun takes it back.

A plain git repository stands in for the user's (no SGLang needed): a killed
bisect's leftovers are made the way a SIGKILL leaves them (our worktree with a
bisect in progress, a process still working in it), next to a stale worktree of
the user's own. The rerun's cleaning must end and remove only what is ours.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from vmfuzz.harness.engine.regression import bisect as engine

ENV = {**os.environ, "GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@example.invalid",
       "GIT_COMMITTER_NAME": "u", "GIT_COMMITTER_EMAIL": "u@example.invalid"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=ENV, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for i in range(4):
        (repo / "f.txt").write_text(f"{i}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"c{i}")
    return repo


def test_a_rerun_ends_and_removes_only_its_own_leftovers(repo, tmp_path):
    place = engine.Place(repo)
    # The user's own worktree, its directory since deleted: stale, but theirs to prune.
    git(repo, "worktree", "add", "-q", "--detach", str(tmp_path / "users-wt"), "HEAD~1")
    subprocess.run(["rm", "-rf", str(tmp_path / "users-wt")], check=True)
    # What a SIGKILLed bisect leaves: its worktree mid-bisect, a step still running there, scratch files.
    place.state.mkdir(parents=True)
    git(repo, "worktree", "add", "-q", "--detach", str(place.worktree), "HEAD~3")
    git(place.worktree, "bisect", "start", git(repo, "rev-parse", "main"), git(repo, "rev-parse", "HEAD~3"), "--")
    (place.scratch).mkdir()
    (place.scratch / "steps.jsonl").write_text('{"commit": "x", "verdict": "go')  # cut mid-write
    orphan = subprocess.Popen(["sleep", "300"], cwd=place.worktree)
    try:
        cleaned = engine._clean(place)
        assert orphan.wait(timeout=10) == -9
    finally:
        orphan.kill()
    assert any("ended 1 process" in c for c in cleaned), cleaned
    assert any(f"removed the worktree {place.worktree}" in c for c in cleaned), cleaned
    assert not place.worktree.exists() and not place.scratch.exists()
    listed = git(repo, "worktree", "list", "--porcelain")
    assert str(place.worktree) not in listed and "users-wt" in listed  # theirs is left alone
    assert git(repo, "rev-parse", "--symbolic-full-name", "HEAD") == "refs/heads/main"
    assert subprocess.run(["git", "bisect", "log"], cwd=repo, capture_output=True).returncode != 0
    assert engine._clean(place) == []  # nothing left to name the second time


def test_a_second_bisect_of_one_repository_is_refused_while_the_first_lives(repo):
    place = engine.Place(repo)
    fd = engine._take_lock(place)
    try:
        with pytest.raises(engine.BisectError, match="another vmfuzz bisect"):
            engine._take_lock(place)
    finally:
        os.close(fd)
    os.close(engine._take_lock(place))  # free again once the holder is gone


def test_an_orphaned_step_sees_its_owner_gone(repo, monkeypatch):
    from vmfuzz.harness.engine.regression import bisect_step

    place = engine.Place(repo)
    monkeypatch.setenv(bisect_step.LOCK_ENV, str(place.lock))
    fd = engine._take_lock(place)
    assert not bisect_step._owner_gone()
    os.close(fd)
    assert bisect_step._owner_gone()
    started = time.monotonic()
    assert bisect_step._watch(subprocess.Popen(["sleep", "300"]), timeout=600) == bisect_step.ABORT
    assert time.monotonic() - started < 10


def test_refs_are_resolved_unambiguously(repo):
    main = git(repo, "rev-parse", "main")
    git(repo, "tag", "main", "HEAD~2")
    with pytest.raises(engine.BisectError, match="ambiguous.*refs/tags/main and refs/heads/main"):
        engine.resolve_rev(repo, "main", "bad")
    with pytest.raises(engine.BisectError, match="ambiguous"):
        engine.resolve_rev(repo, "main~1", "bad")
    assert engine.resolve_rev(repo, "refs/heads/main", "bad") == main
    assert engine.resolve_rev(repo, main, "bad") == main
    git(repo, "tag", "-f", "main", "refs/heads/main")  # one name, one commit: nothing to choose between
    assert engine.resolve_rev(repo, "main", "bad") == main
