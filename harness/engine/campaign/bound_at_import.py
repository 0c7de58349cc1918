"""A changed module constant or class default: it ran at import, but was it judged?

A module's top level and its class bodies run once, at import, before any check
(``core.import_trace`` observes it). That a line ran there says only that the
module loaded; the provoked rule cannot apply either, since no example evaluates
it. What a property's run can do with such a line is read what it bound. So a
changed module-level or class-body statement is judged when, and only when:

- it binds names to a **literal scalar** (a number, a string, a bool, None:
  ``ast.literal_eval`` alone decides). Any read of the name then hands the
  property the head's whole value, whatever the base's was: the change cannot
  hide in a part nobody consulted. A container (``POLICY = {...}``: a check that
  looks up 'triton' never consults the changed 'aiter' entry), any other
  expression (its value may equal the base's on this host: ``_is_cuda``-like
  flags) and a compound statement (``if X:`` at module level) are never judged by
  a read: could not check, said so;
- and a property's check **read it** after it was bound, measured:
  * a module constant: a line of this file that loads the name as the module's
    global (never a local or a parameter of the same name) ran inside a check;
    a line, not an instruction: a load short-circuited on a line that ran counts
    (coverage.py records lines). Reads from other modules (``mod.NAME``, a
    ``from mod import NAME`` copy) are not seen: the constant is then not judged;
  * a class default: a lookup that reached the class's own value inside a check
    (``core.class_reads``): an instance that set its own value in ``__init__``
    reads that, not the default, and the default stays unjudged.

A pure definition (an import, a ``def``/``class`` header, a docstring, a
``TYPE_CHECKING`` block, an ``@overload`` stub, a bare annotation) stays one
(``diff_coverage.parse``); this module never sees it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

_SCALARS = (int, float, complex, str, bytes, bool, type(None))
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


@dataclass(frozen=True)
class Binding:
    """A changed statement at module level or in a class body (no function encloses it)."""

    first: int
    scope: str  # the class it binds in ("" at module level)
    names: tuple[str, ...]
    why_not: str = ""  # why a read would not judge it ('' when a read does: a literal scalar)


@dataclass
class Read:
    """What the measurement says of one binding: the properties that read it, and the rule or the reason."""

    props: list[str] = field(default_factory=list)
    said: str = ""


def _scalar(node: ast.AST | None) -> bool:
    if node is None:
        return False
    try:
        return isinstance(ast.literal_eval(node), _SCALARS)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def bindings(text: str, changed) -> dict[int, Binding]:
    """First line -> each changed statement (one holding a line of ``changed``) at module level or in a class
    body (not in a function); a compound statement by its header's lines."""
    out: dict[int, Binding] = {}
    changed = set(changed)

    def hit(node) -> bool:
        inner = [b[0].lineno for b in (getattr(node, "body", None), getattr(node, "orelse", None))
                 if isinstance(b, list) and b and isinstance(b[0], ast.stmt)]
        last = max(node.lineno, min(inner) - 1) if inner else node.end_lineno
        return any(node.lineno <= n <= last for n in changed)

    def walk(body, scope: str):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{scope}.{node.name}" if scope else node.name)
                continue
            if hit(node):
                out[node.lineno] = _binding(node, scope)
            for name in ("body", "orelse", "finalbody"):
                inner = getattr(node, name, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    walk(inner, scope)
            for h in getattr(node, "handlers", None) or []:
                walk(h.body, scope)
            for c in getattr(node, "cases", None) or []:
                walk(c.body, scope)

    walk(ast.parse(text).body, "")
    return out


def _binding(node: ast.stmt, scope: str) -> Binding:
    targets, value = [], None
    if isinstance(node, ast.Assign):
        targets, value = node.targets, node.value
    elif isinstance(node, ast.AnnAssign):
        targets, value = [node.target], node.value
    elif isinstance(node, ast.AugAssign):
        targets, value = [node.target], node.value
    names = tuple(t.id for t in targets if isinstance(t, ast.Name))
    if not targets or len(names) != len(targets):
        kind = "a compound statement" if hasattr(node, "body") else (
            "a binding of no plain name" if targets else "a statement that binds no name")
        return Binding(node.lineno, scope, names, f"{kind}: what it did at import is read by nothing the gate "
                                                   "can show")
    if isinstance(node, ast.AugAssign) or not _scalar(value):
        what = "an update of a value bound before it" if isinstance(node, ast.AugAssign) else \
            "a value that is no literal scalar (a read of it need not consult the changed part)"
        return Binding(node.lineno, scope, names, what)
    return Binding(node.lineno, scope, names)


def global_reads(text: str) -> dict[str, set[int]]:
    """Name -> the lines where a function of this module loads it as the module's global.

    A name a function binds (a parameter, an assignment, an import, a loop or ``with`` target, a
    comprehension's variable), or that an enclosing function binds, is not the global, unless declared
    ``global``. Reads at module level or in a class body run at import, never in a check: not counted.
    """
    out: dict[str, set[int]] = {}

    def own(fn):
        """The nodes that run in ``fn``'s own scope, and the functions nested in it."""
        nodes, nested = [], []
        todo = list(fn.body) if isinstance(fn.body, list) else [fn.body]
        while todo:
            n = todo.pop()
            if isinstance(n, _FUNCTIONS):
                nested.append(n)
                # its decorators and defaults run here; its name is bound here
                todo.extend([*getattr(n, "decorator_list", []), *n.args.defaults,
                             *[d for d in n.args.kw_defaults if d is not None]])
                if not isinstance(n, ast.Lambda):
                    nodes.append(ast.Name(id=n.name, ctx=ast.Store(), lineno=n.lineno))
                continue
            nodes.append(n)
            todo.extend(ast.iter_child_nodes(n))
        return nodes, nested

    def scan(fn, outer: set[str]) -> None:
        nodes, nested = own(fn)
        args = fn.args
        bound = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                                 *([args.vararg] if args.vararg else []), *([args.kwarg] if args.kwarg else [])]}
        declared: set[str] = set()
        for n in nodes:
            if isinstance(n, ast.Global):
                declared.update(n.names)
            elif isinstance(n, ast.Nonlocal):
                bound.update(n.names)
            elif isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
                bound.add(n.id)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in n.names)
            elif isinstance(n, ast.ExceptHandler) and n.name:
                bound.add(n.name)
            elif isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
                bound.add(n.name)
            elif isinstance(n, ast.ClassDef):
                bound.add(n.name)
        # a comprehension's variable is its own, whatever ``global`` says: such a name is never counted here
        comprehended = {t.id for n in nodes if isinstance(n, ast.comprehension)
                        for t in ast.walk(n.target) if isinstance(t, ast.Name)}
        shadow = ((outer | bound) - declared) | comprehended
        for n in nodes:
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in shadow:
                out.setdefault(n.id, set()).add(n.lineno)
        for inner in nested:
            scan(inner, shadow)

    todo = [ast.parse(text)]
    while todo:
        n = todo.pop()
        if isinstance(n, _FUNCTIONS):
            scan(n, set())
            continue
        todo.extend(ast.iter_child_nodes(n))
    return out


