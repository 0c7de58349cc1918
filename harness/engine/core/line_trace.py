"""Which changed lines of the code under review ran, and under which property.

The gate's "exercised" is measured, not declared: every process that runs a
property's check records, with coverage.py, the lines of the changed SGLang
files that executed, each under a dynamic context naming the property whose
check was running (a shared group's name stands for its members). The records
land as coverage data files in one folder and are merged by the parent
(``merged``), the way ``coverage combine`` joins parallel runs.

Only the changed files are traced (``include``), so a run pays for the lines it
is asked about, not for the whole of SGLang and torch.

The parent switches it on for its children through the environment, so a
forked checker and a spawned ``--workers`` process record alike without being
handed anything.

What the code under test runs while it is imported, before any check, is
recorded into the same folder under contexts of its own (``import_trace``):
observed, never a property's.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from vmfuzz.harness.engine.core import import_trace, provoke
# the contexts a merged record's import lines carry, read by the campaign beside NO_PROPERTY
from vmfuzz.harness.engine.core.import_trace import AT_IMPORT, FOR_CHECKS, IMPORT_CONTEXTS  # noqa: F401

#: The folder the records go to; set by the gate, read by every process that runs checks.
DIR_ENV = "VMFUZZ_LINE_TRACE_DIR"
#: The absolute paths of the files to trace, os.pathsep-joined.
FILES_ENV = "VMFUZZ_LINE_TRACE_FILES"
#: The context of lines that ran outside any property's check and outside the observed import (the
#: harness's set-up, an import a checker made between two checks).
NO_PROPERTY = ""


def is_check(context: str) -> bool:
    """Does a line recorded under ``context`` run inside a property's check (never at import)?"""
    return context != NO_PROPERTY and context not in IMPORT_CONTEXTS

#: Seconds between saves of a long-lived worker's record: a worker killed for a hang
#: loses at most this much of what it ran (its case is a finding either way).
SAVE_EVERY = 5.0


class _Recorder:
    """This process's coverage measurement (one per pid: a forked child starts its own)."""

    def __init__(self, folder: str, files: list[str]):
        import coverage
        self.pid = os.getpid()
        self.cov = coverage.Coverage(data_file=os.path.join(folder, "lines"), data_suffix=True,
                                     include=files, branch=False, config_file=False,
                                     check_preimported=False)
        # A process that ran no changed line saves an empty record: expected, and the merge
        # counts it as nothing ran there, so coverage's warning about it is only noise on stderr.
        self.cov.set_option("run:disable_warnings", ["no-data-collected"])
        with _no_origin_stack():
            self.cov.start()
        self.last_save = time.monotonic()
        self.files = {os.path.realpath(f) for f in files}
        self.folder = folder
        _pause_in_other_kernels(self)
        provoke.install()  # the changed expressions, evaluated beside the base's (a gate's plan, if any)

    def save(self) -> None:
        self.cov.save()
        provoke.save(self.folder)
        self.last_save = time.monotonic()


_recorder: _Recorder | None = None


@contextlib.contextmanager
def _no_origin_stack():
    """coverage.py's collector keeps a text of the stack that started it, for its own debug output
    (``Collector.origin``, read only in its ``repr``). Built with ``inspect.stack()``, which reads the
    source of every frame: measured at 3.8 s of a gate's 54 s of CPU, one per forked checker, whose
    stacks run deep through the lane and fork-server frames. The measurement itself is unchanged."""
    import coverage.collector as collector
    kept = collector.short_stack
    collector.short_stack = lambda *args, **kwargs: "(not kept: vmfuzz.harness.engine.core.line_trace)"
    try:
        yield
    finally:
        collector.short_stack = kept


def _pause_in_other_kernels(rec: _Recorder) -> None:
    """Tracing pauses while Triton's interpreter runs a kernel from a file nobody changed.

    On Python 3.11 any trace function makes the whole interpreter run its slow,
    unspecialised path, and on a CPU host SGLang's kernels run in Triton's
    interpreter: most of a gate's time, and none of it in the changed files unless
    a kernel's own file changed. A kernel whose file is traced runs traced, so its
    lines are measured; the host code around every launch always is.
    """
    if "triton" not in sys.modules:
        # Never the first to import Triton: it must be imported after TRITON_INTERPRET is set
        # (the sglang loader's job), and a target that has not imported it launches nothing.
        return
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except Exception:  # noqa: BLE001 - a Triton without the interpreter: nothing runs in it
        return
    original = getattr(InterpretedFunction.run, "_vmfuzz_original", InterpretedFunction.run)

    def run(self, *args, **kwargs):
        active = _recorder
        code = getattr(getattr(self, "fn", None), "__code__", None)
        if active is None or active.pid != os.getpid() or code is None \
                or os.path.realpath(code.co_filename) in active.files:
            return original(self, *args, **kwargs)
        # The collector's own pause keeps its tracer, so the frames that launched the kernel go on
        # being measured after it (a stop and start would hand them to a new, blind tracer).
        collector = getattr(active.cov, "_collector", None)
        if collector is None or not hasattr(collector, "pause") or not hasattr(collector, "resume"):
            return original(self, *args, **kwargs)
        collector.pause()
        try:
            return original(self, *args, **kwargs)
        finally:
            collector.resume()
    run._vmfuzz_original = original
    InterpretedFunction.run = run


