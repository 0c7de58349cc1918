"""The fast loop's promise: every module of the harness has a fast test that runs it (tests/touched.py).

The check itself runs at the end of every ``pytest -m "not slow"`` session;
these tests show it can fail, on a small project of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.touched import required_modules

_PKG = {
    "__init__.py": "",
    "used.py": "def used():\n    return 1\n",
    # imported, its module and class bodies run, a comprehension at import: none of it is "touched"
    "imported_only.py": ("ROWS = [i * i for i in range(3)]\n\n\nclass Box:\n    size = len(ROWS)\n\n"
                         "    def area(self):\n        return self.size ** 2\n\n\n"
                         "def helper():\n    return 2\n"),
    "constants.py": "LIMIT = 3\n",  # nothing to run beyond its import: not required
    "stubs.py": 'class Shape:\n    def area(self):\n        """Its area."""\n\n    def sides(self):\n        ...\n',
}

_CONFTEST = """
from tests import touched

def pytest_addoption(parser):
    touched.addoption(parser)

def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a campaign")
    touched.register(config, ["pkg"])
"""

_TESTS = """
import pytest
import pkg.constants, pkg.imported_only, pkg.stubs, pkg.used

def test_used():
    assert pkg.used.used() == 1

@pytest.mark.slow
def test_box():
    assert pkg.imported_only.Box().area() == 9
"""


def _project(tmp_path: Path, extra_test: str = "") -> Path:
    for name, text in _PKG.items():
        (tmp_path / "pkg").mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "conftest.py").write_text(_CONFTEST)
    (tmp_path / "checks" / "test_pkg.py").write_text(_TESTS + textwrap.dedent(extra_test))
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = checks\naddopts = -p no:cacheprovider\n")
    return tmp_path


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(project), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=120)


def test_required_modules_are_those_that_define_a_function(tmp_path):
    req = required_modules(_project(tmp_path), ["pkg"])
    assert sorted(req) == ["pkg.imported_only", "pkg.used"]


@pytest.mark.parametrize("args", [(), ("-n", "2")], ids=["one-process", "xdist"])
def test_the_fast_loop_fails_naming_a_module_no_test_ran(tmp_path, args):
    r = _pytest(_project(tmp_path), "-m", "not slow", *args)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 passed" in r.stdout and "untouched modules: no test ran a function of pkg.imported_only " in r.stdout


def test_the_fast_loop_passes_once_a_fast_test_runs_it(tmp_path):
    extra = "\n\ndef test_helper():\n    assert pkg.imported_only.helper() == 2\n"
    r = _pytest(_project(tmp_path / "b", extra), "-m", "not slow")
    assert r.returncode == 0, r.stdout + r.stderr


#: the whole suite (no -m) is not judged either: it runs every fast test, so it touches what they touch
@pytest.mark.parametrize("args", [("-k", "used", "-m", "not slow"), ("checks/test_pkg.py", "-m", "not slow"),
                                  ("-m", "slow"), ()], ids=["-k", "a-path", "-m-slow", "the-whole-suite"])
def test_a_chosen_subset_is_not_judged(tmp_path, args):
    r = _pytest(_project(tmp_path), *args)
    assert r.returncode == 0 and "untouched" not in r.stdout, r.stdout + r.stderr
