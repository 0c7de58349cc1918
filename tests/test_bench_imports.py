"""The mutation bench's modules import one way: no circle among bench/'s own modules.

bench/ is not a package, so import-linter's contracts (which name packages) do not
reach it; this reads every import statement of every bench module, at any depth
(a function-level import closes a circle as surely as a top-level one).
"""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"

#: the mutation bench from the command down to the records every part reads; a module may import
#: only modules below its own row
LAYERS = (
    ("mutation_score",),
    ("mutation_table",),
    ("mutation_wide", "mutation_nightly"),
    ("mutation_kill",),
    ("stillborn", "mutation_equiv", "sglang_tests", "mutation_shares"),
    ("mutation_copy", "mutation_records"),
)


def bench_imports(folder: Path = BENCH) -> dict[str, set[str]]:
    """module -> the bench modules it imports anywhere in its body."""
    mine = {p.stem for p in folder.glob("*.py")}
    graph = {}
    for path in sorted(folder.glob("*.py")):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
        graph[path.stem] = (found & mine) - {path.stem}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules in order, the first repeated last), or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], _ = "open", path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node], _ = "done", path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_circle_finder_finds_a_circle_through_a_function_level_import(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from c import g\n")
    (tmp_path / "c.py").write_text("import json\n\ndef g():\n    import a\n")
    (tmp_path / "d.py").write_text("import a\n")
    graph = bench_imports(tmp_path)
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circle(graph) == ["a", "b", "c", "a"]
    (tmp_path / "c.py").write_text("def g():\n    import json\n")
    assert circle(bench_imports(tmp_path)) is None


def test_bench_imports_run_one_way():
    graph = bench_imports()
    assert circle(graph) is None, " -> ".join(circle(graph))


def test_the_mutation_bench_imports_only_downward():
    graph = bench_imports()
    row = {m: k for k, names in enumerate(LAYERS) for m in names}
    assert set(row) <= set(graph), set(row) - set(graph)  # a renamed module must be placed again
    upward = [f"{m} -> {n}" for m in row for n in graph[m] if n in row and row[n] <= row[m]]
    assert not upward, upward
    # the shared records read nothing of the bench: every part may import them
    assert graph["mutation_records"] == set()
