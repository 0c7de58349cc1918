"""Did the changed lines run, and under a property that judged them? The gate's "exercised".

A measurement decides, never a table: each changed statement of a triggered
file is one of

- ``judged``: coverage.py saw it run inside a property's check (which
  properties, per statement);
- a pure ``definition``: an ``import``, an ``@overload`` stub, an ``if
  TYPE_CHECKING:`` block, a bare annotation, ``pass``/``...``, ``__all__``; a
  changed ``def`` header counts only once its function ran under a property
  (a default value is code);
- ``needs_device``: run by no property, under a branch no CPU takes
  (``vmfuzz.harness.model.device_only``): could not check, needs a GPU;
- ``never_ran``: run by no property: could not check (exit 3), whatever encloses
  it. The surface table and ``OFF_MASK_PATH`` only say why and what would drive it.

Module-level and class-body lines run once, at import, and the import is observed
like any check (``core.import_trace``), never assumed. Having run there is not
being judged: such a line is judged only when it bound a literal scalar and a
property's check then read it (``bound_at_import``: why, and how a read is
measured); one nobody read is could not check, naming it. Whether its import ran
inside a check or before the forks changes nothing: an import is no judgement.

Without a diff (``--changed-files`` alone) the changed lines are unknown, so each
mask-path function of the file must be entered, and its line coverage is
reported, not required.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from vmfuzz.harness.engine.campaign.operand_lines import code_lines, ran_around, unrun_lines

from vmfuzz.harness.engine.core.line_trace import is_check
from vmfuzz.harness.model.device_only import device_branch, device_file
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
    conditions: tuple[str, ...]  # the tests of the if-statements (a loop's: what it iterates) around it, outermost first
    definition: str = ""  # why it is a pure definition that runs nothing to judge ("" when it is code)
    scope: str = ""  # the class whose body holds it, when no function does


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


def _is_overload(node) -> bool:
    return any(ast.unparse(d).split(".")[-1] == "overload" for d in getattr(node, "decorator_list", ()))


def _is_type_checking(node) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test).split(".")[-1] == "TYPE_CHECKING"


def definition_kind(node: ast.stmt) -> str:
    """Why a simple statement runs nothing a property could judge, or "" when it is code."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return "import"
    if isinstance(node, ast.AnnAssign) and node.value is None:
        return "annotation"
    if isinstance(node, ast.Pass) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                                      and node.value.value is Ellipsis):
        return "empty body"
    if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]:
        return "export list"
    return ""


