"""Did the SGLang code a test says it drives run? Read from coverage.py's data, never assumed."""

from __future__ import annotations

import ast
from pathlib import Path


def surface_never_ran(root: Path, surface, data) -> list[str]:
    """The surface rows (``(file, "Class.fn" or "fn", _)``, file relative to SGLang's package ``root``) with
    a function of that name none of whose statements (its docstring apart) ran in ``data``, or with no such
    function at all. Triton kernels (``@jit``) run in the interpreter, whose lines coverage does not see."""
    never = []
    for rel, name, _ in surface:
        path = root / rel
        tree = ast.parse(path.read_text())
        *owner, leaf = name.split(".")
        scopes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == owner[0]] if owner else [tree]
        fns = [n for scope in scopes for n in ast.walk(scope) if isinstance(n, ast.FunctionDef) and n.name == leaf]
        ran = set(data.lines(str(path)) or ())
        for fn in fns:
            if any("jit" in ast.unparse(dec) for dec in fn.decorator_list):
                continue
            body = {n.lineno for stmt in fn.body[1 if ast.get_docstring(fn) else 0:] for n in ast.walk(stmt)
                    if isinstance(n, ast.stmt)}
            if body and not body & ran:
                never.append(f"{rel}:{name}")
                break
        if not fns:
            never.append(f"{rel}:{name}")
    return never


def assert_texts_ran(root: Path, places, data) -> None:
    """Each ``(file, text)``: some line of the file holding ``text`` ran in ``data``."""
    for rel, text in places:
        lines = (root / rel).read_text().splitlines()
        at = [i + 1 for i, line in enumerate(lines) if text in line]
        assert at and set(at) & set(data.lines(str(root / rel)) or ()), f"{rel}: {text!r} never ran"


def checked_under_coverage(target, prop: str, config, batches, files):
    """One check of ``prop`` on the installed SGLang with coverage.py over ``files`` (relative to SGLang's
    package), as the gate measures: (the package root, the check's observation, the coverage data)."""
    import importlib.util

    import coverage

    from vmfuzz.harness.properties import PROPERTIES
    root = Path(importlib.util.find_spec("sglang").origin).parent
    cov = coverage.Coverage(include=sorted({str(root / f) for f in files}), data_file=None)
    cov.start()
    try:
        obs = PROPERTIES[prop].check(target, config, batches)
    finally:
        cov.stop()
    return root, obs, cov.get_data()
