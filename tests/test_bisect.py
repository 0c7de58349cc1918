"""``vmfuzz bisect`` on a stand-in SGLang history where the regression enters at a known commit.

The history is 18 commits on top of the installed SGLang (tests/sglang_repo.py):
small unrelated edits, the pre-#33127 ``fits`` planted at one commit, and two
commits on which ``import sglang`` fails (a refactor half done, then undone).
The replay at each revision runs that revision's real code. Bisect must name
the planted commit, skip the unimportable ones without blaming them, report the
finding, and never touch the user's own checkout: it works in a worktree of its own.

Skipped unless SGLang imports (``VMFUZZ_REQUIRE_SGLANG=1``: must run).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import sglang_repo
from tests.helpers import sglang_or_skip

ROOT = Path(__file__).resolve().parent.parent
REPRO = ROOT / "repro" / "pr33127" / "pr33127.json"

N_COMMITS = 18
#: the commit (1-based, after the base) that brings the regression back: one before the last, so a
#: search from the commit before it to main is one step past the ends (the SIGKILL test's rerun)
PLANTED = 17
UNIMPORTABLE = (9, 10)  # import sglang fails on these two, repaired by the next

#: Files the unrelated commits touch in turn: comments only, the code unchanged.
TOUCHED = ("python/sglang/srt/speculative/eagle_utils.py", "python/sglang/srt/layers/attention/verify_mask.py",
           "docs/speculative_decoding.md", "python/sglang/srt/speculative/eagle_worker_common.py")


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    sglang_or_skip()
    repo = sglang_repo.build(tmp_path_factory.mktemp("sglang-history"))
    # The copied package is thousands of loose objects: each commit below would start a background
    # gc that is still running in the repository when a test looks for what the bisect left running.
    sglang_repo.git(repo, "config", "gc.auto", "0")
    # --good tracks notes/keep.txt; commit 1 drops it and ignores notes/: the user's own copy is
    # an ignored file that a checkout of --good in their work tree would overwrite and then delete.
    (repo / "notes").mkdir()
    (repo / "notes" / "keep.txt").write_text("tracked once\n")
    shas = {0: sglang_repo.commit(repo, "notes: keep")}
    init = repo / "python" / "sglang" / "__init__.py"
    for i in range(1, N_COMMITS + 1):
        if i == 1:
            (repo / "notes" / "keep.txt").unlink()
            with open(repo / ".gitignore", "a") as f:
                f.write("notes/\n")
            shas[i] = sglang_repo.commit(repo, "notes: untrack, keep them local")
        elif i == PLANTED:
            shas[i] = sglang_repo.commit(repo, "verify_mask: FULL_MASK has context slack, skip the check",
                                         sglang_repo.REGRESSION)
        elif i == UNIMPORTABLE[0]:
            shas[i] = sglang_repo.commit(repo, "refactor: move the runtime package (part 1)",
                                         sglang_repo.BREAKS_IMPORT)
        elif i == UNIMPORTABLE[-1] + 1:
            init.write_text(init.read_text().replace(sglang_repo.BREAKS_IMPORT[2], "", 1))
            shas[i] = sglang_repo.commit(repo, "refactor: revert the move")
        else:
            shas[i] = sglang_repo.commit(repo, f"chore: tidy {i}", touch=TOUCHED[i % len(TOUCHED)])
    _user_state(repo)
    return repo, shas


def _user_state(repo: Path) -> None:
    """What a user's checkout holds besides commits: all of it is theirs, none of it the bisect's."""
    (repo / "notes" / "keep.txt").write_text("my own notes, ignored by git\n")
    (repo / "scratch.txt").write_text("untracked\n")
    doc = repo / "docs" / "speculative_decoding.md"
    doc.write_text(doc.read_text() + "stashed\n")
    sglang_repo.git(repo, "stash", "push", "-q", "-m", "user's stash")
    doc.write_text(doc.read_text() + "staged\n")
    sglang_repo.git(repo, "add", str(doc))
    doc.write_text(doc.read_text() + "unstaged\n")


def snapshot(repo: Path) -> dict:
    """The user's repository as they see it: status with ignored files, stashes, HEAD, every file's bytes."""
    files = {}
    for path in sorted(repo.rglob("*")):
        rel = path.relative_to(repo)
        if rel.parts[0] != ".git" and path.is_file():
            files[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"status": sglang_repo.git(repo, "status", "--porcelain", "--ignored"),
            "stash": sglang_repo.git(repo, "stash", "list"),
            "head": sglang_repo.git(repo, "rev-parse", "--symbolic-full-name", "HEAD"),
            "staged": sglang_repo.git(repo, "diff", "--cached"),
            "worktrees": sglang_repo.git(repo, "worktree", "list", "--porcelain"),
            "bisect": subprocess.run(["git", "bisect", "log"], cwd=repo, capture_output=True).returncode,
            "files": files}


def _shell() -> dict:
    """A maintainer's plain shell: the interpreter switch unset, as the steps and their zygote must cope with."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CI="true")
    for key in ("SGLANG_USE_CPU_ENGINE", "TRITON_INTERPRET", "VMFUZZ_BISECT_ZYGOTE"):
        env.pop(key, None)
    return env


