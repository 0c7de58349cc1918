"""What the gate watches while its run runs: the changed lines it traces, and its coverage.

A gate given a change records which of the triggered SGLang files' lines ran,
here and in every worker (``line_trace``), from before the search until its
coverage is computed from what ran; the run's code (``execute_and_report``)
starts the watch, asks for the coverage once the outcome is known, and stops it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vmfuzz.harness.model.errors import UsageError


@dataclass
class GateWatch:
    """The gate's change (what it listed and what of it touches verify-mask code) and its line trace.

    Lines are traced only where the target runs SGLang (``traced``); the coverage is
    computed either way.
    """
    spec: str
    changed: list[str]
    hits: list[str]
    checkout: object  # vmfuzz.harness.engine.campaign.changes.Checkout, or None
    sglang_root: Path | None
    traced: bool = False
    tracing: Tracing | None = None

    def start(self) -> None:
        """Idempotent: a gate with a base starts it early, beside the base's replay."""
        if self.traced and self.tracing is None:
            self.tracing = _start_tracing(self.hits, self.checkout, measured_only(self.changed, self.hits))

    def coverage(self, target, outcome) -> dict:
        return _coverage(self.spec, target, self.changed, self.hits, self.sglang_root, self.tracing, outcome)

    def stop(self) -> None:
        if self.tracing is not None:
            _end_tracing(self.tracing)
            self.tracing = None


def measured_only(changed: list[str], hits: list[str]) -> list[str]:
    """The changed SGLang Python files no table triggers on (a new module the mask's code imports,
    a helper it calls): traced all the same, and judged when a property ran any of their lines."""
    from vmfuzz.harness.engine.campaign.changes import sglang_relative
    return [p for p in changed if p not in hits and p.endswith(".py") and sglang_relative(p) is not None]


def observe_imports(changed: list[str]) -> None:
    """Before the gate imports the code under test: the changed SGLang Python files' lines its import runs are
    recorded (``line_trace.observe_imports``), into the folder the watch then records its checks into."""
    import tempfile
    from importlib.util import find_spec
    from vmfuzz.harness.engine.core import line_trace
    try:
        spec = find_spec("sglang")  # where it will load from, found without running it
    except (ImportError, ValueError):
        return
    if spec is None or not spec.submodule_search_locations:
        return
    package = Path(list(spec.submodule_search_locations)[0])
    files = _names(package, {p: package / rel for p in changed
                             if (rel := _sglang_python(p)) is not None and (package / rel).is_file()})
    if files:
        line_trace.observe_imports(Path(tempfile.mkdtemp(prefix="vmfuzz-lines-")), files)


def drop_imports() -> None:
    """The gate ends before its watch starts (the code under test did not load): the import's record goes."""
    import shutil
    from vmfuzz.harness.engine.core import line_trace
    folder = line_trace.imports_observed()
    line_trace.imports_done(keep=False)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def _sglang_python(path: str) -> str | None:
    from vmfuzz.harness.engine.campaign.changes import sglang_relative
    rel = sglang_relative(path)
    return rel if rel is not None and rel.endswith(".py") else None


def _names(package: Path, files: dict) -> list[str]:
    """Both spellings of each file: a module imported through a symlinked folder runs under the link's name."""
    from vmfuzz.harness.engine.campaign.changes import sglang_relative
    return sorted({str(package / sglang_relative(p)) for p in files} | {str(Path(f).resolve()) for f in files.values()})


def _coverage(spec: str, target, changed, hits, sglang_root, tracing, outcome) -> dict:
    """The gate's coverage, computed from what ran, for the reports."""
    from vmfuzz.harness.engine.campaign.surface import gate_coverage
    where = {"checkout": str(sglang_root) if sglang_root else None}
    try:
        lines = _measured_lines(target, tracing) if tracing is not None else None
        if lines is not None:
            # a changed file no table named, whose code a property ran: measured onto the mask's path
            hits = hits + [p for p in tracing.extra if p in lines and lines[p].ran_under_property]
            lines = {p: m for p, m in lines.items() if p in hits}
        cov = gate_coverage(spec, target, changed, hits, outcome.results, lines=lines)
    except (ValueError, ImportError, OSError) as exc:
        # The reports are still written; the gate claims no coverage it cannot show.
        why = f"surface unavailable: {type(exc).__name__}: {exc}"
        cov = {"changed": changed, "triggered": hits, "exercised": [], "not_driven": hits,
               "why_not_driven": {p: why for p in hits},
               "could_not_check": [f"the changed lines could not be measured: {why}"]}
    stuck = out_of_step_coverage(hits, outcome)
    cov["could_not_check"] = cov.get("could_not_check", []) + sub_check_gaps(hits, outcome, cov)
    return {**cov, **where, **stuck}


