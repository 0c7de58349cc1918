"""Ctrl-C, SIGTERM and a closed stdout: how a run ends when its surroundings end it.

Ctrl-C reaches the whole process group: this process turns it into
``KeyboardInterrupt`` (exit 130), SIGTERM into ``Terminated`` (exit 143), and
both are remembered, so an interrupt that a library swallowed still ends the
run as interrupted. SIGHUP (a closed terminal or ssh session), SIGQUIT and
SIGUSR1 (a batch system's warning) would otherwise kill the process where it
stands, with no report and the failures' record not updated: they end a run
as SIGTERM does, exit 143. Worker and isolated child processes ignore them
all: the parent stops them and writes the reports.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys


class Terminated(KeyboardInterrupt):
    """SIGTERM: handled like Ctrl-C (reports are written), exit 143."""


_received: int | None = None

#: Signals that end a run as SIGTERM does (exit 143, reports written).
ENDING = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)


def _on_signal(signum, frame) -> None:
    global _received
    _received = signum
    raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def install():
    """In the command's process only (the main thread); returns what ``restore`` puts back."""
    global _received
    _received = None
    hook = sys.unraisablehook
    sys.unraisablehook = _unraisable
    return {signum: signal.signal(signum, _on_signal) for signum in (signal.SIGINT, *ENDING)}, hook


def restore(previous) -> None:
    handlers, hook = previous
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    sys.unraisablehook = hook


def _unraisable(info) -> None:
    """An interrupt that landed where Python cannot raise (a gc callback, a __del__)
    is not lost: ``check()`` raises it at the next example. Nothing is printed."""
    if isinstance(info.exc_value, KeyboardInterrupt) and _received is not None:
        return
    sys.__unraisablehook__(info)


def check() -> None:
    """Raise the pending interrupt again, for one a library swallowed."""
    if _received is not None:
        raise KeyboardInterrupt() if _received == signal.SIGINT else Terminated()


def received() -> int | None:
    """The signal that interrupted this run, if any."""
    return _received


def exit_code(exc: BaseException | None = None) -> int:
    if isinstance(exc, Terminated) or _received in ENDING:
        return 143
    return 130


def name() -> str:
    """The signal that ended the run, as its man page names it ("Ctrl-C" for SIGINT)."""
    if _received is None or _received == signal.SIGINT:
        return "Ctrl-C"
    return signal.Signals(_received).name


def from_user(exc: BaseException) -> bool:
    """Was this KeyboardInterrupt a real signal, or raised by code under test?"""
    return _received is not None


def ignore_in_child() -> None:
    """For a worker or an isolated child: the parent handles interrupts and stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # A hang-up reaches the whole process group; the parent ends its workers itself.
    for signum in ENDING[1:]:
        signal.signal(signum, signal.SIG_IGN)
    # Started under ``held()``: a Ctrl-C that arrived meanwhile is now dropped,
    # and the parent's SIGTERM (how it stops a worker) takes effect.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, *ENDING})


def die_with_parent() -> None:
    """Linux: a parent SIGKILLed mid-run takes its workers with it, rather than leaving
    them (workers, lanes) searching for nobody until their budget ends."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass  # elsewhere: the worker ends when it next finds the pipe closed


@contextlib.contextmanager
def held():
    """Hold Ctrl-C and SIGTERM while starting child processes.

    A child inherits the mask, so an interrupt that lands while it is still
    starting up stays pending until ``ignore_in_child`` drops it, instead of
    printing a KeyboardInterrupt traceback from a half-started worker. In this
    process the held signal is delivered on leaving.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, *ENDING})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class _QuietStream:
    """stdout that, once its reader is gone (``| head``, /dev/full), drops what follows.

    The run goes on to its true verdict and exit code; only the printing stops.
    """

    def __init__(self, inner):
        self._inner = inner
        self._dead = False

    def _lost(self) -> None:
        self._dead = True
        try:
            # Python flushes the real stream again at exit: give it somewhere to go.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._inner.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass

    def write(self, s):
        if self._dead:
            return len(s)
        try:
            return self._inner.write(s)
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.ENOSPC, errno.EIO) or isinstance(exc, BrokenPipeError):
                self._lost()
                return len(s)
            raise

    def flush(self):
        if self._dead:
            return
        try:
            self._inner.flush()
        except OSError:
            self._lost()

    def __getattr__(self, name):
        return getattr(self._inner, name)


def quiet_stdout() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            # A target's message may hold lone surrogates or bytes the locale cannot encode.
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass
    if not isinstance(sys.stdout, _QuietStream) and sys.stdout is not None:
        sys.stdout = _QuietStream(sys.stdout)
