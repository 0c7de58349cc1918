"""Did the changed lines run, and under a property that judged them? The gate's "exercised".

A file counts as exercised only from a measurement (``line_trace``): each
changed statement of a function on the mask's path (one ``vmfuzz surface``
lists) must have executed inside a property's check. What else a change holds
is sorted, never dropped:

- ``judged``: ran inside a property's check (which properties, per statement);
- ``at import``: module-level code and ``def``/``class`` headers, which run when
  the module loads; a changed header still needs its function entered;
- ``outside``: in a function no surface row names (decode or prefill only, a
  helper nothing on the path calls) that no check ran: named as outside what
  the gate judges, not a failure;
- ``never ran``: on the mask's path and run by no check: the gate cannot vouch
  for it (exit 3), and says what would drive it where that is known.

Without a diff (``--changed-files`` alone) the changed lines are unknown, so each
mask-path function of the file must be entered, and its line coverage is
reported, not required.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from vmfuzz.harness.engine.core.line_trace import NO_PROPERTY
from vmfuzz.harness.model.device_only import device_branch
from vmfuzz.harness.report.terminal import spans  # noqa: F401 - re-exported: the gate's messages use it

#: Branches this machine could take but vmfuzz does not, keyed by the branch's condition as the
#: source spells it: not the code under test. What no CPU can take at all is the reviewed table
#: ``vmfuzz.harness.model.device_only`` ("needs a GPU"), never this one.
CPU_CANNOT_TAKE = {
    "_is_cpu": "CPU-engine branch: needs SGLANG_USE_CPU_ENGINE, whose kernels are not the code under test",
    "is_cpu()": "CPU-engine branch: needs SGLANG_USE_CPU_ENGINE, whose kernels are not the code under test",
}


#: Branches off the mask's path inside a mask-path function: a backend's one metadata method
#: serves every forward mode, and only its target-verify branch reads the mask. Keyed, like
#: ``CPU_CANNOT_TAKE``, by the branch's condition as the source spells it, and shipped here:
#: each is a mode test that is False for TARGET_VERIFY (a branch under it never runs for a
#: verify step), or a test that there is no speculative input at all.
OFF_MASK_PATH = re.compile(
    r"^(?:\w+\.)*forward_mode\.(?:is_decode_or_idle|is_decode|is_idle|is_draft_extend|is_draft_extend_v2|"
    r"is_dllm_extend|is_prefill|is_mixed)\(\)$"
    r"|^not \(?(?:\w+\.)*forward_mode\.is_target_verify\(\)\)?$"
    r"|^(?:\w+\.)*encoder_lens is not None$"
    r"|^(?:\w+\.)*spec_info is None$|^not \(?(?:\w+\.)*spec_info is not None\)?$")


def off_mask_path(conditions: tuple[str, ...]) -> str | None:
    """Why a branch under these conditions is not on the mask's path (``OFF_MASK_PATH``), or None."""
    for cond in conditions:
        if OFF_MASK_PATH.match(cond):
            return f"off the mask's path: runs only when {cond}"
    return None


@dataclass(frozen=True)
class Statement:
    """One executable statement: the lines it spans and what encloses it."""

    first: int
    last: int
    function: str  # qualified name of the innermost enclosing function ("" at module level)
    header: bool  # a def/class header (with decorators): runs at import
    conditions: tuple[str, ...]  # the tests of the if-statements around it, outermost first


@dataclass
class Source:
    """A file's statements and functions, from its text alone."""

    statements: list[Statement]
    functions: dict[str, tuple[int, int]]  # qualified name -> (first, last line), decorators included

    def statement_at(self, line: int) -> Statement | None:
        best = None
        for s in self.statements:
            if s.first <= line <= s.last and (best is None or s.first >= best.first):
                best = s
        return best

    def resolve(self, declared: str) -> list[str]:
        """The qualified names a surface row's ``Class.method`` or ``name`` means here.

        The row's class may be spelled as SGLang's docs spell it rather than as the
        file does (a mixin); a method of that name in any class then stands for it.
        """
        if declared in self.functions:
            return [declared]
        last = declared.split(".")[-1]
        return [q for q in self.functions if q.split(".")[-1] == last]


