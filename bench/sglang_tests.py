"""SGLang's own unit tests as a second judge of the same mutants, side by side with the gate.

The tests are read from an SGLang checkout the user names (``--sglang-tests PATH``,
its ``test/`` folder or the checkout itself); none is copied here. For each
mutated file the tests are the test files under PATH whose text imports its
module, kept only where they pass on the pristine copy (a test that needs a
GPU, a model or a server fails or skips here, and would otherwise "kill" every
mutant). Each mutant's copy is put first on the path, as the gate's checkout is.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

#: seconds one test file may take on one copy (SGLang's CPU unit tests take seconds)
TIMEOUT = 300.0
NOT_GIVEN = "not run: no checkout given"


def module_of(rel: str) -> str:
    """``srt/layers/attention/verify_mask.py`` -> ``sglang.srt.layers.attention.verify_mask``."""
    return "sglang." + rel.removesuffix(".py").replace("/", ".")


def imports(text: str, module: str) -> bool:
    """Does a test file's text import ``module`` (``import a.b.c``, ``from a.b.c import x``,
    ``from a.b import c``)?"""
    parent, _, leaf = module.rpartition(".")
    return bool(re.search(rf"^\s*(from|import)\s+{re.escape(module)}\b", text, re.M)
                or re.search(rf"^\s*from\s+{re.escape(parent)}\s+import\s+(\([^)]*\b{leaf}\b|[^\n]*\b{leaf}\b)",
                             text, re.M))


def candidates(tests: Path, rel: str) -> list[Path]:
    """The test files under ``tests`` that import the module of ``rel``."""
    module = module_of(rel)
    out = []
    for path in sorted(tests.rglob("*.py")):
        if not (path.name.startswith("test_") or path.name.endswith("_test.py")):
            continue
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if imports(text, module):
            out.append(path)
    return out


def run(files: list[Path], copy: Path, timeout: float = TIMEOUT) -> tuple[int, str]:
    """pytest over ``files`` with the SGLang copy at ``copy`` (its ``python/sglang``) imported:
    (pytest's exit, its last line)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(copy).resolve() / "python"),
                                                                     os.environ.get("PYTHONPATH")])),
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                               "-p", "no:randomly", *map(str, files)],
                              capture_output=True, text=True, env=env, timeout=timeout,
                              cwd=files[0].parent if files else None)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:.0f}s"
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    return proc.returncode, lines[-1] if lines else ""


def select(tests: Path, files: list[str], pristine_copy: Path) -> dict[str, list[str]]:
    """{driven file: the test files that import it and pass on the pristine copy}."""
    passing: dict[Path, bool] = {}
    out = {}
    for rel in files:
        keep = []
        for path in candidates(tests, rel):
            if path not in passing:
                passing[path] = run([path], pristine_copy)[0] == 0
            if passing[path]:
                keep.append(str(path))
        out[rel] = keep
    return out


def verdict(selected: dict[str, list[str]] | None, changed: list[str], copy: Path) -> str:
    """One line for the score: killed / survived by SGLang's tests, or why they were not run."""
    if selected is None:
        return NOT_GIVEN
    files = sorted({Path(p) for rel in changed for p in selected.get(rel, [])})
    if not files:
        return "not run: no test of the checkout imports this file and passes on the pristine copy"
    code, last = run(files, copy)
    what = {0: "survived", 1: "killed"}.get(code, f"error (pytest exit {code})")
    return f"{what} ({len(files)} test file(s): {last})"
