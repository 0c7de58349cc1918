"""A warm interpreter that forks a run instead of starting Python cold for it.

A run against SGLang spends most of its start importing third-party packages
(torch, transformers, triton, sympy, ...): 8-10 of a cold start's 10-11
seconds. A zygote imports those once and forks one child per run; the child
becomes ``python [-W ACTION] -m MODULE | -c CODE ARGS`` with the run's own
argv, environment, working directory and import path, so it imports SGLang
and the harness itself, from its own ``PYTHONPATH`` (an altered copy, a
checkout), exactly as a cold start would.

SGLang and the harness are never preloaded: SGLang registers configs with
transformers and ops with torch at import, which a second import from another
copy would collide with, and each run must see its own copy's code. What to
preload is measured, not listed by hand: a cold probe imports the harness and
the installed SGLang once, and every module it loaded outside them is
preloaded (``probe``).

This module imports only the standard library and runs as a script
(``python zygote.py SOCKET PRELOAD``: the bisect's zygote, fed over a Unix
socket, ``vmfuzz.harness.engine.core.zygote_client``), or is loaded by path
(tests/zygote.py): either way nothing of ``harness`` is in the zygote's
``sys.modules`` for a child to inherit.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

#: top-level names a run imports from its own path, never from the zygote
OWN = ("sglang", "vmfuzz", "harness", "tests", "bench", "scripts", "strategies", "__main__", "__mp_main__")
#: the most one job message may carry (its argv and environment)
MESSAGE = 1 << 20
#: a forked child's status when it failed before it became the run (the client runs it again cold)
UNBORN = 70
#: the probe's line giving the import-time switches a cold run set (``probe``), in JSON after it
SWITCHES = "#switches "


# ---- what to preload ---------------------------------------------------------------------------

def probe(code: str, *, cwd: Path, env: dict, cache_key: str, switches: tuple[str, ...] = ()) -> Path:
    """A file naming the modules a cold ``python -c code`` loads, probed once per ``cache_key``
    (and the interpreter and installed SGLang it depends on) and kept in the temp dir.

    ``switches`` are environment variables a package reads when it is first imported and that
    the cold run sets itself before that import (``TRITON_INTERPRET`` on a host with no CUDA:
    triton picks compiled or interpreted functions at import). Their values as the probe left
    them head the file, and the zygote sets them before it preloads anything: a package it
    preloads is then the one a cold run would have imported, never one built for another device."""
    import subprocess
    path, me = probe_path(cache_key, env, switches), os.getpid()
    if os.path.lexists(path) and not _ours(path):
        # a FIFO would block the zygote's start; another user's file would choose what it preloads
        # (and its switches): probed afresh under a name of this process's, never read
        path = path.with_suffix(f".own-{os.getpid()}.txt")
    if not path.exists():
        listing = (code + "\nimport json, os, sys\n"
                   f"print({SWITCHES!r} + json.dumps({{k: os.environ[k] for k in {tuple(switches)!r} if k in os.environ}}))\n"
                   "print('\\n'.join(sys.modules))")
        got = subprocess.run([sys.executable, "-W", "ignore", "-c", listing], capture_output=True, text=True,
                             cwd=cwd, env=env, timeout=600, preexec_fn=lambda: die_with_parent(me))
        tmp = path.with_suffix(f".{os.getpid()}")
        tmp.write_text(got.stdout)
        if got.returncode:
            return tmp  # what it loaded before it failed: preloaded this once, never kept
        tmp.replace(path)  # whole or absent: concurrent probes race harmlessly
    return path


def _ours(path: Path) -> bool:
    """A regular file (never a link, a FIFO or a device) that this user owns and no one else may write."""
    import stat
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def probe_path(cache_key: str, env: dict, switches: tuple[str, ...] = ()) -> Path:
    """Where ``probe`` keeps its listing: a switch the caller set already is part of what was
    probed, so another value is another probe."""
    return probe_cache(cache_key + "|" + json.dumps({k: env.get(k) for k in switches}, sort_keys=True))


def probe_cache(cache_key: str) -> Path:
    import hashlib
    import tempfile
    from importlib.util import find_spec
    try:
        sg = find_spec("sglang")
        sg_where = str(Path(sg.origin).stat().st_mtime) if sg and sg.origin else "none"
    except Exception:  # noqa: BLE001 - no SGLang: the probe finds torch and the rest only
        sg_where = "none"
    key = f"{sys.executable}|{Path(sys.executable).stat().st_mtime}|{sg_where}|{cache_key}"
    return Path(tempfile.gettempdir()) / f"vmfuzz-zygote-preload-{hashlib.sha1(key.encode()).hexdigest()[:12]}.txt"


def preload(listing: Path) -> None:
    import importlib
    import warnings
    text = listing.read_text()
    for line in text.splitlines():
        if line.startswith(SWITCHES):  # before the first import that reads them
            os.environ.update(json.loads(line[len(SWITCHES):]))
    warnings.simplefilter("ignore")
    for name in (line.strip() for line in text.splitlines()):
        if not name or name.startswith(SWITCHES):
            continue
        if name.split(".")[0] in OWN or name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - a module that only imports in SGLang's context: left cold
            continue
    warnings.resetwarnings()


def base_path(leave_out: tuple[Path, ...] = ()) -> list[str]:
    """The interpreter's own path (stdlib, site-packages); a run's checkout comes from its PYTHONPATH."""
    out = [str(p) for p in sys.path[1:] if p]
    return [p for p in out if Path(p).resolve() not in leave_out]


# ---- the child: becomes the run ----------------------------------------------------------------

def streams() -> None:
    """New ``sys`` streams over fds 0-2, once the run's own files are there."""
    import io
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                                   errors="backslashreplace", line_buffering=True)


