"""The base's expression evaluated beside the head's, in the same frame on the same values.

A changed condition that ran is not yet judged: on every example the gate drew it
may have given what the base's condition gave (it short-circuits first on a CPU,
no example mixes the inputs it tells apart). The gate's plan (``campaign.provoked``)
lists each changed side-effect-free expression with the base's spelling of it; here,
in every process that runs a property's check, the changed functions of the loaded
modules get new code in which that expression is wrapped as

    __vmfuzz_probe__(ID, <head's expression>, lambda: <base's expression>)

A changed class default is watched instead (``class_reads``, kind "read"): each
read that reaches the class's own value is counted, the same way.

The head's expression is evaluated where it always was, once, and its value is
what the code gets; the base's is evaluated right after, by a closure over the
same frame, and the two are compared. A deleted guard is probed as the constant
True (the head now always runs the statement) against the base's test. Only the
changed functions are recompiled, so nothing else pays for it.

Counts land, per property, next to the line trace's records (``save``), and the
parent joins them (``merged``).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import sys
import types
from pathlib import Path

#: The plan's JSON file (a list of probes); set by the gate, read by every process that runs checks.
PLAN_ENV = "VMFUZZ_PROVOKE_PLAN"
#: The name the probe goes by in a changed module's globals.
PROBE = "__vmfuzz_probe__"

current = ""  # the property whose check is running here (set by ``line_trace.judging``)
_pid: int | None = None
_counts: dict[str, dict] = {}  # probe id -> {"installed", "why", "by": {property: [evaluated, differed, raised]}}
_kinds: dict[str, str] = {}


def _count(ident: str) -> dict:
    return _counts.setdefault(ident, {"installed": False, "why": "", "by": {}, "sample": ""})


def probe(ident: str, head, base):
    """Returns ``head`` untouched; counts whether the base's expression gave something else."""
    row = _count(ident)["by"].setdefault(current, [0, 0, 0])
    row[0] += 1
    try:
        was = base()
        differs = _differs(_kinds.get(ident, "value"), head, was)
    except Exception as exc:  # noqa: BLE001 - the base's code, run where the head's runs: never the head's failure
        row[2] += 1
        if not _counts[ident]["sample"]:
            _counts[ident]["sample"] = f"the base's expression raised {type(exc).__name__}"
        return head
    if differs:
        row[1] += 1
        if not _counts[ident]["sample"].startswith("head gave"):
            _counts[ident]["sample"] = f"head gave {_short(head)}, base gave {_short(was)}"
    return head


def _short(value) -> str:
    text = repr(value) if not hasattr(value, "shape") else f"a tensor of shape {tuple(value.shape)}"
    return text if len(text) <= 60 else text[:57] + "..."


def _differs(kind: str, head, base) -> bool:
    if kind in ("test", "guard"):
        return bool(head) != bool(base)
    if head is base:
        return False
    if type(head) is not type(base):
        return True
    if hasattr(head, "shape") and hasattr(head, "dtype"):
        import torch
        return head.shape != base.shape or head.dtype != base.dtype or not torch.equal(head, base)
    same = head == base
    if not isinstance(same, bool):
        raise TypeError("not comparable")
    return not same


def start(folder: Path, plan: list[dict]) -> None:
    """Writes the plan where every process that runs checks finds it."""
    path = folder / "provoke-plan.json"
    path.write_text(json.dumps(plan))
    os.environ[PLAN_ENV] = str(path)


def stop() -> None:
    os.environ.pop(PLAN_ENV, None)
    _Pending.files.clear()
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Pending)]


def install() -> None:
    """Recompiles the changed functions of this process's modules with their probes (once per process;
    a fork inherits the parent's new code and starts its own counts)."""
    global _pid, _counts
    where = os.environ.get(PLAN_ENV)
    if not where:
        return
    if _pid == os.getpid():
        return
    fresh = _pid is None
    _pid = os.getpid()
    _counts = {k: {**v, "by": {}, "sample": ""} for k, v in _counts.items()}
    if not fresh:
        return
    try:
        plan = json.loads(Path(where).read_text())
    except (OSError, ValueError):
        return
    by_file: dict[str, list[dict]] = {}
    for p in plan:
        _kinds[p["id"]] = p["kind"]
        by_file.setdefault(p["file"], []).append(p)
    for file, probes in by_file.items():
        module = sys.modules.get(probes[0]["module"])
        if module is None:  # patched when it loads: importing it here would cost a process what it never runs
            _Pending.files[probes[0]["module"]] = (file, probes)
        else:
            _install_file(module, file, probes)
    if _Pending.files and not any(isinstance(f, _Pending) for f in sys.meta_path):
        sys.meta_path.insert(0, _Pending())