def _active() -> _Recorder | None:
    global _recorder
    folder, files = os.environ.get(DIR_ENV), os.environ.get(FILES_ENV)
    if not folder or not files:
        return None
    if _recorder is not None and _recorder.pid != os.getpid():
        # A fork carried the parent's tracer over; the parent saves its own lines, and
        # this child's go to a file of its own.
        with contextlib.suppress(Exception):
            _recorder.cov.stop()
        _recorder = None
    if _recorder is None:
        # the import is over where the first check begins: its record is kept beside the checks'
        import_trace.end()
        try:
            _recorder = _Recorder(folder, _listed(files))
        except Exception as exc:  # noqa: BLE001 - the harness's own tool, never the code under test's
            # Nothing is recorded from here on, so every changed line reads as never run: the gate
            # says it could not check. The check itself goes on; its verdict is SGLang's.
            os.environ.pop(DIR_ENV, None)
            os.environ.pop(FILES_ENV, None)
            _write_failure(folder, exc)
            return None
    return _recorder


def _write_failure(folder: str, exc: Exception) -> None:
    with contextlib.suppress(OSError):
        Path(folder, f"failed.{os.getpid()}").write_text(f"{type(exc).__name__}: {exc}")


def failures(folder: Path) -> list[str]:
    """Why a process could not record (coverage missing, an unwritable folder), one line each."""
    return sorted({p.read_text() for p in folder.glob("failed.*")})


@contextlib.contextmanager
def judging(prop_name: str):
    """Lines run inside are this property's (or shared group's) check's."""
    rec = _active()
    if rec is None:
        yield
        return
    rec.cov.switch_context(prop_name)
    provoke.current = prop_name
    try:
        yield
    finally:
        rec.cov.switch_context(NO_PROPERTY)
        provoke.current = NO_PROPERTY
        if time.monotonic() - rec.last_save > SAVE_EVERY:
            rec.save()


def flush() -> None:
    """Writes this process's record (its import's too); a worker calls it before it ends."""
    import_trace.save()
    rec = _recorder
    if rec is not None and rec.pid == os.getpid():
        with contextlib.suppress(Exception):
            rec.save()


#: Characters of a file list the environment carries itself; a longer one (a release's diff) goes in a
#: file named ``@PATH``: one variable past the kernel's 128 KiB would make every child's exec fail.
ENV_LIST_CAP = 16 << 10


def start(folder: Path, files: list[Path]) -> None:
    """Switches recording on for this process's future checks and for every child it starts."""
    folder.mkdir(parents=True, exist_ok=True)
    os.environ[DIR_ENV] = str(folder)
    joined = os.pathsep.join(str(f) for f in files)
    if len(joined) > ENV_LIST_CAP:
        listed = folder / "files.list"
        listed.write_text("\n".join(str(f) for f in files))
        joined = f"@{listed}"
    os.environ[FILES_ENV] = joined


def _listed(value: str) -> list[str]:
    """The files ``FILES_ENV`` names: os.pathsep-joined, or ``@PATH`` of a file holding one per line."""
    if value.startswith("@"):
        return [line for line in Path(value[1:]).read_text().splitlines() if line]
    return value.split(os.pathsep)


def observe_imports(folder: Path, files: list[str]) -> None:
    """Records, into ``folder``, the lines of ``files`` that this process's coming imports run (``import_trace``),
    until its own record starts (its first check), ``stop`` or ``imports_done``."""
    folder.mkdir(parents=True, exist_ok=True)
    import_trace.observe(folder, files, _no_origin_stack)


def observe_imports_from_environment() -> None:
    """``observe_imports`` where the environment already asks for a record (scripts/covered_files.py's run)."""
    folder, files = os.environ.get(DIR_ENV), os.environ.get(FILES_ENV)
    if folder and files:
        observe_imports(Path(folder), _listed(files))


def imports_observed() -> Path | None:
    """The folder this process's import is being recorded into, if it is."""
    return import_trace.observing()


def imports_for_checks():
    """Imports a property's check would make, made here before the forks: recorded as such."""
    return import_trace.for_checks()


def imports_done(keep: bool = True) -> None:
    """No more imports are observed here: their record is saved, or dropped (``keep=False``)."""
    import_trace.end(keep)


def stop() -> None:
    """Saves this process's record and switches recording off for what follows."""
    global _recorder
    import_trace.end(keep=False)
    flush()
    if _recorder is not None and _recorder.pid == os.getpid():
        with contextlib.suppress(Exception):
            _recorder.cov.stop()
    _recorder = None
    os.environ.pop(DIR_ENV, None)
    os.environ.pop(FILES_ENV, None)


def merged(folder: Path) -> dict[str, dict[int, set[str]]]:
    """Every record under ``folder`` joined: absolute file -> line -> the contexts it ran under."""
    import coverage
    data = coverage.CoverageData(basename=str(folder / "merged"), no_disk=True)
    for part in sorted(folder.glob("lines.*")):
        one = coverage.CoverageData(basename=str(part))
        one.read()
        data.update(one)
    out: dict[str, dict[int, set[str]]] = {}
    for name in data.measured_files():
        by_line = data.contexts_by_lineno(name)
        out[os.path.realpath(name)] = {line: set(ctxs) for line, ctxs in by_line.items()}
    return out


def direct_check(target):
    """``prop.check`` on ``target`` in this process, its lines recorded under the property."""
    from vmfuzz.harness.engine.core import output_record

    from vmfuzz.harness.engine.core.stack_room import roomy

    def check(prop, config, batches, device="cpu"):
        with judging(prop.name):
            # clear of a frame chunk's end, wherever the search called it from (see core.stack_room)
            return roomy(output_record.check_recorded, prop.check, target, prop.name, config, batches, device)
    return check
