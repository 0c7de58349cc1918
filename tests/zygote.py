"""A warm interpreter that the CLI tests fork from, instead of starting Python cold each time.

A CLI run against SGLang spends most of its start importing third-party
packages (torch, transformers, fastapi, sympy, ...): about 6-7 CPU seconds of
a 9-second start on this 2-core box, paid again by each of the suite's ~200
CLI runs. The zygote imports those packages once per xdist worker and forks
one child per run. Each run is still its own process, with the test's own
argv, environment, working directory, stdout and stderr, and exit status.
It imports SGLang and the harness itself, from its own ``PYTHONPATH``
(an altered copy, a checkout), exactly as a cold start would.

SGLang is never preloaded: it registers configs with transformers and ops
with torch at import, which a second import from an altered copy would
collide with. What to preload is measured, not listed by hand: a cold probe
imports the harness and SGLang once, and every module it loaded that lives in
the venv or the standard library, outside SGLang, is preloaded.

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
_OWN = ("sglang", "harness", "tests", "bench", "scripts", "__main__", "__mp_main__")


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
    import hashlib
    try:
        from importlib.util import find_spec
        sg = find_spec("sglang")
        sg_where = str(Path(sg.origin).stat().st_mtime) if sg and sg.origin else "none"
    except Exception:  # noqa: BLE001 - no SGLang: the probe preloads torch and the rest only
        sg_where = "none"
    key = hashlib.sha1(f"{sys.executable}|{Path(sys.executable).stat().st_mtime}|{sg_where}".encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"vmfuzz-zygote-preload-{key}.txt"
    if not path.exists():
        probe = ("import sys\nimport harness.cli\ntry:\n    from harness.targets import resolve\n"
                 "    resolve('sglang')\nexcept Exception:\n    pass\nprint('\\n'.join(sys.modules))")
        got = subprocess.run([sys.executable, "-W", "ignore", "-c", probe], capture_output=True, text=True,
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"},
                             timeout=600)
        tmp = path.with_suffix(f".{os.getpid()}")
        tmp.write_text(got.stdout)
        tmp.replace(path)
    return path


# ---- the zygote: runs as its own process ------------------------------------------------------

def _preload(listing: Path) -> None:
    import importlib
    import warnings
    warnings.simplefilter("ignore")
    for name in listing.read_text().split():
        if name.split(".")[0] in _OWN or name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - a module that only imports in SGLang's context: left cold
            continue
    warnings.resetwarnings()


def _serve() -> None:
    import threading
    _preload(Path(os.environ.pop("VMFUZZ_ZYGOTE_PRELOAD")))
    # the interpreter's own path (stdlib, site-packages); the checkout comes from each job's PYTHONPATH
    base_path = [p for p in sys.path[1:] if Path(p or ".").resolve() not in (ROOT, ROOT / "tests")]
    reply = sys.stdout
    print(json.dumps({"ready": threading.active_count() == 1}), file=reply, flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(job, base_path)  # never returns
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        _, status = os.waitpid(pid, 0)
        rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(json.dumps({"rc": rc}), file=reply, flush=True)


def _child(job: dict, base_path: list[str]) -> None:
    """Becomes ``python [-W ignore] -m MODULE | -c CODE ARGS`` in the job's cwd and environment."""
    import importlib
    import io
    import runpy
    import types
    import warnings
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, job["out"]), (2, job["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                                   errors="backslashreplace", line_buffering=True)
    if job.get("address_space"):
        _cap(job["address_space"])
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    argv = job["argv"][1:]
    warnings.resetwarnings()
    sys.warnoptions[:] = []
    while argv[:1] == ["-W"]:
        sys.warnoptions.append(argv[1])
        warnings.simplefilter(argv[1])
        argv = argv[2:]
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    mode, target, args = argv[0], argv[1], argv[2:]
    sys.path[:] = [job["cwd"] if mode == "-m" else ""] + extra + base_path
    importlib.invalidate_caches()
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    code = 0
    try:
        if mode == "-m":
            sys.argv = [target, *args]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *args]
            exec(compile(target, "<string>", "exec"), main.__dict__)
    except SystemExit as stop:
        code = stop.code
    except KeyboardInterrupt:
        import traceback
        traceback.print_exc()
        _leave(None, signal_number=2)  # as a cold Python dies of an uncaught Ctrl-C
    except BaseException:  # noqa: BLE001 - what a cold Python does with an uncaught exception
        import traceback
        traceback.print_exc()
        code = 1
    _leave(code)


def _leave(code, signal_number: int | None = None) -> None:
    """Python's exit, less the interpreter's teardown: a cold run that never imported a
    preloaded package (sentencepiece's SWIG types) must not warn about it at teardown."""
    import atexit
    import signal
    import threading
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    threading._shutdown()  # joins the run's non-daemon threads, as interpreter exit does
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if signal_number is not None:
        signal.signal(signal_number, signal.SIG_DFL)
        os.kill(os.getpid(), signal_number)
    os._exit((code or 0) & 0xFF)


if __name__ == "__main__":
    _serve()