def parse(text: str) -> Source:
    tree = ast.parse(text)
    statements: list[Statement] = []
    functions: dict[str, tuple[int, int]] = {}

    def first_line(node) -> int:
        decorators = getattr(node, "decorator_list", None) or []
        return min([node.lineno] + [d.lineno for d in decorators])

    def walk(body, scope: str, function: str, conditions: tuple[str, ...], typing: str):
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
                kind = typing or ("overload stub" if _is_overload(node) else "")
                statements.append(Statement(start, node.body[0].lineno - 1 if node.body[0].lineno > node.lineno
                                            else node.lineno, function, True, conditions, kind))
                functions[qual] = (start, node.end_lineno)
                if isinstance(node, ast.ClassDef):
                    walk(node.body, qual, function, conditions, kind)
                else:
                    walk(node.body, qual, qual, (), kind)
                continue
            blocks = [(name, getattr(node, name)) for name in ("body", "orelse", "finalbody")
                      if isinstance(getattr(node, name, None), list) and getattr(node, name)]
            handlers = getattr(node, "handlers", None) or []
            cases = getattr(node, "cases", None) or []
            if not blocks and not handlers and not cases:
                statements.append(Statement(node.lineno, node.end_lineno, function, False, conditions,
                                            typing or definition_kind(node), "" if function else scope))
                continue
            inner = [b for _, b in blocks] + [h.body for h in handlers] + [c.body for c in cases]
            first_child = min(b[0].lineno for b in inner)
            block_kind = typing or ("TYPE_CHECKING block" if _is_type_checking(node) else "")
            statements.append(Statement(node.lineno, max(node.lineno, first_child - 1), function, False, conditions,
                                        block_kind, "" if function else scope))
            test = ast.unparse(node.test) if isinstance(node, (ast.If, ast.While)) else None
            # a loop's body runs only when what it iterates holds something; its else runs either way
            loop = ast.unparse(node.iter) if isinstance(node, (ast.For, ast.AsyncFor)) else None
            for name, block in blocks:
                cond = conditions
                if test is not None:
                    cond = conditions + ((test,) if name == "body" else (f"not ({test})",))
                elif loop is not None and name == "body":
                    cond = conditions + (loop,)
                # only the TYPE_CHECKING branch is typing: its else runs
                walk(block, scope, function, cond, block_kind if name == "body" else typing)
            for h in handlers:
                walk(h.body, scope, function, conditions, typing)
            for c in cases:
                walk(c.body, scope, function, conditions, typing)

    walk(tree.body, "", "", (), "")
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
    definitions: list[int] = field(default_factory=list)  # pure definitions: nothing to judge
    never_ran: list[int] = field(default_factory=list)  # run by no property: could not check
    #: of ``never_ran``: module-level or class-body lines that ran at import, which no property's check read
    at_import: list[int] = field(default_factory=list)
    #: run by no property, under a branch no CPU takes (``device_only``): could not check, and needs a GPU
    needs_device: list[int] = field(default_factory=list)
    why_device: dict[int, str] = field(default_factory=dict)
    functions: dict[str, dict] = field(default_factory=dict)  # mask-path function -> entered, coverage
    why_never: dict[int, str] = field(default_factory=dict)  # why, and what would drive a line, where known
    why_untraced: str = ""
    #: ran under a property, but no example made its changed expression differ from the base's (``provoked``)
    unprovoked: list[int] = field(default_factory=list)
    why_unprovoked: dict[int, str] = field(default_factory=dict)
    rules: dict[int, str] = field(default_factory=dict)  # judged line -> the rule that judged it
    #: judged statements whose changed line with code of its own never ran -> why (``settle_operands``)
    operands_unrun: dict[int, str] = field(default_factory=dict)
    ran_under_property: bool = False  # some line of the file (changed or not) ran inside a check

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
                "definitions": self.definitions, "never_ran": self.never_ran, "at_import": self.at_import,
                "needs_device": self.needs_device,
                "why_needs_device": {str(k): v for k, v in sorted(self.why_device.items())},
                "why_never_ran": {str(k): v for k, v in sorted(self.why_never.items())},
                "functions": self.functions, "ran_under_property": self.ran_under_property,
                "unprovoked": self.unprovoked,
                "why_unprovoked": {str(k): v for k, v in sorted(self.why_unprovoked.items())},
                "rules": {str(k): v for k, v in sorted(self.rules.items())},
                **({"why_untraced": self.why_untraced} if self.why_untraced else {})}


def properties(contexts: set[str]) -> list[str]:
    """The registered properties a set of contexts names (a shared group's name stands for its members);
    the import's contexts and the harness's own (``line_trace.is_check``) name none."""
    from vmfuzz.harness.properties.shared import group_members
    out: set[str] = set()
    for ctx in contexts:
        if not is_check(ctx):
            continue
        out.update(group_members(ctx) or (ctx,))
    return sorted(out)


