"""``vmfuzz surface``: each part of SGLang that touches the verify mask, and what drives it.

The rows come from two places that must agree:

- what the target *declares*: every module under ``harness/targets/sglang/``
  may carry ``SURFACE``, a tuple of ``(sglang-relative file, function,
  (property, ...))`` entries naming the SGLang code that module drives and the
  properties that run through it. The collector walks the package, so a new
  module is picked up without editing this file. A module may also carry
  ``NOT_DRIVEN``, ``(file, function, reason)`` entries for the SGLang code next
  to what it drives that it does not reach, and why: each is a row, and its
  reason is the file's reason when nothing drives the file;
- what the code under test *contains*: every file of the loaded SGLang package
  whose text names verify-mask code (``vmfuzz.harness.engine.campaign.changes.MASK_CODE``; the same test
  the gate triggers on; test files excluded).

A declared property counts as driving only if it is registered in
``PROPERTIES`` and the target has the seams it ``needs``, and a declared
function only if this SGLang still has it: a row never says "driven" on the
strength of a declaration alone. A file the grep finds and nothing declares is
listed "not driven", with the reason a module gives for it (``NOT_DRIVEN``), else
a structural one (``KNOWN_REASONS``), else "no driver yet".
"""

from __future__ import annotations

import fnmatch
import importlib
import os
import pkgutil
import re
from dataclasses import dataclass, field
from pathlib import Path

from vmfuzz.harness.engine.campaign.changes import READ_CAP, path_names_mask_code, sglang_relative
from vmfuzz.harness.model.device_only import GPU_CHECK

#: The package whose modules declare SGLang's driven parts.
DECLARING_PACKAGE = "vmfuzz.harness.targets.sglang"

#: Source files the grep reads (what the gate's acceptance grep reads).
GREP_SUFFIXES = (".py", ".cu", ".cuh")

#: Why a file the grep finds has no driver, when no module says (``NOT_DRIVEN``)
#: and the reason is a class of file rather than "not written yet" (first match
#: wins; sglang-relative patterns). Reasons about one file live in the module
#: that drives its neighbours.
KNOWN_REASONS = (
    ("*_hip*", "HIP-only backend: needs a ROCm device"),
    ("kernels/jit/*", "JIT CUDA kernel: GPU only (scripts/gpu_check.sh)"),
)
NO_DRIVER = "no driver yet"


@dataclass(frozen=True)
class Entry:
    """One declared part: ``function`` of ``file`` runs under ``properties``."""

    file: str
    function: str
    properties: tuple[str, ...]
    module: str  # the harness module that declares it


@dataclass
class Row:
    file: str
    function: str = ""
    driven_by: tuple[str, ...] = ()
    why: str = ""  # why not driven ("" when driven)
    declared_by: str = ""
    in_grep: bool = True  # the file names verify-mask code in this SGLang
    listed: tuple[str, ...] = field(default=())

    @property
    def driven(self) -> bool:
        return bool(self.driven_by)

    def as_dict(self) -> dict:
        return {"file": self.file, "function": self.function or None, "driven": self.driven,
                "driven_by": list(self.driven_by), "why": self.why or None, "declared_by": self.declared_by or None,
                "names_mask_code": self.in_grep}


# -- what the target declares ---------------------------------------------------

def _check_entry(module: str, entry) -> Entry:
    ok = (isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[0], str) and entry[0]
          and isinstance(entry[1], str) and isinstance(entry[2], tuple)
          and all(isinstance(p, str) for p in entry[2]))
    if not ok or entry[0].startswith(("/", "sglang/", "python/")) or ".." in entry[0].split("/"):
        raise ValueError(f"{module}.SURFACE: bad entry {entry!r}: want (sglang-relative path like "
                         "'srt/speculative/eagle_utils.py', function, (property, ...))")
    return Entry(entry[0], entry[1], entry[2], module)


