"""A warm interpreter that the CLI tests fork from, instead of starting Python cold each time.

A CLI run against SGLang spends most of its start importing third-party
packages (torch, transformers, fastapi, sympy, ...): about 6-7 CPU seconds of
a 9-second start on this 2-core box, paid again by each of the suite's ~200
CLI runs. The zygote imports those packages once per xdist worker and forks
one child per run. Each run is still its own process, with the test's own
argv, environment, working directory, stdout and stderr, and exit status.
It imports SGLang and the harness itself, from its own ``PYTHONPATH``
(an altered copy, a checkout), exactly as a cold start would.

SGLang and the harness are never preloaded, and what is preloaded is measured,
not listed by hand; both, how a child becomes the run and how it exits, are
the harness's zygote core (``vmfuzz.harness.engine.core.zygote``, which ``vmfuzz
bisect`` forks its steps from too). This file is the tests' way to reach it:
one zygote per xdist worker, fed jobs over a pipe, each run's output to files.

``VMFUZZ_TEST_ZYGOTE=0`` turns it off (every run a cold ``python``).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def enabled() -> bool:
    return os.environ.get("VMFUZZ_TEST_ZYGOTE", "1") != "0"


# ---- the client: what a test calls ------------------------------------------------------------

class _Client:
    def __init__(self):
        self.proc: subprocess.Popen | None = None

    def discard(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(30)

    def _start(self) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(TRITON_INTERPRET="1", VMFUZZ_ZYGOTE_PRELOAD=str(_preload_list()))
        return subprocess.Popen([sys.executable, "-W", "ignore", __file__], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env, cwd=ROOT, text=True, bufsize=1)

    def run(self, argv: list[str], *, env: dict, cwd: Path, timeout: float | None, address_space: int | None):
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
            if _reply(self.proc, 600).get("ready") is not True:
                raise RuntimeError("the test zygote did not start")
        with tempfile.TemporaryDirectory(prefix="zygote-") as io_dir:
            out, err = Path(io_dir) / "out", Path(io_dir) / "err"
            self.proc.stdin.write(json.dumps({"argv": [str(a) for a in argv], "env": env, "cwd": str(cwd),
                                              "out": str(out), "err": str(err),
                                              "address_space": address_space}) + "\n")
            self.proc.stdin.flush()
            pid = _reply(self.proc, 60)["pid"]
            try:
                rc = _reply(self.proc, timeout)["rc"]
            except TimeoutError:
                _kill(pid)
                _reply(self.proc, 60)
                raise subprocess.TimeoutExpired(argv, timeout, _read(out), _read(err)) from None
            return subprocess.CompletedProcess(argv, rc, _read(out), _read(err))


def _reply(proc: subprocess.Popen, timeout: float | None) -> dict:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise TimeoutError
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the test zygote exited (status {proc.wait()})")
    return json.loads(line)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", "replace") if path.exists() else ""


_CLIENT = _Client()


def run(argv: list, *, env: dict | None = None, cwd: Path | None = None, timeout: float | None = None,
        address_space: int | None = None):
    """``subprocess.run(argv, capture_output=True, text=True, ...)`` for ``argv`` =
    ``[sys.executable, ("-W", "ignore")?, "-m" MODULE | "-c" CODE, *args]``, forked from the zygote.
    ``address_space``: the run's RLIMIT_AS in bytes (a cold run gets it before exec, a forked one
    before it starts; the preloaded packages already count, as they would once a cold run imported them)."""
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    cwd = Path(cwd or Path.cwd())
    cold = dict(env=env, cwd=cwd, timeout=timeout, capture_output=True, text=True,
                preexec_fn=None if address_space is None else lambda: _cap(address_space))
    if not enabled() or argv[0] != sys.executable:
        return subprocess.run(argv, **cold)
    try:
        return _CLIENT.run(argv, env=env, cwd=cwd, timeout=timeout, address_space=address_space)
    except (RuntimeError, OSError, KeyError, json.JSONDecodeError):
        _CLIENT.discard()  # a broken zygote: this run goes cold, the next one starts a new zygote
        return subprocess.run(argv, **cold)


def _cap(address_space: int) -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))


def _preload_list() -> Path:
    """The measured preload list, probed once per venv and SGLang (shared by the xdist workers)."""
    from vmfuzz.harness.engine.core import zygote as core
    probe = ("import vmfuzz.harness.cli\ntry:\n    from vmfuzz.harness.targets import resolve\n"
             "    resolve('sglang')\nexcept Exception:\n    pass")
    return core.probe(probe, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"},
                      cache_key="tests")


# ---- the zygote: runs as its own process, on the harness's zygote core ------------------------

def _core():
    """vmfuzz.harness.engine.core.zygote loaded by its path: importing it as ``harness...`` would leave
    the harness in the zygote's modules, and a run must import its own."""
    import importlib.util
    where = ROOT / "harness" / "engine" / "core" / "zygote.py"
    spec = importlib.util.spec_from_file_location("vmfuzz_zygote_core", where)
    core = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(core)
    return core


def _serve() -> None:
    import threading
    core = _core()
    core.preload(Path(os.environ.pop("VMFUZZ_ZYGOTE_PRELOAD")))
    base = core.base_path(leave_out=(ROOT, ROOT / "tests"))
    reply = sys.stdout
    print(json.dumps({"ready": threading.active_count() == 1}), file=reply, flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(core, job, base)  # never returns
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        _, status = os.waitpid(pid, 0)
        rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(json.dumps({"rc": rc}), file=reply, flush=True)


def _child(core, job: dict, base: list[str]) -> None:
    """Becomes the job's ``python`` run, its stdout and stderr the job's files."""
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, job["out"]), (2, job["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    core.streams()
    if job.get("address_space"):
        _cap(job["address_space"])
    core.become(job["argv"], job["env"], job["cwd"], base)


if __name__ == "__main__":
    _serve()
