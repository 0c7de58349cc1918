"""The lines the code under test runs while it is imported, observed as cheaply as its checks' lines.

A module's top level and its class bodies run once, when it is imported: in a
gate, mostly in the process the lanes fork from, outside any check (the target's
load, the imports a capture would make, done once before the forks, and what the
harness imports as it sets a lane up). The watch lasts until this process's own
line record starts (its first check, which records every line from then on). Left out of
the measurement, a changed class default or module constant looks as if it
never ran, and a file only imported looks as if nothing of it ran. So the
import is measured too, with coverage.py, into the line trace's folder, under
its own contexts (``AT_IMPORT``, ``FOR_CHECKS``), never a property's: a line
that ran at import ran outside every check, and what judges it is decided later
(``campaign.diff_coverage``).

Measuring a whole import under a trace function would cost: on Python 3.11 any
trace function sends the interpreter down its slow, unspecialised path, and an
import of SGLang runs torch's, transformers' and triton's module bodies too
(measured: 2.7 s more CPU on a gate's 8 s load). So the tracer runs only while a
traced file's own module body executes: a finder first on ``sys.meta_path``
wraps each module's ``exec_module`` and resumes the collector for a traced file,
pauses it for any other (a traced module importing torch pauses for torch's body
and resumes after it). Lines of other files that a traced module body calls run
traced; nothing else does.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from fnmatch import fnmatch
from pathlib import Path

#: Lines run while the target loaded the code under test (every run imports them, whatever it checks).
AT_IMPORT = "(import)"
#: Lines run by the imports a property's check would make, made once before the forks (``before_forks``).
FOR_CHECKS = "(import for the checks)"
IMPORT_CONTEXTS = frozenset({AT_IMPORT, FOR_CHECKS})

_watch: _ImportWatch | None = None


class _ImportWatch:
    def __init__(self, folder: Path, files: list[str], quiet_origin):
        import coverage
        self.folder = Path(folder)
        self.pid = os.getpid()
        self.listed, self.quiet_origin = list(files), quiet_origin
        self.files = {os.path.realpath(f) for f in files} | set(files)
        # a pattern (``PACKAGE/*``: scripts/covered_files.py traces the whole package) as coverage.py matches it
        self.patterns = [f for f in self.files if any(c in f for c in "*?[")]
        self.cov = coverage.Coverage(data_file=str(self.folder / "lines"), data_suffix=True, include=files,
                                     branch=False, config_file=False, check_preimported=False)
        self.cov.set_option("run:disable_warnings", ["no-data-collected"])
        with quiet_origin():
            self.cov.start()
        self.cov.switch_context(AT_IMPORT)
        self.collector = self.cov._collector
        self.tracing = True
        self.set(False)
        if not any(isinstance(f, _Finder) for f in sys.meta_path):  # a forked process has its parent's
            sys.meta_path.insert(0, _Finder())

    def set(self, on: bool) -> None:
        if on == self.tracing:
            return
        (self.collector.resume if on else self.collector.pause)()
        self.tracing = on

    def traced(self, origin: str | None) -> bool:
        if not origin:
            return False
        names = (origin, os.path.realpath(origin))
        return any(n in self.files for n in names) or any(fnmatch(n, p) for n in names for p in self.patterns)

    def end(self, keep: bool) -> None:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
        with contextlib.suppress(Exception):
            self.set(False)
            self.cov.stop()
            if keep:
                self.cov.save()


class _Finder:
    """Finds nothing itself: asks the finders after it and hands back their spec, its ``exec_module``
    wrapped to trace a traced file's body and pause for any other's."""

    def find_spec(self, name, path=None, target=None):
        if _watch is None:
            return None
        at = sys.meta_path.index(self) if self in sys.meta_path else len(sys.meta_path)
        for finder in sys.meta_path[at + 1:]:
            find = getattr(finder, "find_spec", None)
            if find is None:  # an old-style finder: the import system asks it, in its place, unwrapped
                return None
            spec = find(name, path, target)
            if spec is not None:
                _wrap(spec)
                return spec
        return None


def watched(spec) -> None:
    """A spec another finder found ahead of this module's: its module body is watched like any other."""
    if _watch is not None:
        _wrap(spec)


def _wrap(spec) -> None:
    loader = spec.loader
    # a loader that is a class (builtins, frozen modules) serves every module of its kind: never patched
    if loader is None or isinstance(loader, type) or not hasattr(loader, "exec_module"):
        return
    run = loader.exec_module
    if getattr(run, "_vmfuzz_import_trace", False):
        return
    origin = spec.origin

    def exec_module(module):
        watch, file = _watch, getattr(module, "__file__", None) or origin
        if watch is None:
            return run(module)
        if watch.pid != os.getpid():
            # a forked process with no watch of its own traces nothing: only a traced module's body needs one
            if not watch.traced(file):
                return run(module)
            watch = _here()
            if watch is None:
                return run(module)
        was = watch.tracing
        watch.set(watch.traced(file))
        try:
            return run(module)
        finally:
            watch.set(was)
    exec_module._vmfuzz_import_trace = True
    try:
        loader.exec_module = exec_module
    except (AttributeError, TypeError):  # a loader that takes no attributes: its modules run untraced
        pass


def _here() -> _ImportWatch | None:
    """This process's watch. A process forked from a watching one imports too before its first check (a
    lane's set-up, an allocation site's backend): its first import of a traced file starts a watch of its
    own, into the same folder, with the same files (a fork that imports none pays nothing)."""
    global _watch
    watch = _watch
    if watch is None or watch.pid == os.getpid():
        return watch
    try:
        _watch = _ImportWatch(watch.folder, watch.listed, watch.quiet_origin)
    except Exception:  # noqa: BLE001 - unobserved here: what this process imports reads as never run
        _watch = None
    return _watch


def observe(folder: Path, files: list[str], quiet_origin=contextlib.nullcontext) -> None:
    """From here until ``end``, the top level of each of ``files`` imported in this process is recorded."""
    global _watch
    if _watch is not None or not files:
        return
    try:
        _watch = _ImportWatch(folder, files, quiet_origin)
    except Exception:  # noqa: BLE001 - unobserved, the import's lines read as never run: could not check
        _watch = None
        return
    # a run that never measures in this process (scripts/covered_files.py merges after it exits) still leaves it
    atexit.register(save)


def observing() -> Path | None:
    """The folder this process's import is recorded into, while it is."""
    return _watch.folder if _watch is not None and _watch.pid == os.getpid() else None


@contextlib.contextmanager
def for_checks():
    """The imports inside are the ones a property's check would make, made here once for every fork."""
    watch = _watch
    if watch is None or watch.pid != os.getpid():
        yield
        return
    watch.cov.switch_context(FOR_CHECKS)
    try:
        yield
    finally:
        watch.cov.switch_context(AT_IMPORT)


def save() -> None:
    """What this process's import ran so far, written where the checks' records are merged from."""
    watch = _watch
    if watch is not None and watch.pid == os.getpid():
        with contextlib.suppress(Exception):
            watch.cov.save()


def end(keep: bool = True) -> None:
    """The import is over: its record is saved (``keep``) beside the checks' records, and tracing stops."""
    global _watch
    watch, _watch = _watch, None
    if watch is not None and watch.pid == os.getpid():
        watch.end(keep)