def _modules(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    return [package] + sorted(m.name for m in pkgutil.walk_packages(pkg.__path__, package + "."))


def declared(package: str = DECLARING_PACKAGE) -> list[Entry]:
    """Every ``SURFACE`` entry of ``package`` and the modules under it."""
    out = []
    for name in _modules(package):
        surface = getattr(importlib.import_module(name), "SURFACE", None)
        if surface is None:
            continue
        if not isinstance(surface, tuple):
            raise ValueError(f"{name}.SURFACE must be a tuple of entries")
        out += [_check_entry(name, e) for e in surface]
    return out


@dataclass(frozen=True)
class Undriven:
    """One ``NOT_DRIVEN`` entry: ``function`` of ``file`` is not driven, for ``why``."""

    file: str
    function: str
    why: str
    module: str


def not_driven(package: str = DECLARING_PACKAGE) -> list[Undriven]:
    """Every ``NOT_DRIVEN`` entry of ``package`` and the modules under it."""
    out = []
    for name in _modules(package):
        entries = getattr(importlib.import_module(name), "NOT_DRIVEN", None)
        if entries is None:
            continue
        if not isinstance(entries, tuple):
            raise ValueError(f"{name}.NOT_DRIVEN must be a tuple of entries")
        for e in entries:
            ok = (isinstance(e, tuple) and len(e) == 3 and all(isinstance(x, str) for x in e) and e[0] and e[2])
            if not ok or e[0].startswith(("/", "sglang/", "python/")) or ".." in e[0].split("/"):
                raise ValueError(f"{name}.NOT_DRIVEN: bad entry {e!r}: want (sglang-relative path, "
                                 "function or '', reason)")
            out.append(Undriven(e[0], e[1], e[2], name))
    return out


def driving(target, properties: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """(the properties that can run on ``target``, why the others cannot)."""
    from vmfuzz.harness.properties import PROPERTIES
    ok, why = [], []
    for name in properties:
        prop = PROPERTIES.get(name)
        if prop is None:
            why.append(f"{name} is not a registered property")
        elif missing := prop.missing(target):
            why.append(f"{name} needs {', '.join(missing)}, which {getattr(target, 'name', 'the target')} lacks")
        else:
            ok.append(name)
    return tuple(ok), "; ".join(why)


# -- what the code under test contains ------------------------------------------

def grep_package(pkg: Path) -> list[str]:
    """Sglang-relative paths of the source files that name verify-mask code (tests excluded)."""
    hits = []
    # followlinks: the altered copies tests build mirror the package with symlinked folders.
    for dirpath, dirnames, filenames in os.walk(pkg, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        rel_dir = os.path.relpath(dirpath, pkg)
        for name in sorted(filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
            if name.endswith(GREP_SUFFIXES) and "test" not in rel and path_names_mask_code(Path(dirpath) / name):
                hits.append(rel)
    return sorted(hits)


def _text(pkg: Path, rel: str) -> bytes | None:
    path = pkg / rel
    try:
        with open(path, "rb") as f:
            return f.read(READ_CAP)
    except OSError:
        return None


def _has(text: bytes, function: str) -> bool:
    """``Class.method`` or ``name``: each part appears as a word in the file."""
    return all(re.search(rb"\b" + re.escape(part.encode()) + rb"\b", text) for part in function.split("."))


def known_reason(rel: str, undriven: list[Undriven] | None = None) -> str:
    """Why nothing drives ``rel``: what a module says of it, else a class of file, else none known."""
    undriven = not_driven() if undriven is None else undriven
    said = [u.why for u in undriven if u.file == rel]
    if said:
        return "; ".join(dict.fromkeys(said))
    return next((why for pat, why in KNOWN_REASONS if fnmatch.fnmatchcase(rel, pat)), NO_DRIVER)


def sglang_rows(target, pkg: Path, entries: list[Entry] | None = None,
                undriven: list[Undriven] | None = None) -> list[Row]:
    """One row per declared function, one per ``NOT_DRIVEN`` entry, and one per
    grep-found file neither names."""
    entries = declared() if entries is None else entries
    undriven = not_driven() if undriven is None else undriven
    found = set(grep_package(pkg))
    by_file: dict[str, list[Entry]] = {}
    for e in entries:
        by_file.setdefault(e.file, []).append(e)
    said: dict[str, list[Undriven]] = {}
    for u in undriven:
        said.setdefault(u.file, []).append(u)
    rows = []
    for rel in sorted(found | set(by_file) | set(said)):
        if rel not in by_file and rel not in said:
            rows.append(Row(rel, why=known_reason(rel, undriven)))
        text = _text(pkg, rel) if rel in by_file else None
        for e in by_file.get(rel, ()):
            row = Row(rel, e.function, declared_by=e.module, in_grep=rel in found, listed=e.properties)
            if text is None:
                row.why = "not in this SGLang"
            elif e.function and not _has(text, e.function):
                row.why = f"{e.function} not found in this SGLang's {rel}"
            else:
                row.driven_by, row.why = driving(target, e.properties)
                if row.driven_by:
                    row.why = ""
                elif not row.why:
                    row.why = "declared with no property"
            rows.append(row)
        for u in said.get(rel, ()):
            rows.append(Row(rel, u.function, why=u.why, declared_by=u.module, in_grep=rel in found))
    return rows


def model_rows(target) -> list[Row]:
    """A target that runs no SGLang code: what its model covers, one row per property."""
    from vmfuzz.harness.properties import PROPERTIES
    rows = []
    for prop in PROPERTIES.values():
        ok, why = driving(target, (prop.name,))
        rows.append(Row(getattr(target, "name", "model"), prop.summary, ok, why))
    return rows


def runs_sglang(spec: str) -> bool:
    """Does the target spec (``sglang``, ``sglang+pr33127``) run the installed SGLang's code?"""
    return spec.split("+")[0] == "sglang"


def loaded_package() -> Path:
    """The SGLang package the target loaded (an altered copy when PYTHONPATH puts one first)."""
    from vmfuzz.harness.targets.sglang.loader import imported_sglang
    return imported_sglang()[1]


# -- the command ----------------------------------------------------------------

def _table(rows: list[Row], headers: tuple[str, str, str]) -> str:
    cells = [(r.file, r.function or "-", ", ".join(r.driven_by) if r.driven else f"not driven: {r.why}")
             for r in rows]
    w0 = max([len(headers[0])] + [len(c[0]) for c in cells])
    w1 = max([len(headers[1])] + [len(c[1]) for c in cells])
    lines = [f"{headers[0]:<{w0}}  {headers[1]:<{w1}}  {headers[2]}"]
    lines += [f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in cells]
    return "\n".join(lines)


def report(spec: str, target) -> dict:
    """What ``vmfuzz surface`` prints, as data."""
    if not runs_sglang(spec):
        rows = model_rows(target)
        return {"target": spec, "runs_sglang": False, "rows": [r.as_dict() for r in rows], "_rows": rows}
    from vmfuzz.harness.targets.sglang.loader import imported_sglang
    version, pkg = imported_sglang()
    rows = sglang_rows(target, pkg)
    files = sorted({r.file for r in rows if r.in_grep})
    driven = sorted({r.file for r in rows if r.driven and r.in_grep})
    return {"target": spec, "runs_sglang": True, "package": str(pkg),
            "versions": {"sglang": version},
            "files": {"names_mask_code": len(files), "driven": len(driven), "not_driven": len(files) - len(driven)},
            "rows": [r.as_dict() for r in rows], "_rows": rows}


def render(rep: dict) -> str:
    rows = rep["_rows"]
    if not rep["runs_sglang"]:
        head = (f"target {rep['target']}: runs no SGLang code, so it exercises no SGLang file; "
                "rows are what its model covers, one per property")
        return head + "\n" + _table(rows, ("model", "part", "driven by"))
    f = rep["files"]
    head = (f"target {rep['target']}: sglang {rep['versions']['sglang']} at {rep['package']}\n"
            f"{f['names_mask_code']} file(s) name verify-mask code (tests excluded): "
            f"{f['driven']} driven, {f['not_driven']} not driven")
    return head + "\n" + _table(rows, ("file (sglang/)", "function", "driven by"))


# -- what a gate run exercised --------------------------------------------------

def gate_coverage(spec: str, target, changed: list[str], triggered: list[str], results,
                  package: Path | None = None, lines: dict | None = None) -> dict:
    """The gate object of summary.json: which triggered files a property actually ran through.

    ``lines``: path -> ``diff_coverage.FileLines``, what the gate measured of each triggered
    file. With it, "exercised" is the measurement's: the file's changed lines on the mask's
    path ran inside a property's check. Without it (a target that runs no SGLang code) no file
    is exercised.
    """
    from vmfuzz.harness.model.device_only import device_file
    lines = lines or {}
    exercised, not_driven, why, stuck = [], [], {}, []
    for path in triggered:
        rel = sglang_relative(path)
        measured = lines.get(path)
        if measured is not None and measured.exercised:
            exercised.append(path)
            continue
        not_driven.append(path)
        if not runs_sglang(spec):
            why[path] = f"target {spec} runs its own model, not SGLang's code"
        elif device_file(path) and (measured is None or measured.traced is None):
            # a kernel source wherever the checkout keeps it (sgl-kernel/csrc, jit/csrc): it is the
            # mask's code all the same, and no CPU runs it
            why[path] = f"{NEEDS_GPU}: {device_file(path)}"
            stuck.append(f"{path}: {why[path]}; check it with {GPU_CHECK}")
        elif rel is None:
            why[path] = "not an SGLang file"
        elif measured is None:
            why[path] = "not measured"
            stuck.append(f"{path}: not measured (no record of its lines)")
        else:
            why[path], blocking = _why_not_exercised(measured)
            stuck += blocking
    return {"changed": list(changed), "triggered": list(triggered), "exercised": exercised,
            "not_driven": not_driven, "why_not_driven": why,
            "lines": [m.as_dict() for m in lines.values()], "could_not_check": stuck,
            # both exit 3; these are the ones a GPU runner checks, the rest vmfuzz's to drive here
            "needs_gpu": [line for line in stuck if NEEDS_GPU in line], "gpu_check": GPU_CHECK}


#: why a triggered file has no lines to measure: the change deleted it (its callers are measured)
DELETED = "deleted by the change"

#: the words every could-not-check line of a line or file no CPU runs carries (``device_only``)
NEEDS_GPU = "needs a GPU"


def _why_not_exercised(measured) -> tuple[str, list[str]]:
    """(why a measured file is not exercised, the could-not-check lines it gives: exit 3)."""
    from vmfuzz.harness.engine.campaign.diff_coverage import spans
    from vmfuzz.harness.report.terminal import shown
    name = shown(measured.path)
    if measured.traced is None:  # only a file the change deleted has no lines left to judge
        return measured.why_untraced, [] if measured.why_untraced == DELETED else [f"{name}: {measured.why_untraced}"]
    stuck = []
    if measured.needs_device:
        whys = sorted(set(measured.why_device.values()))
        word = "line" if len(measured.needs_device) == 1 else "lines"
        stuck.append(f"{name} {word} {spans(measured.needs_device)} {NEEDS_GPU} ({'; '.join(whys)}); "
                     f"check them with {GPU_CHECK}")
    unrun = [n for n in measured.never_ran if n not in measured.at_import]
    if unrun:
        whys = sorted({measured.why_never.get(n, "") for n in unrun})
        word = "line" if len(unrun) == 1 else "lines"
        stuck.append(f"{name} {word} {spans(unrun)} never ran ({'; '.join(whys)})")
    if measured.at_import:  # ran, once, at import: what judges it is a property's read (``bound_at_import``)
        whys = sorted({measured.why_never.get(n, "") for n in measured.at_import})
        word = "line" if len(measured.at_import) == 1 else "lines"
        stuck.append(f"{name} {word} {spans(measured.at_import)} ran only at import, and no property judged "
                     f"{'it' if len(measured.at_import) == 1 else 'them'} ({'; '.join(whys)})")
    for line in measured.unprovoked:
        stuck.append(f"{name} line {line} ran, but no example made it differ from the base: "
                     f"{measured.why_unprovoked.get(line, '')}")
    for qual, f in measured.functions.items():
        if not f["entered"]:
            stuck.append(f"{name}: {qual} never ran ({f['driven_by']})")
    if measured.changed is None and not measured.ran_under_property and not measured.functions:
        stuck.append(f"{name}: no line of it ran under a property")
    if stuck:
        return "; ".join(stuck), stuck
    if not measured.changed:
        return "no changed statement (comments or blank lines, or a move followed by content)", []
    return "its changed lines are pure definitions (imports, typing), nothing to judge", []
