"""Starting a zygote (``vmfuzz.harness.engine.core.zygote``) and running a process from it.

The owner (``vmfuzz bisect``) starts one with ``serving()`` and hands its
socket to the processes that run steps (``ZYGOTE_ENV``); a step runs its child
with ``spawn()``, which passes the step's own stdin, stdout and stderr to the
forked child over the socket, and gets back something ``subprocess.Popen``-like.
Anything that goes wrong on the way (no zygote, one that did not start, one
that died) gives ``None`` or ``Lost``: the caller then runs the same command
cold, so the zygote changes how fast a run starts, never what it does.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from vmfuzz.harness.engine.core.zygote import UNBORN

#: where a step finds its owner's zygote (absent: none, run cold)
ZYGOTE_ENV = "VMFUZZ_ZYGOTE_SOCKET"
#: set in a run forked from a zygote: such a run checks that what was preloaded is what it needs
#: and, where not, exits ``UNBORN`` so that it runs again cold
FORKED_ENV = "VMFUZZ_ZYGOTE_CHILD"
_SERVER = Path(__file__).resolve().with_name("zygote.py")


class Lost(Exception):
    """The zygote went away before the run's status came back: run it again, cold."""


@contextlib.contextmanager
def serving(env: dict, *, probe_code: str, switches: tuple[str, ...] = (), start_timeout: float = 600.0):
    """A zygote for the duration of the block: yields its socket's path, or None when it could
    not start (the runs go cold). The zygote's session is killed on every way out of the block,
    and it ends itself if this process dies first (its stdin closes). ``switches``: the
    import-time environment switches a cold run sets itself (``zygote.probe``)."""
    from vmfuzz.harness.engine.core import zygote
    sweep_stale(Path(tempfile.gettempdir()))
    where = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))  # short: a socket's path has ~100 bytes
    sock = where / "sock"
    proc = None
    try:
        try:
            # the probe works in the zygote's own folder: nothing it does is in the user's checkout
            listing = zygote.probe(probe_code, cwd=where, env=env, cache_key=probe_code, switches=switches)
            # its own path only: the zygote imports nothing from a checkout
            proc = subprocess.Popen([sys.executable, "-W", "ignore", str(_SERVER), str(sock), str(listing)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    env={k: v for k, v in env.items() if k != "PYTHONPATH"}, cwd=where,
                                    start_new_session=True)
            (where / "pid").write_text(str(proc.pid))  # who owns the folder, for a later sweep_stale
            ready = _line(proc.stdout, start_timeout)
        except (OSError, subprocess.SubprocessError, ValueError):
            ready = {}
        yield str(sock) if ready.get("ready") is True else None
    finally:
        if proc is not None:
            _end(proc)
        shutil.rmtree(where, ignore_errors=True)


#: a zygote's folder (its socket, its pid): removed by its owner, or by a later owner's sweep
FOLDER_PREFIX = "vmfuzz-zygote-"
#: a folder with no pid this old is a leftover (the pid is written within a second of the folder)
_UNOWNED_AGE = 3600.0


def sweep_stale(tmp: Path) -> list[Path]:
    """Removes the zygote folders that outlived their zygote: an owner killed by SIGKILL cannot
    remove its own, and the kernel kills its zygote (by SIGKILL too) before that could. A folder
    goes when the pid it names is gone, or, naming none, when it is an hour old; a live zygote's
    folder, and one whose pid a new process has taken, stay (never removed in doubt)."""
    import time
    gone = []
    for folder in tmp.glob(FOLDER_PREFIX + "*"):
        if not folder.is_dir() or folder.is_symlink() or folder.name.startswith(FOLDER_PREFIX + "check-"):
            continue
        try:
            pid = int((folder / "pid").read_text())
        except (OSError, ValueError):
            pid = None
        try:
            stale = _gone(pid) if pid is not None else time.time() - folder.stat().st_mtime > _UNOWNED_AGE
        except OSError:
            continue
        if stale:
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(folder)
    return gone


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def _end(proc: subprocess.Popen) -> None:
    try:
        proc.stdin.close()  # asks it to go; the kill below makes sure
    except OSError:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()
    proc.stdout.close()


def _line(stream, timeout: float) -> dict:
    ready, _, _ = select.select([stream], [], [], timeout)
    line = stream.readline() if ready else b""
    return json.loads(line) if line.strip() else {}


class Forked:
    """A run forked from the zygote, waited on like ``subprocess.Popen`` (same exit statuses:
    a signal's death is its negative number)."""

    def __init__(self, conn: socket.socket, pid: int, argv: list[str]):
        self.conn, self.pid, self.args, self.returncode = conn, pid, argv, None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        ready, _, _ = select.select([self.conn], [], [], timeout)
        if not ready:
            raise subprocess.TimeoutExpired(self.args, timeout)
        try:
            data = self.conn.recv(4096)
        except OSError:
            data = b""
        if not data:
            self.kill()  # the zygote is gone; its child dies with it on Linux, elsewhere by this
            self.conn.close()
            raise Lost(f"the zygote went away while pid {self.pid} ran")
        rc = json.loads(data)["rc"]
        self.conn.close()
        if rc == UNBORN:  # a run that exits 70 itself just runs twice: its cold status is the answer
            raise Lost(f"pid {self.pid} failed before it became the run")
        self.returncode = rc
        return rc

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass


def spawn(argv: list[str], *, env: dict | None = None, cwd: str | None = None) -> Forked | None:
    """``argv`` forked from the zygote named by ``$VMFUZZ_ZYGOTE_SOCKET``, with this process's
    stdin, stdout and stderr; None when there is none to reach (run it cold)."""
    env = dict(os.environ if env is None else env)
    path = env.pop(ZYGOTE_ENV, None)
    if not path or argv[:1] != [sys.executable]:
        return None
    env[FORKED_ENV] = "1"
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.settimeout(30)
        conn.connect(path)
        job = json.dumps({"argv": argv, "env": env, "cwd": cwd or os.getcwd()}).encode()
        socket.send_fds(conn, [job], [0, 1, 2])
        reply = json.loads(conn.recv(4096) or b"{}")
        conn.settimeout(None)
        return Forked(conn, int(reply["pid"]), argv)
    except (OSError, ValueError, KeyError, TypeError):
        conn.close()
        return None
