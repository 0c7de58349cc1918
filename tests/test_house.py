"""The house: layers that import only downward, small modules, docs that the code keeps true."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([LINT, "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(cwd)})


@pytest.fixture(scope="module")
def lint():
    if LINT is None:
        pytest.fail("lint-imports is not installed: bash scripts/bootstrap.sh installs it (import-linter)")
    return _lint


def test_layers_contract_holds(lint):
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "harness layers KEPT" in r.stdout
    assert "engine rooms KEPT" in r.stdout


@pytest.mark.parametrize("module,upward,contract", [
    ("harness/model/layouts.py", "vmfuzz.harness.cli", "harness layers"),
    ("harness/guard/shadow.py", "vmfuzz.harness.properties", "harness layers"),
    ("strategies/trees.py", "vmfuzz.harness.engine.core.failures", "harness layers"),
    # the engine's rooms: each imports only the rooms below it
    ("harness/engine/search/search.py", "vmfuzz.harness.engine.regression.known", "engine rooms"),
    ("harness/engine/core/isolation.py", "vmfuzz.harness.engine.search.results", "engine rooms"),
    ("harness/engine/regression/replay.py", "vmfuzz.harness.engine.campaign.session", "engine rooms")])
def test_contract_breaks_on_a_planted_upward_import(lint, tmp_path, module, upward, contract):
    _copy_package(tmp_path)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    planted = tmp_path / module
    planted.write_text(planted.read_text() + f"\n\ndef _planted():\n    import {upward}  # noqa\n")
    r = lint(tmp_path)
    assert r.returncode != 0 and f"{contract} BROKEN" in r.stdout, r.stdout + r.stderr


def _copy_package(into: Path):
    """harness/, strategies/ and the vmfuzz package whose links reach them, links kept."""
    for part in ("harness", "strategies", "vmfuzz"):
        shutil.copytree(ROOT / part, into / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))


def _sources():
    for folder in ("harness", "strategies"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_module_over_400_lines_and_no_function_over_80():
    long_modules = [f"{p.relative_to(ROOT)} ({n})" for p in _sources()
                    if (n := len(p.read_text().splitlines())) > 400]
    long_functions = []
    for p in _sources():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 80:
                    long_functions.append(f"{p.relative_to(ROOT)}:{node.name} ({n})")
    assert not long_modules and not long_functions, (long_modules, long_functions)


def test_harness_top_level_is_a_few_packages():
    entries = [p.name for p in (ROOT / "harness").iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 11, entries
    loose = [n for n in entries if n.endswith(".py") and n not in ("__init__.py", "__main__.py")]
    assert not loose, f"modules outside the layers: {loose}"


def test_generated_docs_are_current():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_readme_is_short_and_docs_point_nowhere_outside():
    assert (ROOT / "README.md").stat().st_size <= 10 * 1024
    assert (ROOT / "docs" / "architecture.md").is_file()
    texts = [ROOT / "README.md", ROOT / "PERFORMANCE.md", *(ROOT / "docs").rglob("*.md"), *_sources(),
             *(ROOT / "tests").rglob("*.py")]
    pattern = re.compile(r"DESIGN\.md|\bissues? #?\d+\b", re.IGNORECASE)
    hits = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in texts if p.name != "test_house.py"
            for m in pattern.finditer(p.read_text())]
    assert not hits, hits


def test_python_m_vmfuzz_is_the_vmfuzz_command():
    r = subprocess.run([sys.executable, "-m", "vmfuzz", "--help"], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode == 0 and r.stdout.startswith("usage: vmfuzz"), r.stdout + r.stderr


def _loops(root: Path) -> list[str]:
    """Every import that some chain of imports leads back from, in the tree at ``root``."""
    code = ("import grimp, json; g = grimp.build_graph('vmfuzz'); "
            "print(json.dumps([' -> '.join((a, *c)) for a in sorted(g.modules) "
            "for b in sorted(g.find_modules_directly_imported_by(a)) "
            "for c in [g.find_shortest_chain(importer=b, imported=a)] if c]))")
    r = subprocess.run([sys.executable, "-c", code], cwd=root, env={"PYTHONPATH": str(root)}, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import json
    return json.loads(r.stdout)


def test_no_import_cycle_inside_a_layer():
    """The layers contract forbids upward imports; this forbids loops among modules of one layer."""
    assert _loops(ROOT) == []


def test_a_planted_cycle_is_found(tmp_path):
    _copy_package(tmp_path)
    planted = tmp_path / "harness" / "model" / "layouts.py"
    planted.write_text(planted.read_text() + "\n\ndef _planted():\n    import vmfuzz.harness.model.config  # noqa\n")
    assert any(loop.startswith("vmfuzz.harness.model.config -> vmfuzz.harness.model.layouts") for loop in _loops(tmp_path))
