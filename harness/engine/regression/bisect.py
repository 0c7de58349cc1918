"""``vmfuzz bisect``: the first commit of an SGLang checkout on which a repro fails.

``git bisect run`` drives ``vmfuzz.harness.engine.regression.bisect_step``, which replays the repro
against each revision's own code (the checkout's ``python/`` first on the path).
A revision whose SGLang does not import is skipped, never blamed. Both ends are
checked before the search (the repro must hold at GOOD and fail at BAD), so a
wrong pair of revisions is an error, not a confident wrong answer.

All of it happens in a throwaway ``git worktree`` of the user's repository at
``<git common dir>/vmfuzz-bisect/worktree``, never in the user's work tree: a
checkout there would delete their ignored files, and a kill mid-bisect would
leave them detached. git keeps the bisect state of a linked worktree in that
worktree's own admin directory, so the user's repository never holds any.
Every process the bisect starts runs in a session of its own, killed as a group
on every way out; a step whose owner died (SIGKILL) stops the run itself. A
rerun after any interruption finds the leftovers by their fixed place, ends
what still runs there, removes them, and says what it cleaned.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import vmfuzz
from vmfuzz.harness.engine.core.zygote_client import ZYGOTE_ENV
from vmfuzz.harness.engine.regression.bisect_step import BAD, GOOD, LOCK_ENV, SKIP
from vmfuzz.harness.engine.regression.bisect_zygote import steps_zygote, zygote_fits

#: Hooks belong to the user's own checkouts, and a background ``gc --auto`` would outlive the
#: bisect in their repository: neither may start from a bisect's git commands.
_NO_HOOKS = ("-c", "core.hooksPath=/dev/null", "-c", "gc.auto=0", "-c", "maintenance.auto=false")
_FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


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
    cleaned: list[str] = field(default_factory=list)  # leftovers of an interrupted bisect, removed


@dataclass
class Place:
    """Where a bisect of ``repo`` keeps everything it owns: one fixed, recognisable directory."""
    repo: Path

    @cached_property
    def state(self) -> Path:
        common = _git(self.repo, "rev-parse", "--git-common-dir").stdout.strip()
        return (self.repo / common).resolve() / "vmfuzz-bisect"

    @property
    def worktree(self) -> Path:
        return self.state / "worktree"

    @property
    def scratch(self) -> Path:  # the repro's copy and the step log
        return self.state / "run"

    @property
    def lock(self) -> Path:
        return self.state / "lock"


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["git", *_NO_HOOKS, *args], cwd=repo, capture_output=True, text=True)
    if check and proc.returncode:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise BisectError(f"git {args[0]} failed: {msg[-1] if msg else proc.returncode}")
    return proc


def _commit_of(repo: Path, rev: str) -> str | None:
    proc = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", check=False)
    sha = proc.stdout.strip()
    return sha if proc.returncode == 0 and _FULL_SHA.fullmatch(sha) else None


def resolve_rev(repo: Path, rev: str, what: str) -> str:
    """The full sha ``rev`` names. ``--end-of-options`` keeps a rev like ``--output=x`` from being an
    option; a name that is both a tag and a branch (on different commits) is refused, not guessed."""
    if not rev or rev.startswith("-") or "\0" in rev:
        raise BisectError(f"--{what} {rev!r}: not a revision")
    sha = _commit_of(repo, rev)
    if sha is None:
        raise BisectError(f"--{what} {rev!r}: no such commit in {repo}")
    name = re.split(r"[~^:]|@\{", rev, maxsplit=1)[0]
    if name and not name.startswith("refs/") and not _FULL_SHA.fullmatch(name):
        meant = {}
        for full in (f"refs/{name}", f"refs/tags/{name}", f"refs/heads/{name}", f"refs/remotes/{name}"):
            if _git(repo, "show-ref", "--verify", "--quiet", full, check=False).returncode == 0:
                meant[full] = _commit_of(repo, full)
        if len(set(meant.values())) > 1:
            raise BisectError(f"--{what} {rev!r} is ambiguous ({' and '.join(meant)} name different commits);"
                              f" name the one you mean in full")
    return sha


def _check_repo(repo: Path) -> Path:
    if not repo.is_dir():
        raise BisectError(f"--repo {repo}: no such directory")
    top = _git(repo, "rev-parse", "--show-toplevel", check=False)
    if top.returncode or not top.stdout.strip():
        raise BisectError(f"--repo {repo}: not a git repository with a work tree")
    return Path(top.stdout.strip()).resolve()


def _subject(repo: Path, sha: str) -> str:
    return _git(repo, "log", "-1", "--format=%s", sha).stdout.strip()


def _read_log(path: Path) -> list[Tested]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
        except ValueError:  # a step killed mid-write: its line is not a verdict
            continue
        out.append(Tested(d["commit"], d["verdict"], d["detail"], property=d.get("property")))
    return out


def _take_lock(place: Place) -> int:
    """One bisect per repository at a time. flock dies with its holder, SIGKILL included,
    so a free lock is how a rerun (and an orphaned step) knows the last owner is gone."""
    place.state.mkdir(parents=True, exist_ok=True)
    fd = os.open(place.lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise BisectError(f"{place.repo}: another vmfuzz bisect (pid {holder}) is running there") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def _end_processes_in(path: Path) -> int:
    """SIGKILL every process whose working directory is inside ``path``: only a bisect's own
    processes work in its worktree. Linux only; elsewhere orphaned steps stop themselves."""
    proc, ended, inside = Path("/proc"), 0, str(path)
    if not proc.is_dir():
        return 0
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd").removesuffix(" (deleted)")
        except OSError:
            continue
        if cwd == inside or cwd.startswith(inside + os.sep):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                ended += 1
            except OSError:
                pass
    return ended


def _admin_dirs(place: Place) -> list[Path]:
    """The ``worktrees/<name>`` entries git keeps for our worktree (bisect state included);
    other worktrees of the user, stale or not, are theirs and left alone."""
    ours = str(place.worktree / ".git")
    found = []
    for admin in (place.state.parent / "worktrees").glob("*"):
        try:
            if (admin / "gitdir").read_text().strip() == ours:
                found.append(admin)
        except OSError:
            continue
    return found


def _clean(place: Place) -> list[str]:
    """Remove what a bisect of this repository left: processes, worktree, its git record, scratch."""
    cleaned = []
    ended = _end_processes_in(place.worktree)
    if ended:
        cleaned.append(f"ended {ended} process(es) still running in {place.worktree}")
    admins = _admin_dirs(place)
    if admins or place.worktree.exists():
        _git(place.repo, "worktree", "remove", "--force", "--force", str(place.worktree), check=False)
        shutil.rmtree(place.worktree, ignore_errors=True)
        for admin in _admin_dirs(place):
            shutil.rmtree(admin, ignore_errors=True)
        cleaned.append(f"removed the worktree {place.worktree} and its bisect state")
    if place.scratch.exists():
        shutil.rmtree(place.scratch, ignore_errors=True)
        cleaned.append(f"removed {place.scratch}")
    return cleaned


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:  # the group has already ended
        pass


def _run_group(cmd: list[str], cwd: Path, env: dict, poll=None) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a session of its own; the whole group dies with it on every way out
    (git bisect run's script, bisect--helper and the steps are its grandchildren).
    ``poll()`` is called every half second while it runs, and once after."""
    import tempfile

    from vmfuzz.harness.engine.core.signals import held

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        with held():  # an interrupt between fork and here would otherwise leave the group unowned
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True,
                                    start_new_session=True)
        try:
            while True:
                try:
                    proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    if poll is not None:
                        poll()
        finally:
            _kill_group(proc.pid)
            proc.wait()
        if poll is not None:
            poll()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())