class Tracing:
    """What the gate traces: each triggered path's file in the loaded SGLang and its changed lines."""

    def __init__(self, folder, files: dict, changed_lines: dict, untraced: dict, extra: list[str] = (),
                 checkout=None, probes: dict | None = None, reads: dict | None = None):
        self.folder = folder
        self.reads = reads or {}  # listed path -> its watched class defaults (``bound_at_import.read_plan``)
        self.checkout = checkout
        self.extra = [p for p in extra if p in files]  # traced though no table triggers on them
        self.probes = probes or {}  # listed path -> its changed expressions (``provoked``)
        self.files = files  # listed path -> absolute file traced
        self.changed_lines = changed_lines  # listed path -> frozenset of lines, or None (no diff)
        self.untraced = untraced  # listed path -> why it cannot be traced


def _start_tracing(hits: list[str], checkout, extra: list[str] = ()) -> Tracing:
    """Switches line recording on for the triggered SGLang Python files and ``extra``, here and in
    every worker."""
    import tempfile
    from vmfuzz.harness.engine.campaign import provoked
    from vmfuzz.harness.engine.core import line_trace, provoke
    from vmfuzz.harness.engine.campaign.change_paths import changed_lines
    from vmfuzz.harness.engine.campaign.changes import sglang_relative
    from vmfuzz.harness.engine.campaign.surface import known_reason, loaded_package
    package = loaded_package()
    from vmfuzz.harness.engine.campaign.surface import DELETED
    files, lines, untraced = {}, {}, {}
    root = getattr(checkout, "root", None)
    for path in [*hits, *extra]:
        rel = sglang_relative(path)
        if rel is None:
            continue
        real = package / rel
        if not rel.endswith(".py"):
            untraced[path] = f"not driven: {known_reason(rel)}"
            continue
        if not real.is_file():
            gone = root is not None and not (Path(root) / path).exists()
            untraced[path] = DELETED if gone else f"not driven: not found in the SGLang under test at {package}"
            continue
        files[path] = real.resolve()
        # an extra file's lines are read only if a property ran it (``_measured_lines``): a release's
        # diff lists thousands
        if path not in extra:
            lines[path] = changed_lines(checkout, path) if checkout is not None else None
    try:
        import coverage  # noqa: F401 - the measurement's tool: without it no line can be shown to run
    except ImportError:
        raise UsageError("vmfuzz gate: coverage (coverage.py) is not installed, so the gate cannot measure "
                         "which changed lines ran; reinstall vmfuzz (bash scripts/bootstrap.sh)") from None
    # the folder the import was recorded into, when it was (``observe_imports``): one record of the whole run
    folder = line_trace.imports_observed() or Path(tempfile.mkdtemp(prefix="vmfuzz-lines-"))
    line_trace.start(folder, _names(package, files))
    probes = provoked.plan_files(files, lines, checkout)
    reads = _class_defaults(files, lines)
    provoke.start(folder, [p.as_plan(str(files[path]), provoked.module_name(path))
                           for path, ps in probes.items() for p in ps if not p.unsafe]
                  + [r for rs in reads.values() for r in rs])
    provoke.install()  # here, once: the checkers forked from this process inherit the new code
    return Tracing(folder, files, lines, untraced, list(extra), checkout, probes, reads)


def _class_defaults(files: dict, lines: dict) -> dict[str, list[dict]]:
    """Listed path -> its changed class defaults, watched where they are looked up (``bound_at_import``)."""
    from vmfuzz.harness.engine.campaign import provoked
    from vmfuzz.harness.engine.campaign.bound_at_import import read_plan
    out = {}
    for n, (path, real) in enumerate(sorted(files.items())):
        changed = lines.get(path)
        if not changed:
            continue
        try:
            text = real.read_text(encoding="utf-8")
            plan = read_plan(text, changed, str(real), provoked.module_name(path), f"c{n}")
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue  # unread, unwatched: its class defaults are could not check, said so
        if plan:
            out[path] = plan
    return out


def _end_tracing(tracing: Tracing) -> None:
    import shutil
    from vmfuzz.harness.engine.core import line_trace, provoke
    line_trace.stop()
    provoke.stop()
    shutil.rmtree(tracing.folder, ignore_errors=True)