class _Pending:
    """Gives a changed module its probes as it loads, in a process that had not loaded it yet."""

    files: dict[str, tuple[str, list[dict]]] = {}

    def find_spec(self, name, path=None, target=None):
        if name not in self.files:
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        file, probes = self.files.pop(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _install_file(module, file, probes)
        spec.loader.exec_module = exec_module
        # first on sys.meta_path, this finder answers before the import's watch could: it hands the spec over,
        # or the module's body would run unobserved (``import_trace``)
        from vmfuzz.harness.engine.core import import_trace
        import_trace.watched(spec)
        return spec


def _read(ident: str) -> None:
    """A watched class default was read (``class_reads``): counted under the property whose check runs."""
    _count(ident)["by"].setdefault(current, [0, 0, 0])[0] += 1


def _install_file(module, file: str, probes: list[dict]) -> None:
    from vmfuzz.harness.engine.core import class_reads
    reads = [p for p in probes if p["kind"] == "read"]
    for p in reads:  # a class default is watched where it is looked up, not recompiled
        why = (class_reads.watch(module, p["class"], p["name"], lambda ident=p["id"]: _read(ident))
               if os.path.realpath(getattr(module, "__file__", None) or "") == file
               else f"{module.__name__} loads from {module.__file__}, not from the file traced")
        _count(p["id"]).update(installed=not why, why=why)
    probes = [p for p in probes if p["kind"] != "read"]
    if not probes:
        return
    try:
        if os.path.realpath(getattr(module, "__file__", None) or "") != file:
            raise ImportError(f"{module.__name__} loads from {module.__file__}, not from the file traced")
        text = Path(file).read_text(encoding="utf-8")
        tree = _with_probes(ast.parse(text), probes)
        code = compile(tree, module.__file__, "exec", dont_inherit=True)
    except Exception as exc:  # noqa: BLE001 - a file not probed keeps the older rule, and says why
        for p in probes:
            _count(p["id"])["why"] = f"could not be probed: {type(exc).__name__}: {exc}"
        return
    found = {}
    _codes(code, found)
    setattr(module, PROBE, probe)
    for p in probes:
        why = _swap(module, p["patch"], found, file)
        _count(p["id"]).update(installed=not why, why=why)


def _codes(code, out: dict) -> None:
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out.setdefault(c.co_qualname, c)
            _codes(c, out)


def _swap(module, qualname: str, found: dict, file: str) -> str:
    """Gives the function ``qualname`` of ``module`` its probed code; '' or why it could not."""
    new = found.get(qualname)
    if new is None:
        return f"no code for {qualname}"
    owner, fn = module, None
    for part in qualname.split("."):
        fn = owner.__dict__.get(part) if hasattr(owner, "__dict__") else None
        owner = fn
    fn = getattr(fn, "__func__", fn)  # staticmethod, classmethod
    fn = getattr(fn, "fget", fn)  # property
    while not isinstance(fn, types.FunctionType) and getattr(fn, "__wrapped__", None) is not None:
        fn = fn.__wrapped__
    for _ in range(8):
        if isinstance(fn, types.FunctionType) and fn.__code__.co_qualname == qualname:
            break
        fn = getattr(fn, "__wrapped__", None)
    if not isinstance(fn, types.FunctionType) or os.path.realpath(fn.__code__.co_filename) != file:
        return f"{qualname} is not a plain function here"
    if PROBE in fn.__code__.co_names:
        return ""
    if len(new.co_freevars) != len(fn.__closure__ or ()):
        return f"{qualname}'s closure differs from its recompiled code"
    fn.__code__ = new
    return ""


def _with_probes(tree: ast.Module, probes: list[dict]) -> ast.Module:
    wanted = {(p["at"]["type"], p["at"]["line"], p["at"]["col"], p["at"]["end_line"], p["at"]["end_col"]): p
              for p in probes}

    def key(node):
        return (type(node).__name__, node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)

    def base_thunk(p, at):
        base = ast.parse(p["base"], mode="eval").body
        lam = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
                         body=base)
        for n in ast.walk(lam):  # every node on the head's line: coverage must see no line the head lacks
            if "lineno" in n._attributes:
                ast.copy_location(n, at)
        return lam

    def call(p, at, head):
        out = ast.Call(func=ast.Name(id=PROBE, ctx=ast.Load()),
                       args=[ast.Constant(p["id"]), head, base_thunk(p, at)], keywords=[])
        for n in (out, out.func, out.args[0]):
            ast.copy_location(n, at)
        return out

    class Wrap(ast.NodeTransformer):
        def generic_visit(self, node):
            super().generic_visit(node)
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    setattr(node, field, self._guards(block))
            if isinstance(node, ast.expr):
                p = wanted.get(key(node))
                if p is not None and p["kind"] != "guard":
                    return call(p, node, node)
            return node

        def _guards(self, block):
            out = []
            for stmt in block:
                p = wanted.get(key(stmt))
                if p is not None and p["kind"] == "guard":
                    head = ast.copy_location(ast.Constant(p.get("head", True)), stmt)
                    out.append(ast.copy_location(ast.Expr(call(p, stmt, head)), stmt))
                out.append(stmt)
            return out

    tree = Wrap().visit(tree)
    tree.body = Wrap()._guards(tree.body)
    return ast.fix_missing_locations(tree)


def save(folder: str) -> None:
    """This process's counts, beside its line records."""
    if _pid != os.getpid() or not _counts:
        return
    with contextlib.suppress(OSError):
        Path(folder, f"provoke.{os.getpid()}.json").write_text(json.dumps(_counts))


def merged(folder: Path) -> dict[str, dict]:
    """Every process's counts joined: probe id -> installed, why, sample, by property [evaluated, differed, raised]."""
    out: dict[str, dict] = {}
    for part in sorted(folder.glob("provoke.*.json")):
        try:
            one = json.loads(part.read_text())
        except (OSError, ValueError):
            continue
        for ident, row in one.items():
            into = out.setdefault(ident, {"installed": False, "why": "", "by": {}, "sample": ""})
            into["installed"] = into["installed"] or row["installed"]
            into["why"] = into["why"] or row["why"]
            for prop, counts in row["by"].items():
                have = into["by"].setdefault(prop, [0, 0, 0])
                into["by"][prop] = [a + b for a, b in zip(have, counts)]
            if row["sample"] and (not into["sample"] or row["sample"].startswith("head gave")):
                into["sample"] = row["sample"]
    return out