def become(argv: list[str], env: dict, cwd: str, base: list[str]) -> None:
    """Runs ``argv`` (``[python, ("-W", ACTION)*, "-m" MODULE | "-c" CODE, *args]``) in this forked
    child, fds 0-2 already the run's; exits with what a cold Python would. Never returns."""
    import importlib
    import runpy
    import types
    import warnings
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    argv = argv[1:]
    warnings.resetwarnings()
    sys.warnoptions[:] = []
    while argv[:1] == ["-W"]:
        sys.warnoptions.append(argv[1])
        warnings.simplefilter(argv[1])
        argv = argv[2:]
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    mode, target, args = argv[0], argv[1], argv[2:]
    sys.path[:] = [cwd if mode == "-m" else ""] + extra + base
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
        leave(None, signal_number=2)  # as a cold Python dies of an uncaught Ctrl-C
    except BaseException:  # noqa: BLE001 - what a cold Python does with an uncaught exception
        import traceback
        traceback.print_exc()
        code = 1
    leave(code)


def leave(code, signal_number: int | None = None) -> None:
    """Python's exit, less the interpreter's teardown: a run that never imported a preloaded
    package (sentencepiece's SWIG types) must not warn about it at teardown, and tearing
    down torch's thousands of modules is time no run's result needs."""
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


def die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this process when ``parent`` dies, even by SIGKILL; one that died
    before the request was made (a fork is not scheduled at once) ends it here."""
    try:
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # elsewhere: a zygote ends when its stdin closes, a run when its step's socket does
    if os.getppid() != parent:
        os._exit(UNBORN)


# ---- the socket server: the bisect's zygote ----------------------------------------------------

def serve(sock_path: str, listing: Path) -> None:
    """Preload, say ready on stdout, then fork one child per job received on ``sock_path``
    until stdin closes or the parent that started the zygote is gone (its end of the pipe
    closes with it, SIGKILL included); every child still running is killed on the way out."""
    import select
    import socket
    import threading
    owner = os.getppid()
    die_with_parent(owner)  # an owner killed while this preloads: not a moment longer
    preload(listing)
    base = base_path()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(sock_path)
    server.listen(16)
    alone = threading.active_count() == 1  # a preloaded thread would not survive a fork
    print(json.dumps({"ready": alone, "pid": os.getpid()}), flush=True)
    jobs: dict = {}  # connection -> its child's pid
    try:
        while alone and os.getppid() == owner:
            ready, _, _ = select.select([server, sys.stdin, *jobs], [], [], 0.5)
            if sys.stdin in ready and not os.read(sys.stdin.fileno(), 4096):
                break
            if server in ready:
                _accept(server, jobs, base)
            for conn in [c for c in ready if c in jobs]:
                if not conn.recv(16):  # the step that asked is gone: its run goes with it
                    _kill(jobs[conn])
            _reap(jobs)
    finally:
        for pid in jobs.values():
            _kill(pid)
        for pid in jobs.values():
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        try:
            os.unlink(sock_path)
        except OSError:
            pass


def _accept(server, jobs: dict, base: list[str]) -> None:
    import socket
    conn, _ = server.accept()
    try:
        conn.settimeout(10)  # a client that connects and sends nothing must not stall the others
        data, fds, _, _ = socket.recv_fds(conn, MESSAGE, 3)
        conn.settimeout(None)
        job = json.loads(data)
    except (OSError, ValueError):
        conn.close()
        return
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    zygote = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            die_with_parent(zygote)
            server.close()
            for other in jobs:
                other.close()
            conn.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            streams()
            become(job["argv"], job["env"], job["cwd"], base)
        finally:
            os._exit(UNBORN)  # become never returns: this is the fork failing, not the run
    for fd in fds:
        os.close(fd)
    jobs[conn] = pid
    _send(conn, {"pid": pid})


def _reap(jobs: dict) -> None:
    for conn, pid in list(jobs.items()):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0x7F00  # never ours to reap: no status to give
        if done:
            rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            _send(conn, {"rc": rc})
            conn.close()
            del jobs[conn]


def _send(conn, message: dict) -> None:
    try:
        conn.send(json.dumps(message).encode())
    except OSError:
        pass  # the step is gone: nothing to tell


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    serve(sys.argv[1], Path(sys.argv[2]))