class _Tail:
    """Says each revision's verdict the moment its step logs it: git bisect run's own
    output comes only when the whole search ends, minutes later."""

    def __init__(self, log: Path, repo: Path, echo):
        self.log, self.repo, self.echo, self.seen = log, repo, echo, 0

    def __call__(self) -> None:
        tested = _read_log(self.log)
        for t in tested[self.seen:]:
            self.echo(f"  {t.commit[:12]} {t.verdict:<4} {_subject(self.repo, t.commit)}: {t.detail}")
        self.seen = len(tested)


def _check_ends(wt: Path, repo: Path, step: list[str], env: dict, ends, log: Path, echo) -> None:
    tail = _Tail(log, repo, echo)
    for sha, want, name in ends:
        _git(wt, "checkout", "-q", "--detach", sha)
        echo(f"vmfuzz bisect: checking --{name} {sha[:12]} {_subject(repo, sha)}")
        rc = _run_group(step, wt, env, poll=tail).returncode
        last = _read_log(log)[-1:] or [Tested(sha, "skip", f"step exited {rc}")]
        if rc == SKIP:
            raise BisectError(f"--{name} {sha[:12]} cannot be tested: {last[0].detail}")
        if rc not in (GOOD, BAD):
            raise BisectError(f"the step at --{name} {sha[:12]} ended with {rc}: {last[0].detail}")
        if rc != want:
            state = "holds" if rc == GOOD else "fails"
            raise BisectError(f"the repro {state} at --{name} {sha[:12]} ({last[0].detail}); nothing to bisect")


