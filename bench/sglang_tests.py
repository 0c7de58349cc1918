"""SGLang's own unit tests as a second judge of the same mutants, side by side with the gate.

The tests are read from an SGLang checkout the user names (``--sglang-tests PATH``,
its ``test/`` folder or the checkout itself); none is copied here. For each
mutated file the tests are the test files under PATH whose text imports its
module; of those, the tests (pytest node ids, not whole files) that pass on the
pristine copy are kept (a test that needs a GPU, a model or a server fails or
skips here, and would otherwise "kill" every mutant; a checkout a few commits
off the installed release has a test or two written for other signatures, and
one such test must not drop its file's others). Each mutant's copy is put first
on the path, as the gate's checkout is.
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


def _pytest(args: list[str], copy: Path, cwd: Path, timeout: float) -> tuple[int, str]:
    """pytest with the SGLang copy at ``copy`` (its ``python/sglang``) imported: (exit, its output)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(copy).resolve() / "python"),
                                                                     os.environ.get("PYTHONPATH")])),
               PYTHONDONTWRITEBYTECODE="1", TRITON_INTERPRET="1")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                               *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:.0f}s"
    return proc.returncode, proc.stdout + proc.stderr


def _file(test: str) -> Path:
    return Path(test.split("::", 1)[0])


def run(tests: list[str], copy: Path, timeout: float = TIMEOUT) -> tuple[int, str]:
    """pytest over ``tests`` (files or node ids), stopping at the first failure: (pytest's exit, its last line)."""
    code, out = _pytest(["-x", *tests], copy, _file(tests[0]).parent if tests else Path.cwd(), timeout)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    # pytest's own tally, not a warning printed at interpreter exit after it
    tally = [ln for ln in lines if re.search(r"(\d+ \w+|no tests ran)\b.* in [\d.]+s\b", ln)]
    return code, (tally or lines or [""])[-1].strip("= ")


def passing(path: Path, copy: Path, timeout: float = TIMEOUT) -> list[str]:
    """The node ids (``path::Class::test``) of the tests in ``path`` that pass on ``copy``; skipped ones
    do not count."""
    _, out = _pytest(["-rA", str(path)], copy, path.parent, timeout)
    # -rA's summary names each passed test relative to pytest's rootdir; only the part after the file is kept
    return [f"{path}::{m.group(1)}" for m in re.finditer(r"^PASSED \S+?::(.+?)\s*$", out, re.M)]


def select(tests: Path, files: list[str], pristine_copy: Path) -> dict[str, list[str]]:
    """{driven file: the tests (node ids) of the files that import it that pass on the pristine copy}."""
    kept: dict[Path, list[str]] = {}
    out = {}
    for rel in files:
        keep = []
        for path in candidates(tests, rel):
            if path not in kept:
                kept[path] = passing(path, pristine_copy)
            keep += kept[path]
        out[rel] = keep
    return out


def verdict(selected: dict[str, list[str]] | None, changed: list[str], copy: Path) -> str:
    """One line for the score: killed / survived by SGLang's tests, or why they were not run."""
    if selected is None:
        return NOT_GIVEN
    tests = sorted({t for rel in changed for t in selected.get(rel, [])})
    if not tests:
        return "not run: no test of the checkout imports this file and passes on the pristine copy"
    code, last = run(tests, copy)
    # exit 2 after a clean pristine run: the mutant broke the tests' own import (collection error)
    what = {0: "survived", 1: "killed", 2: "killed (collection error)"}.get(code, f"error (pytest exit {code})")
    return f"{what} ({len(tests)} test(s) in {len({_file(t) for t in tests})} file(s): {last})"