def parse(text: str) -> Source:
    tree = ast.parse(text)
    statements: list[Statement] = []
    functions: dict[str, tuple[int, int]] = {}

    def first_line(node) -> int:
        decorators = getattr(node, "decorator_list", None) or []
        return min([node.lineno] + [d.lineno for d in decorators])

    def walk(body, scope: str, function: str, conditions: tuple[str, ...]):
        for i, node in enumerate(body):
            if not isinstance(node, ast.stmt):
                continue
            # a docstring compiles to nothing that runs
            if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str):
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = f"{scope}.{node.name}" if scope else node.name
                start = first_line(node)
                statements.append(Statement(start, node.body[0].lineno - 1 if node.body[0].lineno > node.lineno
                                            else node.lineno, function, True, conditions))
                if not isinstance(node, ast.ClassDef):
                    functions[qual] = (start, node.end_lineno)
                    walk(node.body, qual, qual, ())
                else:
                    functions[qual] = (start, node.end_lineno)
                    walk(node.body, qual, function, conditions)
                continue
            blocks = [(name, getattr(node, name)) for name in ("body", "orelse", "finalbody")
                      if isinstance(getattr(node, name, None), list) and getattr(node, name)]
            handlers = getattr(node, "handlers", None) or []
            cases = getattr(node, "cases", None) or []
            if not blocks and not handlers and not cases:
                statements.append(Statement(node.lineno, node.end_lineno, function, False, conditions))
                continue
            inner = [b for _, b in blocks] + [h.body for h in handlers] + [c.body for c in cases]
            first_child = min(b[0].lineno for b in inner)
            statements.append(Statement(node.lineno, max(node.lineno, first_child - 1), function, False, conditions))
            test = ast.unparse(node.test) if isinstance(node, (ast.If, ast.While)) else None
            for name, block in blocks:
                cond = conditions
                if test is not None:
                    cond = conditions + ((test,) if name == "body" else (f"not ({test})",))
                walk(block, scope, function, cond)
            for h in handlers:
                walk(h.body, scope, function, conditions)
            for c in cases:
                walk(c.body, scope, function, conditions)

    walk(tree.body, "", "", ())
    return Source(statements, functions)


def cpu_cannot_take(conditions: tuple[str, ...]) -> str | None:
    """Why this machine never takes a branch under these conditions (the shipped table), or None."""
    for cond in conditions:
        for key, why in CPU_CANNOT_TAKE.items():
            # the condition names the flag itself, alone or in a conjunction (``_is_hip and x``)
            if cond == key or cond.startswith(f"{key} and ") or f" and {key}" in cond:
                return why
    return None


@dataclass
class FileLines:
    """What the gate measured of one changed file."""

    path: str  # as the change lists it
    traced: str | None = None  # the absolute file that was traced (None: not a traceable SGLang file)
    changed: list[int] | None = None  # changed executable statements' first lines (None: no diff known)
    judged: dict[int, list[str]] = field(default_factory=dict)  # first line -> properties that ran it
    at_import: list[int] = field(default_factory=list)
    outside: list[int] = field(default_factory=list)
    never_ran: list[int] = field(default_factory=list)  # required, run by no property
    #: required, under a branch no CPU takes (``device_only``): could not check, and needs a GPU
    needs_device: list[int] = field(default_factory=list)
    why_device: dict[int, str] = field(default_factory=dict)
    functions: dict[str, dict] = field(default_factory=dict)  # mask-path function -> entered, coverage
    why_never: dict[int, str] = field(default_factory=dict)  # what would drive a line, where known
    why_outside: dict[int, str] = field(default_factory=dict)  # a mask-path function's off-path branch
    why_untraced: str = ""
    #: ran under a property, but no example made its changed expression differ from the base's (``provoked``)
    unprovoked: list[int] = field(default_factory=list)
    why_unprovoked: dict[int, str] = field(default_factory=dict)
    rules: dict[int, str] = field(default_factory=dict)  # judged line -> the rule that judged it

    @property
    def exercised(self) -> bool:
        if self.traced is None or self.never_ran or self.needs_device or self.unprovoked:
            return False
        if any(not f["entered"] for f in self.functions.values()):
            return False
        return bool(self.judged) or any(f["entered"] for f in self.functions.values())

    def as_dict(self) -> dict:
        return {"path": self.path, "traced": self.traced, "exercised": self.exercised,
                "changed_lines": self.changed,
                "judged": {str(k): v for k, v in sorted(self.judged.items())},
                "at_import": self.at_import, "outside": self.outside, "never_ran": self.never_ran,
                "needs_device": self.needs_device,
                "why_needs_device": {str(k): v for k, v in sorted(self.why_device.items())},
                "why_never_ran": {str(k): v for k, v in sorted(self.why_never.items())},
                "why_outside": {str(k): v for k, v in sorted(self.why_outside.items())},
                "functions": self.functions, "unprovoked": self.unprovoked,
                "why_unprovoked": {str(k): v for k, v in sorted(self.why_unprovoked.items())},
                "rules": {str(k): v for k, v in sorted(self.rules.items())},
                **({"why_untraced": self.why_untraced} if self.why_untraced else {})}


