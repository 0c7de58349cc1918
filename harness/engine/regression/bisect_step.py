"""One ``git bisect run`` step: replay a repro against the checked-out revision's SGLang.

    python -m vmfuzz.harness.engine.regression.bisect_step --repo PATH --target T [--property P] REPRO

Exit codes are git bisect's: 0 the repro held (good), 1 it failed (bad), 125
this revision cannot be tested (SGLang does not import, or imports from
somewhere other than this checkout) so git skips it rather than blaming it.

The step runs the replay in a child process: a kernel that kills the process
(a segfault, an abort) is the finding showing, and git must hear "bad", not a
signal number that would abort the whole bisect. The child is forked from the
bisect's zygote when it has one (``vmfuzz.harness.engine.core.zygote``: torch and the
other third-party packages already imported, this revision's SGLang not), and
started cold when it has none or the zygote fails it. One JSON line per revision is
appended to ``$VMFUZZ_BISECT_LOG`` so the bisect can report what the first bad
commit did.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from vmfuzz.harness.engine.core.zygote import UNBORN
from vmfuzz.harness.engine.core.zygote_client import FORKED_ENV

GOOD, BAD, SKIP = 0, 1, 125
ABORT = 255  # git bisect run stops on it: the vmfuzz that owns this bisect is gone
LOCK_ENV = "VMFUZZ_BISECT_LOCK"  # the lock file the owning vmfuzz holds while it lives
HARNESS_ERROR = 3  # child only: mapped to SKIP by the parent


def _child(args) -> int:
    """Runs in the child, with the checkout first on sys.path."""
    python_dir = Path(args.repo).resolve() / "python"
    sys.path.insert(0, str(python_dir))
    from vmfuzz.harness.engine.regression.replay import replay
    from vmfuzz.harness.model.repro_file import ReproError, load
    from vmfuzz.harness.engine.core.failures import ImportRaised
    from vmfuzz.harness.model.errors import OutOfStep
    from vmfuzz.harness.targets import TargetUnavailable, resolve

    repro = load(args.repro)
    if os.environ.get(FORKED_ENV):
        from vmfuzz.harness.targets.sglang.loader import preload_mismatch
        why = preload_mismatch()
        if why:  # never "cannot be tested" for the zygote's fault: the same step, started cold
            print(f"vmfuzz bisect: warning: {why}; this step runs cold", file=sys.stderr, flush=True)
            return UNBORN
    try:
        target = resolve(args.target)
        import sglang
        where = Path(sglang.__file__).resolve()
        if python_dir not in where.parents:
            raise TargetUnavailable(f"sglang imports from {where}, not from this checkout")
    except (TargetUnavailable, ImportError, ImportRaised, OutOfStep) as exc:
        # a revision whose SGLang does not load (its own raise, or a dependency this host lacks)
        # cannot replay the repro: skipped, never blamed for a bug it was not seen to have
        # the install hint that comes with an unavailable target is no help for an old revision
        why = (str(exc).splitlines() or [type(exc).__name__])[0].split("; install it with")[0]
        _emit(args, "skip", why)
        return SKIP
    from vmfuzz.harness.engine.core.failures import failure_of
    try:
        replay(repro, target, isolate=False, prop=args.property)
    except ReproError:
        raise
    except OutOfStep as exc:  # vmfuzz cannot drive this revision: git skips it, never blames it
        _emit(args, "skip", f"could not check: {exc}")
        return SKIP
    except Exception as exc:  # noqa: BLE001 - a failure, or SGLang's code raising: this revision's
        origin, detail = failure_of(args.property or repro.property or "replay", exc)
        if repro.origin is not None and origin.cause() != repro.origin.cause():
            # another bug on this revision: not the one being bisected, so neither good nor bad
            _emit(args, "skip", f"fails differently ({origin.label()}, not {repro.origin.label()}): {detail}",
                  prop=origin.property)
            return SKIP
        _emit(args, "bad", detail, prop=origin.property)
        return BAD
    _emit(args, "good", "held")
    return GOOD


def _emit(args, verdict: str, detail: str, prop: str | None = None) -> None:
    log = os.environ.get("VMFUZZ_BISECT_LOG")
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=args.repo, capture_output=True, text=True).stdout.strip()
    line = {"commit": rev, "verdict": verdict, "detail": detail, "property": prop or args.property}
    print(f"vmfuzz bisect: {rev[:12]} {verdict}: {detail}", flush=True)
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(line) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vmfuzz.harness.engine.regression.bisect_step")
    p.add_argument("repro")
    p.add_argument("--repo", required=True)
    p.add_argument("--target", default="sglang")
    p.add_argument("--property", default=None)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        import warnings
        warnings.simplefilter("ignore")  # the target's import chain is noisy; the verdict is what matters
        try:
            return _child(args)
        except Exception as exc:  # noqa: BLE001 - the harness failing says nothing about this revision
            print(f"vmfuzz bisect: step failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return HARNESS_ERROR
    if _owner_gone():
        return ABORT
    cmd = [sys.executable, "-m", "vmfuzz.harness.engine.regression.bisect_step", "--child", args.repro, "--repo", args.repo,
           "--target", args.target] + (["--property", args.property] if args.property else [])
    rc = _replay(cmd, args.timeout)
    if rc is None:
        _emit(args, "bad", f"target-hang: no verdict within {args.timeout:g}s")
        return BAD
    if rc in (GOOD, BAD, SKIP, ABORT):
        return rc
    if rc < 0:  # killed by a signal: the target crashed on the repro
        _emit(args, "bad", f"target-crash: the replay died with signal {-rc}")
        return BAD
    # anything else is the harness failing, not this revision: never blame it
    _emit(args, "skip", f"replay exited {rc}")
    return SKIP


def _replay(cmd: list[str], timeout: float) -> int | None:
    """The child's status, forked from the bisect's zygote when there is one (it starts in
    about a fifth of the time), cold otherwise or when the zygote fails it: the same child either way."""
    from vmfuzz.harness.engine.core.zygote_client import Lost, spawn

    forked = spawn(cmd)
    if forked is not None:
        try:
            return _watch(forked, timeout)
        except Lost:
            pass
    return _watch(subprocess.Popen(cmd), timeout)


def _owner_gone() -> bool:
    """True once the vmfuzz that started this bisect has died (even by SIGKILL): its lock is free."""
    import fcntl

    path = os.environ.get(LOCK_ENV)
    if not path:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing also drops the shared lock taken when the owner was gone
    return True


def _watch(proc, timeout: float) -> int | None:
    """The replay's exit status; None when it hung; ABORT when the owner died meanwhile,
    so that an orphaned ``git bisect run`` stops instead of going on without anyone."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        gone = _owner_gone()
        if gone or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            return ABORT if gone else None


if __name__ == "__main__":
    sys.exit(main())