def _measured_lines(target, tracing: Tracing) -> dict:
    """Listed path -> ``diff_coverage.FileLines``: what ran of each triggered file, and under what."""
    from vmfuzz.harness.engine.core import line_trace, provoke
    from vmfuzz.harness.engine.campaign.changes import sglang_relative
    from vmfuzz.harness.engine.campaign.change_paths import changed_lines
    from vmfuzz.harness.engine.campaign.diff_coverage import measure, read_text, untraced
    from vmfuzz.harness.engine.campaign.operand_lines import settle_operands
    from vmfuzz.harness.engine.campaign.provoked_verdict import judge
    from vmfuzz.harness.engine.core.line_trace import is_check
    from vmfuzz.harness.engine.campaign.bound_at_import import reads
    from vmfuzz.harness.engine.campaign.diff_coverage import properties
    from vmfuzz.harness.engine.campaign.surface import loaded_package, sglang_rows
    line_trace.flush()
    broken = line_trace.failures(tracing.folder)
    if broken:
        raise OSError(f"a worker could not record its lines ({broken[0]})")
    ran = line_trace.merged(tracing.folder)
    counts = provoke.merged(tracing.folder)
    rows = sglang_rows(target, loaded_package())
    out = {}
    for path, why in tracing.untraced.items():
        out[path] = untraced(path, why)
    for path, real in tracing.files.items():
        if _past_measuring():
            out[path] = untraced(path, "not measured: the gate's time cap was reached first")
            continue
        if path in tracing.extra:
            if not any(is_check(ctx) for ctxs in ran.get(str(real), {}).values() for ctx in ctxs):
                continue  # no property ran it: not on the mask's path, and never measured
            tracing.changed_lines[path] = changed_lines(tracing.checkout, path) if tracing.checkout else None
        rel = sglang_relative(path)
        mask_functions = {}
        for r in rows:
            if r.file == rel and r.function:
                said = ", ".join(r.driven_by) if r.driven else f"not driven: {r.why}"
                mask_functions[r.function] = (mask_functions[r.function] + "; " + said
                                              if r.function in mask_functions else said)
        text = read_text(real)
        if text is None:
            out[path] = untraced(path, "could not be read back after the run")
            continue
        try:
            changed = tracing.changed_lines.get(path)
            at_import = reads(text, changed, ran.get(str(real), {}), properties, tracing.reads.get(path, []),
                              counts) if changed else None
            out[path] = measure(path, text, str(real), changed, mask_functions, ran.get(str(real), {}), at_import)
            judge(out[path], tracing.probes.get(path, []), counts)
            settle_operands(out[path])
        except SyntaxError as exc:
            out[path] = untraced(path, f"not driven: it does not parse ({exc.msg}, line {exc.lineno})")
    return out


def _past_measuring() -> bool:
    """Past the cap and part of its grace: the lines not yet measured are left (could not check), so
    the reports are written within the grace."""
    from vmfuzz.harness.engine.core import clock
    if not clock.running() or clock.left() > -0.25 * clock.grace(clock.cap()):
        return False
    clock.cut(f"the gate's time cap of {clock.cap():g} s was reached before every changed file's lines "
              "were measured")
    return True


def sub_check_gaps(hits: list[str], outcome, cov: dict) -> list[str]:
    """A promised sub-check no case judged, of a property that judges a changed file: could not check.

    "Judges" is measured where the lines were (the property ran a changed line or entered a
    changed mask-path function), else declared (the surface names the property for the file).
    """
    from vmfuzz.harness.engine.campaign.changes import sglang_relative
    from vmfuzz.harness.engine.campaign.surface import declared
    from vmfuzz.harness.properties import sub_checks_not_driven
    touched = {sglang_relative(p): p for p in hits}
    out = []
    for r in outcome.results:
        if r.findings or r.not_driven:
            continue
        gaps = sub_checks_not_driven(r.prop, r.classes)
        if not gaps:
            continue
        files = [f["path"] for f in cov.get("lines") or []
                 if any(r.prop in props for props in (f.get("judged") or {}).values())
                 or any(fn["entered"] and r.prop in fn["driven_by"] for fn in (f.get("functions") or {}).values())]
        files += [touched[e.file] for e in declared() if e.file in touched and r.prop in e.properties]
        if files:
            name, why = next(iter(gaps.items()))
            out.append(f"{r.prop}'s sub-check {name} was not judged ({why}), and {r.prop} judges the changed "
                       f"{sorted(set(files))[0]}" + (f" (and {len(gaps) - 1} more sub-check(s))" if len(gaps) > 1
                                                     else ""))
    return out


def out_of_step_coverage(hits: list[str], outcome) -> dict:
    """Which out-of-step checks drive a file the change touches (exit 3) and which do not (warnings).

    A check vmfuzz could not make on code the change does not touch does not
    stop the gate, but it is never silent: it is a warning in the summary.
    """
    from vmfuzz.harness.engine.campaign.changes import sglang_relative
    from vmfuzz.harness.engine.campaign.surface import declared
    from vmfuzz.harness.properties import PROPERTIES
    touched = {sglang_relative(p) for p in hits}
    files: dict[str, set[str]] = {}
    for e in declared():
        for prop in e.properties:
            files.setdefault(prop, set()).add(e.file)
    stuck, warnings = [], []
    lost = {r.prop for r in getattr(outcome, "results", ()) if getattr(r, "lane_lost", False)}
    for what, why in outcome.out_of_step:
        hit = sorted(files.get(what, set()) & touched)
        if what in lost:  # nothing of it was searched: the gate cannot say what it drives went unjudged
            stuck.append(f"{why} ({what}: its search was lost, whatever the change touched)")
        elif what not in files and what not in PROPERTIES:  # a saved repro: never a pass, whatever changed
            stuck.append(f"{why} (saved repro {what})")
        elif hit:
            stuck.append(f"{why} (needed by {what}, which drives the changed {hit[0]})")
        else:
            warnings.append(f"{what} could not be checked (it drives no changed file): out of step: {why}")
    return {"out_of_step": stuck, "warnings": warnings}
