"""``vmfuzz bisect``: the first commit of an SGLang checkout on which a repro fails.

``git bisect run`` drives ``harness.engine.bisect_step``, which replays the repro
against each revision's own code (the checkout's ``python/`` first on the path).
A revision whose SGLang does not import is skipped, never blamed. Both ends are
checked before the search (the repro must hold at GOOD and fail at BAD), so a
wrong pair of revisions is an error, not a confident wrong answer. The checkout
is always handed back where it was: ``git bisect reset`` runs on every way out,
Ctrl-C included.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.engine.bisect_step import BAD, GOOD, SKIP


class BisectError(Exception):
    """Bad input (not a repository, an unknown revision, ends that do not hold/fail): exit 2."""


@dataclass
class Tested:
    commit: str
    verdict: str  # good / bad / skip
    detail: str
    subject: str = ""
    property: str | None = None


@dataclass
class BisectResult:
    first_bad: str | None  # None: skipped commits left the answer ambiguous
    subject: str = ""
    detail: str = ""
    property: str | None = None
    candidates: list[str] = field(default_factory=list)  # when ambiguous: any of these
    tested: list[Tested] = field(default_factory=list)
    seconds: float = 0.0


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if check and proc.returncode:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise BisectError(f"git {args[0]} failed: {msg[-1] if msg else proc.returncode}")
    return proc


def resolve_rev(repo: Path, rev: str, what: str) -> str:
    """The commit ``rev`` names. ``--end-of-options`` keeps a rev like ``--output=x`` from being an option."""
    if not rev or rev.startswith("-") or "\0" in rev:
        raise BisectError(f"--{what} {rev!r}: not a revision")
    proc = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", check=False)
    if proc.returncode or not re.fullmatch(r"[0-9a-f]{40,64}", proc.stdout.strip()):
        raise BisectError(f"--{what} {rev!r}: no such commit in {repo}")
    return proc.stdout.strip()


def _check_repo(repo: Path) -> Path:
    if not repo.is_dir():
        raise BisectError(f"--repo {repo}: no such directory")
    top = _git(repo, "rev-parse", "--show-toplevel", check=False)
    if top.returncode:
        raise BisectError(f"--repo {repo}: not a git repository")
    repo = Path(top.stdout.strip()).resolve()
    if _git(repo, "bisect", "log", check=False).returncode == 0:
        raise BisectError(f"{repo}: a git bisect is already in progress there (git bisect reset first)")
    if _git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise BisectError(f"{repo}: uncommitted changes to tracked files; commit or stash them first")
    return repo


def _subject(repo: Path, sha: str) -> str:
    return _git(repo, "log", "-1", "--format=%s", sha).stdout.strip()


def _read_log(path: Path) -> list[Tested]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        out.append(Tested(d["commit"], d["verdict"], d["detail"], property=d.get("property")))
    return out


def bisect(repro_path: str, repo: str, good: str, bad: str, *, target: str = "sglang",
           prop: str | None = None, timeout: float = 600.0, echo=print) -> BisectResult:
    from harness.engine.replay import properties_for
    from harness.model.repro_file import load

    t0 = time.monotonic()
    repro = load(repro_path)
    properties_for(repro, prop)  # a property that cannot apply is an error before any checkout
    repo_path = _check_repo(Path(repo).resolve())
    good_sha, bad_sha = resolve_rev(repo_path, good, "good"), resolve_rev(repo_path, bad, "bad")
    if good_sha == bad_sha:
        raise BisectError("--good and --bad name the same commit")
    if _git(repo_path, "merge-base", "--is-ancestor", good_sha, bad_sha, check=False).returncode:
        raise BisectError(f"--good {good} is not an ancestor of --bad {bad}")
    head = _git(repo_path, "symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip() \
        or _git(repo_path, "rev-parse", "HEAD").stdout.strip()

    harness_root = str(Path(__file__).resolve().parents[2])  # harness/engine/ -> the checkout
    with tempfile.TemporaryDirectory(prefix="vmfuzz-bisect-") as tmp:
        # The repro may live inside the checkout: a copy outside survives every checkout.
        repro_copy = Path(tmp) / "repro.json"
        shutil.copyfile(repro_path, repro_copy)
        log = Path(tmp) / "steps.jsonl"
        env = {**os.environ, "VMFUZZ_BISECT_LOG": str(log),
               "PYTHONPATH": os.pathsep.join(filter(None, [harness_root, os.environ.get("PYTHONPATH")]))}
        step = [sys.executable, "-m", "harness.engine.bisect_step", str(repro_copy), "--repo", str(repo_path),
                "--target", target, "--timeout", str(timeout)] + (["--property", prop] if prop else [])
        started = False
        try:
            for sha, want, name in ((bad_sha, BAD, "bad"), (good_sha, GOOD, "good")):
                _git(repo_path, "checkout", "-q", "--detach", sha)
                echo(f"vmfuzz bisect: checking --{name} {sha[:12]} {_subject(repo_path, sha)}")
                rc = subprocess.run(step, cwd=repo_path, env=env, capture_output=True, text=True).returncode
                last = _read_log(log)[-1:] or [Tested(sha, "skip", f"step exited {rc}")]
                if rc == SKIP:
                    raise BisectError(f"--{name} {sha[:12]} cannot be tested: {last[0].detail}")
                if rc != want:
                    state = "holds" if rc == GOOD else "fails"
                    raise BisectError(f"the repro {state} at --{name} {sha[:12]} "
                                      f"({last[0].detail}); nothing to bisect")
            _git(repo_path, "bisect", "start", bad_sha, good_sha, "--")
            started = True
            run = subprocess.run(["git", "bisect", "run", *step], cwd=repo_path, env=env,
                                 capture_output=True, text=True)
            out = run.stdout + run.stderr
        finally:
            if started:
                _git(repo_path, "bisect", "reset", head, check=False)
            else:
                _git(repo_path, "checkout", "-q", head, check=False)
        tested = _read_log(log)

    for t in tested:
        t.subject = _subject(repo_path, t.commit)
        echo(f"  {t.commit[:12]} {t.verdict:<4} {t.subject}: {t.detail}")
    result = BisectResult(None, tested=tested, seconds=time.monotonic() - t0)
    found = re.search(r"^([0-9a-f]{40,64}) is the first bad commit", out, re.M)
    if found:
        result.first_bad = found.group(1)
    elif "only 'skip'ped commits left" in out:
        result.candidates = re.findall(r"^([0-9a-f]{40,64})\b", out.split("could be any of:", 1)[-1], re.M)
    else:
        tail = out.strip().splitlines()[-3:]
        raise BisectError("git bisect run gave no answer: " + " / ".join(tail))
    blame = result.first_bad or (result.candidates[-1] if result.candidates else None)
    verdicts = {t.commit: t for t in tested if t.verdict == "bad"}
    if blame:
        result.subject = _subject(repo_path, blame)
        if blame in verdicts:
            result.detail, result.property = verdicts[blame].detail, verdicts[blame].property
    return result