def measure(path: str, text: str, traced: str, changed: frozenset[int] | None,
            mask_functions: dict[str, str], ran: dict[int, set[str]], reads: dict | None = None) -> FileLines:
    """One file's verdict.

    ``mask_functions``: the surface's functions of this file (as it declares them) ->
    what drives them (its properties, or why nothing does): reasons, never the decision.
    ``ran``: line -> contexts. ``reads``: first line -> ``bound_at_import.Read`` for the changed
    module-level and class-body statements (none given: no read of them is known, so none is judged).
    """
    src = parse(text)
    code = code_lines(text)
    out = FileLines(path, traced)
    out.ran_under_property = any(is_check(ctx) for ctxs in ran.values() for ctx in ctxs)
    on_path: dict[str, str] = {}  # qualified name -> what drives it
    for declared, driver in mask_functions.items():
        for qual in src.resolve(declared):
            on_path[qual] = driver

    def contexts(first: int, last: int) -> set[str]:
        ctxs: set[str] = set()
        for n in range(first, last + 1):
            ctxs |= ran.get(n, set())
        return ctxs

    # each mask-path function: entered under a property, and how much of it ran
    for qual, driver in on_path.items():
        lo, hi = src.functions[qual]
        body = [s for s in src.statements if lo <= s.first <= hi and not s.header and s.function]
        hit = [s for s in body if properties(contexts(s.first, s.last))]
        out.functions[qual] = {"entered": bool(hit), "statements": len(body), "ran": len(hit),
                               "driven_by": driver}
    if changed is None:
        return out
    touched: set[str] = set()
    firsts: set[int] = set()
    for line in sorted(changed):
        s = src.statement_at(line)
        if s is None or s.first in firsts:
            continue
        firsts.add(s.first)
        if s.definition:
            out.definitions.append(s.first)
            continue
        if s.header:  # its decorators, defaults and bases are code: judged once its body ran in a check
            qual = next((q for q, (lo, _) in src.functions.items() if lo == s.first), "")
            lo, hi = src.functions.get(qual, (s.first, s.last))
            # a function's body, a class's methods: never a class body, which runs at import
            inside = set().union(*(contexts(t.first, t.last) for t in src.statements
                                   if s.last < t.first <= hi and t.function))
            props, unrun = properties(inside), []
        elif not s.function and contexts(s.first, s.last):
            _at_import(out, s, (reads or {}).get(s.first), contexts(s.first, s.last))
            continue
        else:
            qual = s.function
            props = properties(contexts(s.first, s.last))
            own = [n for n in changed if s.first <= n <= s.last and n in code] if s.last > s.first else []
            unrun = unrun_lines(props, own, contexts, properties)
        home = _enclosing(qual, on_path)
        if home:
            touched.add(home)
        if props:
            out.judged[s.first] = props
            if unrun:
                out.operands_unrun[s.first] = ran_around(qual, props, unrun)
        else:
            _unjudged(out, s, qual, home and f"{home}: {on_path[home]}", bool(contexts(s.first, s.last)))
    out.changed = sorted(firsts)
    out.functions = {q: f for q, f in out.functions.items() if q in touched}
    return out


def _at_import(out: FileLines, s: Statement, read, ran_under: set[str]) -> None:
    """A changed module-level or class-body statement that ran (at import): judged by a property's read of what
    it bound, else could not check (``bound_at_import``)."""
    if read is not None and read.props:
        out.judged[s.first] = list(read.props)
        out.rules[s.first] = read.said
        return
    where = f"class {s.scope}: " if s.scope else "module level: "
    inside = properties(ran_under)
    when = f"inside {', '.join(inside)}'s check, where its module was first imported" if inside else \
        "outside every property's check"
    out.never_ran.append(s.first)
    out.at_import.append(s.first)
    out.why_never[s.first] = (f"{where}{read.said if read is not None and read.said else 'no read of it was measured'}"
                              f"; its import ran {when}")


def _enclosing(qual: str, on_path: dict[str, str]) -> str | None:
    """The mask-path function ``qual`` is, or lies in."""
    while qual:
        if qual in on_path:
            return qual
        qual = qual.rpartition(".")[0]
    return None


def _unjudged(out: FileLines, s: Statement, qual: str, driver: str | None, at_import: bool) -> None:
    """A changed statement no property ran: needs a GPU (``device_only``), else not driven here,
    with the most telling reason the tables and the measurement give."""
    # a file only one device runs (a HIP backend, a JIT CUDA wrapper: ``device_only.DEVICE_FILES``)
    # needs it for every line, whatever the line's own branch says
    if (device := device_file(out.path) or device_branch(s.conditions)) is not None:
        out.needs_device.append(s.first)
        out.why_device[s.first] = device
        return
    out.never_ran.append(s.first)
    where = f"{qual}: " if qual else ""
    if (why := cpu_cannot_take(s.conditions)) is not None:
        out.why_never[s.first] = f"not driven: {why}"
    elif (off := off_mask_path(s.conditions)) is not None:
        out.why_never[s.first] = f"not driven: {where}{off}"
    elif not s.function:
        out.why_never[s.first] = (f"{'class ' + s.scope + ': ' if s.scope else 'module level: '}never ran, not even "
                                  "at import (the import is observed, never assumed run)")
    elif at_import:
        out.why_never[s.first] = f"{where}ran only outside every property's check"
    elif driver:
        out.why_never[s.first] = driver
    else:
        out.why_never[s.first] = f"{where}no property's check ran it (nothing the gate drives calls it)"


def untraced(path: str, why: str) -> FileLines:
    return FileLines(path, None, why_untraced=why)


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