def bisect(repo: Path, report: Path, *args: str):
    env = _shell()
    proc = subprocess.run([sys.executable, "-m", "vmfuzz.harness.cli", "bisect", str(REPRO), "--repo", str(repo),
                           "--report-dir", str(report), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    return proc, proc.stdout + proc.stderr


@pytest.mark.slow
def test_bisect_names_the_planted_commit_and_skips_the_unimportable(history, tmp_path):
    repo, shas = history
    before = snapshot(repo)
    proc, out = bisect(repo, tmp_path / "r", "--good", shas[0], "--bad", "main")
    assert proc.returncode == 1, out
    assert f"first bad commit: {shas[PLANTED]} verify_mask: FULL_MASK has context slack" in out, out
    assert "finding (no-oob-write): out-of-bounds write on the reused buffer" in out, out
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["first_bad"] == shas[PLANTED] and s["command"] == "bisect"
    verdicts = {c["name"].split()[0]: c["status"] for c in s["checks"]}
    # Every tested commit got the verdict its code deserves; the unimportable ones were skipped.
    for i, sha in shas.items():
        if sha[:12] in verdicts:
            want = "skipped" if i in UNIMPORTABLE else ("failed" if i >= PLANTED else "held")
            assert verdicts[sha[:12]] == want, (i, verdicts)
    assert any(shas[i][:12] in verdicts for i in UNIMPORTABLE), "no unimportable commit was tested"
    # each revision was said once, with its verdict, before the answer (as it was judged: see
    # test_terminal's test_bisect_says_each_revision_while_the_search_runs)
    lines = proc.stdout.splitlines()
    answer = next(i for i, ln in enumerate(lines) if ln.startswith("first bad commit"))
    for sha12 in verdicts:
        said = [i for i, ln in enumerate(lines) if ln.startswith(f"  {sha12} ")]
        assert len(said) == 1 and said[0] < answer, (sha12, out)
    # The user's checkout was never touched: the ignored notes, stash, index and branch are as they were.
    assert snapshot(repo) == before
    assert (repo / "notes" / "keep.txt").read_text() == "my own notes, ignored by git\n"
    import xml.etree.ElementTree as ET
    suite = ET.parse(tmp_path / "r" / "junit.xml").getroot().find("testsuite")
    assert int(suite.get("failures")) == sum(v == "failed" for v in verdicts.values())


@pytest.mark.slow
@pytest.mark.parametrize("good,bad,message", [
    ("--output=/tmp/x", "main", "not a revision"),
    ("no-such-branch", "main", "no such commit"),
    ("main", "main", "same commit"),
])
def test_bisect_refuses_bad_revisions(history, tmp_path, good, bad, message):
    repo, _ = history
    proc, out = bisect(repo, tmp_path / "r", f"--good={good}", f"--bad={bad}")
    assert proc.returncode == 2 and message in proc.stderr, out
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.slow
def test_bisect_refuses_ends_that_do_not_hold_and_fail(history, tmp_path):
    repo, shas = history
    # Both ends already carry the regression: nothing to bisect, and the checkout is left as found.
    proc, out = bisect(repo, tmp_path / "r", "--good", shas[PLANTED], "--bad", "main")
    assert proc.returncode == 2 and "the repro fails at --good" in proc.stderr, out
    assert sglang_repo.git(repo, "symbolic-ref", "--short", "HEAD") == "main"


def _start(repo: Path, report: Path, good: str, out: Path) -> subprocess.Popen:
    env = _shell()
    with open(out, "w") as f:
        return subprocess.Popen([sys.executable, "-m", "vmfuzz.harness.cli", "bisect", str(REPRO), "--repo", str(repo),
                                 "--good", good, "--bad", "main", "--report-dir", str(report)],
                                cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, text=True)


def _wait_for(proc: subprocess.Popen, ready, what: str) -> None:
    deadline = time.monotonic() + 600
    while not ready():
        assert proc.poll() is None, f"vmfuzz ended ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"never reached {what}"
        time.sleep(0.1)


def _bisect_log(repo: Path) -> Path:
    return repo / ".git" / "worktrees" / "worktree" / "BISECT_LOG"


def _steps_logged(repo: Path) -> int:
    log = repo / ".git" / "vmfuzz-bisect" / "run" / "steps.jsonl"
    return len(log.read_text().splitlines()) if log.exists() else 0


def _running_in(repo: Path) -> list[str]:
    """Processes working inside the repository (the bisect's worktree included), or naming it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cwd.startswith(str(repo)) or f"--repo {repo}" in cmd:
            found.append(f"{entry.name} {cwd}: {cmd[:200]}")
    return found


def _none_running_in(repo: Path, within: float) -> list[str]:
    deadline = time.monotonic() + within
    while (left := _running_in(repo)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_mid_bisect_ends_everything_and_leaves_the_checkout_as_found(history, tmp_path, sig, code):
    repo, shas = history
    before = snapshot(repo)
    proc = _start(repo, tmp_path / "r", shas[0], tmp_path / "out")
    _wait_for(proc, lambda: _bisect_log(repo).exists() and _steps_logged(repo) >= 2, "git bisect run")
    proc.send_signal(sig)
    proc.wait(timeout=300)
    out = (tmp_path / "out").read_text()
    assert proc.returncode == code, out
    # git bisect run, its script, bisect--helper and the steps end with vmfuzz, not after it.
    assert _running_in(repo) == [], out
    assert not (repo / ".git" / "BISECT_RUN").exists()
    assert not (repo / ".git" / "vmfuzz-bisect" / "worktree").exists()
    assert snapshot(repo) == before


#: When to SIGKILL vmfuzz: while it sets up, at each end check, as git bisect run starts, mid-run.
KILL_MOMENTS = {
    "setting up": lambda repo, out: (repo / ".git" / "vmfuzz-bisect" / "worktree").exists(),
    "checking --bad": lambda repo, out: "checking --bad" in out.read_text(),
    "checking --good": lambda repo, out: "checking --good" in out.read_text(),
    "bisect run starting": lambda repo, out: _bisect_log(repo).exists(),
    "mid-run": lambda repo, out: _steps_logged(repo) >= 3,
}


@pytest.mark.slow
def test_sigkill_at_any_moment_leaves_the_checkout_byte_for_byte_and_the_rerun_recovers(history, tmp_path):
    repo, shas = history
    before = snapshot(repo)
    for moment, ready in KILL_MOMENTS.items():
        out = tmp_path / f"{moment}.out"
        proc = _start(repo, tmp_path / "r", shas[0], out)
        _wait_for(proc, lambda: ready(repo, out), moment)
        proc.kill()
        proc.wait()
        # Orphaned steps notice their owner is gone and stop git bisect run themselves.
        assert _none_running_in(repo, within=30) == [], (moment, out.read_text())
        after = snapshot(repo)
        after["worktrees"] = before["worktrees"]  # our worktree may be left, to be removed by the rerun
        assert after == before, moment
    # A tag with the branch's name (same commit) must not leave the user detached either.
    sglang_repo.git(repo, "tag", "main", "main")
    try:
        # The shortest range holding the planted commit: recovery is what this rerun checks, and the
        # whole history's search is test_bisect_names_the_planted_commit_and_skips_the_unimportable's.
        proc, out = bisect(repo, tmp_path / "final", "--good", shas[PLANTED - 1], "--bad", "main")
        assert proc.returncode == 1, out
        assert "cleaned up after an interrupted bisect: removed the worktree" in out, out
        assert f"first bad commit: {shas[PLANTED]}" in out, out
        assert snapshot(repo) == before  # our worktree gone too: as before the first kill
        assert sglang_repo.git(repo, "rev-parse", "--symbolic-full-name", "HEAD") == "refs/heads/main"
    finally:
        sglang_repo.git(repo, "tag", "-d", "main")


@pytest.mark.slow
def test_a_tag_and_a_branch_of_one_name_on_different_commits_is_refused(history, tmp_path):
    repo, shas = history
    before = snapshot(repo)
    sglang_repo.git(repo, "tag", "main", shas[PLANTED - 1])
    try:
        proc, out = bisect(repo, tmp_path / "r", "--good", shas[0], "--bad", "main")
    finally:
        sglang_repo.git(repo, "tag", "-d", "main")
    assert proc.returncode == 2 and "is ambiguous" in proc.stderr and "refs/heads/main" in proc.stderr, out
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert snapshot(repo) == before