def rebound_globals(text: str) -> set[str]:
    """The module globals some function declares ``global`` and stores."""
    out: set[str] = set()
    for fn in ast.walk(ast.parse(text)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        declared = {name for n in ast.walk(fn) if isinstance(n, ast.Global) for name in n.names}
        out |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
                and n.id in declared}
    return out


def read_plan(text: str, changed, file: str, module: str, prefix: str) -> list[dict]:
    """The class defaults among the changed statements, as ``core.provoke`` watches them (kind "read")."""
    out = []
    for b in bindings(text, changed).values():
        if not b.scope or b.why_not:
            continue
        for name in b.names:
            out.append({"id": f"{prefix}r{b.first}.{name}", "file": file, "module": module, "kind": "read",
                        "class": b.scope, "name": name, "line": b.first})
    return out


def reads(text: str, changed, ran: dict[int, set[str]], properties, plan: list[dict],
          counts: dict) -> dict[int, Read]:
    """First line -> what the measurement says of each changed module-level or class-body statement.

    ``properties(contexts)``: the properties a set of contexts names (``diff_coverage``); ``plan``: this file's
    watched class defaults (``read_plan``), ``counts``: their merged counts (``core.provoke.merged``).
    """
    out: dict[int, Read] = {}
    found = bindings(text, changed)
    loads = rebound = None
    for first, b in found.items():
        where = f"{b.scope}." if b.scope else ""
        names = ", ".join(f"{where}{n}" for n in b.names)
        if b.why_not:
            out[first] = Read(said=b.why_not)
            continue
        if not b.scope:
            if loads is None:
                loads, rebound = global_reads(text), rebound_globals(text)
            if set(b.names) & rebound:
                out[first] = Read(said=f"{names} is bound again at run time (a function declares it global and "
                                       "stores it): a read need not get what the import bound")
                continue
            lines = sorted(n for name in b.names for n in loads.get(name, ()))
            by = {n: properties(ran.get(n, set())) for n in lines}
            props = sorted({p for ps in by.values() for p in ps})
            if props:
                at = [n for n in lines if by[n]]
                out[first] = Read(props, f"read: {names}, a literal constant, was read under {', '.join(props)} "
                                         f"(line{'s' if len(at) > 1 else ''} {', '.join(map(str, at[:5]))})")
            else:
                out[first] = Read(said=f"no property's check read {names}" + (
                    f" (the lines of this module that read it, {', '.join(map(str, lines[:5]))}, never ran in a "
                    "check; reads from other modules are not seen)" if lines else
                    " (no function of this module reads it; reads from other modules are not seen)"))
            continue
        watched = [p for p in plan if p.get("line") == first]
        props: set[str] = set()
        whys = []
        for p in watched:
            row = counts.get(p["id"]) or {}
            if not row.get("installed"):
                whys.append(row.get("why") or "it was not watched")
            props |= {prop for prop, c in (row.get("by") or {}).items() if prop and c[0]}
        if props:
            out[first] = Read(sorted(props), f"read: {names}, a literal class default, was read from the class "
                                             f"under {', '.join(sorted(props))}")
        elif whys:
            out[first] = Read(said=f"{names} could not be watched: {whys[0]}")
        else:
            out[first] = Read(said=f"no property's check read {names} from the class (an instance that sets its "
                                   "own value reads that, never the default)")
    return out