def _search(place: Place, repro_path: str, good_sha: str, bad_sha: str, step_args: list[str], echo) -> str:
    """Both ends checked, then ``git bisect run``, all in our worktree; returns its output."""
    # the folder that holds the vmfuzz package (a checkout or site-packages) goes on each step's path
    harness_root = str(Path(vmfuzz.__file__).parent.parent)
    place.scratch.mkdir(parents=True)
    # The repro may live inside the checkout: a copy outside survives every checkout.
    repro_copy = place.scratch / "repro.json"
    shutil.copyfile(repro_path, repro_copy)
    log = place.scratch / "steps.jsonl"
    env = {**os.environ, "VMFUZZ_BISECT_LOG": str(log), LOCK_ENV: str(place.lock),
           "PYTHONPATH": os.pathsep.join(filter(None, [harness_root, os.environ.get("PYTHONPATH")]))}
    wt = place.worktree
    step = [sys.executable, "-m", "vmfuzz.harness.engine.regression.bisect_step", str(repro_copy), "--repo", str(wt), *step_args]
    _git(place.repo, "worktree", "add", "--quiet", "--detach", str(wt), bad_sha)
    with steps_zygote(env, step_args[1]) as sock:
        if sock and zygote_fits(sock, env, echo):
            env[ZYGOTE_ENV] = sock
        _check_ends(wt, place.repo, step, env, ((bad_sha, BAD, "bad"), (good_sha, GOOD, "good")), log, echo)
        _git(wt, "bisect", "start", bad_sha, good_sha, "--")
        echo("vmfuzz bisect: searching between them")
        tail = _Tail(log, place.repo, echo)
        tail.seen = len(_read_log(log))  # the two ends were said already
        run = _run_group(["git", *_NO_HOOKS, "bisect", "run", *step], wt, env, poll=tail)
    return run.stdout + run.stderr


def _answer(repo: Path, out: str, tested: list[Tested], result: BisectResult) -> None:
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
        result.subject = _subject(repo, blame)
        if blame in verdicts:
            result.detail, result.property = verdicts[blame].detail, verdicts[blame].property


def bisect(repro_path: str, repo: str, good: str, bad: str, *, target: str = "sglang",
           prop: str | None = None, timeout: float = 600.0, echo=print) -> BisectResult:
    from vmfuzz.harness.engine.regression.replay import properties_for
    from vmfuzz.harness.engine.core.signals import held
    from vmfuzz.harness.model.repro_file import load

    t0 = time.monotonic()
    repro = load(repro_path)
    properties_for(repro, prop)  # a property that cannot apply is an error before any checkout
    repo_path = _check_repo(Path(repo).resolve())
    good_sha, bad_sha = resolve_rev(repo_path, good, "good"), resolve_rev(repo_path, bad, "bad")
    if good_sha == bad_sha:
        raise BisectError("--good and --bad name the same commit")
    if _git(repo_path, "merge-base", "--is-ancestor", good_sha, bad_sha, check=False).returncode:
        raise BisectError(f"--good {good} is not an ancestor of --bad {bad}")

    place = Place(repo_path)
    lock = _take_lock(place)
    try:
        cleaned = _clean(place)
        for what in cleaned:
            echo(f"vmfuzz bisect: cleaned up after an interrupted bisect: {what}")
        step_args = ["--target", target, "--timeout", str(timeout)] + (["--property", prop] if prop else [])
        try:
            out = _search(place, repro_path, good_sha, bad_sha, step_args, echo)
            tested = _read_log(place.scratch / "steps.jsonl")
        finally:
            with held():  # a second Ctrl-C must not cut the cleaning short
                _clean(place)
    finally:
        os.close(lock)

    for t in tested:  # each was said as it was judged (_Tail)
        t.subject = _subject(repo_path, t.commit)
    result = BisectResult(None, tested=tested, seconds=time.monotonic() - t0, cleaned=cleaned)
    _answer(repo_path, out, tested, result)
    return result
