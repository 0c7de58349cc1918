"""Which modules of the harness the tests touched: the fast loop must reach every one.

A module is *touched* when at least one function or method defined in it ran
inside a test, in the test's own process (setup, call and teardown; cProfile's
call records, on the test's thread). Its module body and class bodies do not
count: they run at import. Comprehensions and lambdas do not count either
(their names start with ``<``; at module level they run at import too). A
module that defines no function with a body (a package's ``__init__``,
``__main__``, a Protocol whose methods are only docstrings) has nothing to run
beyond its import and is not required. Code run in a
subprocess (the CLI as a user runs it) is not seen: a module only a subprocess
reaches must also be exercised by an in-process test.

The fast loop (``-m "not slow"`` over every test: no paths, no ``-k``, no
``--deselect``) fails if a required module under the folders given to
``register`` was never touched, naming it. Only that loop is judged (and
profiled: cProfile makes in-process tests up to about 1.5x slower): the whole
suite runs every fast test too, so what the fast loop touches it touches. Under
xdist each worker sends its set to the controller, which joins them.
``--touched-report FILE`` writes, per test, the modules it touched (JSON).
"""

from __future__ import annotations

import ast
import cProfile
import functools
import json
import os
from pathlib import Path

import pytest

_CO_OPTIMIZED = 0x1  # a function's code object; module and class bodies lack it


def required_modules(root: Path, folders: list[str]) -> dict[str, str]:
    """Module name -> its file, for every module under ``folders`` that defines a function with a body."""
    found = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _has_body(n) for n in ast.walk(tree)):
                rel = path.relative_to(root).with_suffix("")
                found[".".join(rel.parts)] = str(path.resolve())
    return found


def _has_body(fn) -> bool:
    """More than a docstring, ``...`` or ``pass``: a stub (a Protocol's method) has nothing to run."""
    return any(not isinstance(st, ast.Pass)
               and not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant)
                        and (st.value.value is Ellipsis or isinstance(st.value.value, str)))
               for st in fn.body)


def touched_files(profiler: cProfile.Profile) -> set[str]:
    """The files of the functions (not module or class bodies, not ``<...>``) the profiler saw run."""
    files = set()
    for entry in profiler.getstats():
        code = entry.code
        if not isinstance(code, str) and code.co_flags & _CO_OPTIMIZED and not code.co_name.startswith("<"):
            files.add(_real(code.co_filename))
    return files


@functools.lru_cache(maxsize=None)
def _real(filename: str) -> str:
    """The file behind a link: the checkout reaches harness/ as vmfuzz/harness, a link to it."""
    return os.path.realpath(filename)


class TouchedModules:
    def __init__(self, config: pytest.Config, folders: list[str]):
        self.config = config
        self.required = required_modules(Path(config.rootpath), folders)
        self.by_file = {f: m for m, f in self.required.items()}
        self.touched: set[str] = set()
        self.per_test: dict[str, list[str]] = {}
        self.checks = _is_the_fast_loop(config)
        self.profiles = self.checks or bool(config.getoption("touched_report"))
        self.missing: list[str] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        if not self.profiles:
            yield
            return
        profiler = cProfile.Profile()
        profiler.enable()
        try:
            yield
        finally:
            profiler.disable()
        mods = sorted({self.by_file[f] for f in touched_files(profiler) if f in self.by_file})
        self.touched.update(mods)
        self.per_test[item.nodeid] = mods

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        output = getattr(node, "workeroutput", {})
        self.touched.update(output.get("touched", []))
        self.per_test.update(output.get("touched_per_test", {}))

    def pytest_sessionfinish(self, session):
        if hasattr(self.config, "workerinput"):  # an xdist worker: the controller joins and judges
            self.config.workeroutput["touched"] = sorted(self.touched)
            if self.config.getoption("touched_report"):
                self.config.workeroutput["touched_per_test"] = self.per_test
            return
        report = self.config.getoption("touched_report")
        if report:
            Path(report).write_text(json.dumps(self.per_test, indent=1, sort_keys=True))
        if self.checks and session.exitstatus == 0 and not session.shouldstop:
            self.missing = sorted(set(self.required) - self.touched)
            if self.missing:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if self.missing:
            terminalreporter.write_line(
                f"untouched modules: no test ran a function of {', '.join(self.missing)} "
                "(tests/touched.py says what counts)", red=True)


def _is_the_fast_loop(config: pytest.Config) -> bool:
    """``-m "not slow"`` with no paths, no -k and no --deselect."""
    opt = config.option
    return (config.args_source != pytest.Config.ArgsSource.ARGS and not opt.keyword and not opt.deselect
            and opt.markexpr.strip() == "not slow")


def addoption(parser: pytest.Parser) -> None:
    parser.addoption("--touched-report", default=None, metavar="FILE",
                     help="write each test's touched modules (tests/touched.py) to FILE as JSON")


def register(config: pytest.Config, folders: list[str]) -> None:
    """Watch the modules under ``folders`` (relative to the rootdir)."""
    config.pluginmanager.register(TouchedModules(config, folders), "touched-modules")