def _properties(contexts: set[str]) -> list[str]:
    """The registered properties a set of contexts names (a shared group's name stands for its members)."""
    from vmfuzz.harness.properties.shared import group_members
    out: set[str] = set()
    for ctx in contexts:
        if ctx == NO_PROPERTY:
            continue
        out.update(group_members(ctx) or (ctx,))
    return sorted(out)


def measure(path: str, text: str, traced: str, changed: frozenset[int] | None,
            mask_functions: dict[str, str], ran: dict[int, set[str]]) -> FileLines:
    """One file's verdict.

    ``mask_functions``: the surface's functions of this file (as it declares them) ->
    what drives them (its properties, or why nothing does). ``ran``: line -> contexts.
    """
    src = parse(text)
    out = FileLines(path, traced)
    on_path: dict[str, str] = {}  # qualified name -> what drives it
    for declared, driver in mask_functions.items():
        for qual in src.resolve(declared):
            on_path[qual] = driver

    def judged_by(first: int, last: int) -> list[str]:
        ctxs: set[str] = set()
        for n in range(first, last + 1):
            ctxs |= ran.get(n, set())
        return _properties(ctxs)

    def inside(qual: str) -> str | None:
        """The mask-path function ``qual`` is, or lies in."""
        while qual:
            if qual in on_path:
                return qual
            qual = qual.rpartition(".")[0]
        return None

    # each mask-path function: entered under a property, and how much of it ran
    for qual, driver in on_path.items():
        lo, hi = src.functions[qual]
        body = [s for s in src.statements if lo <= s.first <= hi and not s.header and s.function]
        hit = [s for s in body if judged_by(s.first, s.last)]
        out.functions[qual] = {"entered": bool(hit), "statements": len(body), "ran": len(hit),
                               "driven_by": driver}

    if changed is None:
        out.functions = {q: f for q, f in out.functions.items()}
        return out
    # with a diff, only the functions a change touches must be entered
    touched: set[str] = set()
    firsts: set[int] = set()
    for line in sorted(changed):
        s = src.statement_at(line)
        if s is None or s.first in firsts:
            continue
        firsts.add(s.first)
        props = judged_by(s.first, s.last)
        if s.header:
            qual = next((q for q, (lo, _) in src.functions.items() if lo == s.first), "")
            home = inside(qual) if qual else None
            if home:
                touched.add(home)
            out.at_import.append(s.first)
            continue
        home = inside(s.function) if s.function else None
        if props:
            out.judged[s.first] = props
            if home:
                touched.add(home)
        elif not s.function:
            out.at_import.append(s.first)
        elif home is None:
            out.outside.append(s.first)
        elif (off := off_mask_path(s.conditions)) is not None:
            out.outside.append(s.first)
            out.why_outside[s.first] = off
        elif (device := device_branch(s.conditions)) is not None:
            out.needs_device.append(s.first)
            out.why_device[s.first] = device
        else:
            touched.add(home)
            out.never_ran.append(s.first)
            why = cpu_cannot_take(s.conditions)
            out.why_never[s.first] = f"not driven: {why}" if why else f"{home}: {on_path[home]}"
    out.changed = sorted(firsts)
    out.functions = {q: f for q, f in out.functions.items() if q in touched}
    return out


def untraced(path: str, why: str) -> FileLines:
    return FileLines(path, None, why_untraced=why)


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
