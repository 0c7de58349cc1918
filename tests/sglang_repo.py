"""A local stand-in for SGLang's git repository, built from the installed package.

SGLang's repository keeps its package at ``python/sglang`` with the project file
at ``python/pyproject.toml``; a CI job checks that out and runs vmfuzz inside it.
Here the installed package is copied to that layout (its ``__pycache__`` copied
too, with the sources' timestamps kept, so an import of an untouched module
costs what it costs from site-packages) and committed on ``main``; a test then
commits the changes a pull request would make on a branch.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from importlib.util import find_spec
from pathlib import Path

#: The pre-#33127 policy put back into today's ``fits``: a FULL_MASK batch is let
#: through whatever its size, the way the code merged with #32920 did.
REGRESSION = ("python/sglang/srt/layers/attention/verify_mask.py",
              r"(\n(\s+)return bs <= self\.max_bs\n)",
              r"\n\2if self.mode == TreeMaskMode.FULL_MASK:\n\2    return True\1")

#: A change to verify-mask code that keeps it correct: the gate must run and pass.
CLEAN = ("python/sglang/srt/layers/attention/verify_mask.py",
         r"(\n(\s+)return bs <= self\.max_bs\n)",
         r"\n\2# capacity is per batch: the buffer holds max_bs requests' blocks\1")

#: A commit after which ``import sglang`` fails: not testable, never to blame.
BREAKS_IMPORT = ("python/sglang/__init__.py", r"\A", "raise ImportError('half-finished refactor')\n")

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
version = "{version}"
requires-python = ">=3.10"

[tool.setuptools.packages.find]
include = ["sglang*"]
"""


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "stand-in", "GIT_AUTHOR_EMAIL": "ci@example.invalid",
           "GIT_COMMITTER_NAME": "stand-in", "GIT_COMMITTER_EMAIL": "ci@example.invalid"}
    out = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"git {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout.strip()


def build(root: Path) -> Path:
    """``root/repo``: SGLang's layout, one commit on ``main``."""
    from importlib.metadata import version

    package = Path(find_spec("sglang").origin).parent
    repo = root / "repo"
    shutil.copytree(package, repo / "python" / "sglang", symlinks=True)
    (repo / "python" / "pyproject.toml").write_text(PYPROJECT.format(version=version("sglang")))
    (repo / ".gitignore").write_text("__pycache__/\n*.egg-info/\n")
    (repo / "docs").mkdir()
    (repo / "docs" / "speculative_decoding.md").write_text("# Speculative decoding\n\nEAGLE verify.\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"SGLang {version('sglang')} as installed")
    return repo


def edit(repo: Path, change: tuple[str, str, str]) -> None:
    rel, pattern, repl = change
    path = repo / rel
    text = path.read_text()
    new, n = re.subn(pattern, repl, text, count=1)
    if not n:
        raise AssertionError(f"{pattern!r} not found in {rel}: the stand-in edit no longer applies")
    path.write_text(new)


def commit(repo: Path, message: str, *changes: tuple[str, str, str], touch: str | None = None) -> str:
    """Applies ``changes`` (and appends a line to ``touch``), commits, returns the sha."""
    for change in changes:
        edit(repo, change)
    if touch:
        with open(repo / touch, "a") as f:
            f.write(f"# {message}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


#: ``fits`` letting one request too many through (the ``fits-off-by-one`` variant's bug, in the code).
OFF_BY_ONE = ("python/sglang/srt/layers/attention/verify_mask.py",
              r"(\n\s+return bs <= self\.max_bs)\n", r"\1 + 1\n")


def fits_history(root: Path) -> tuple[Path, str, str]:
    """A checkout whose ``main`` is one commit past ``origin/main`` (tagged ``v0.5.17``): the
    installed SGLang, then ``fits`` admitting max_bs + 1. Returns (repo, good sha, bad sha).
    The reports and database a command writes inside it are ignored: a gate run there must not
    count them as part of the change."""
    repo = build(root)
    git(repo, "config", "gc.auto", "0")  # thousands of loose objects: no background gc mid-test
    with open(repo / ".gitignore", "a") as f:
        f.write("reports/\n.vmfuzz-db/\n")
    good = commit(repo, "ignore vmfuzz's reports")
    git(repo, "tag", "v0.5.17")
    git(repo, "update-ref", "refs/remotes/origin/main", good)
    bad = commit(repo, "verify_mask: let one more request through", OFF_BY_ONE)
    return repo, good, bad
