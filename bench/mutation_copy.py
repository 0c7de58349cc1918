"""The worker copies the mutation bench writes mutants into, and one mutant written there again.

A copy is a folder laid out like an SGLang checkout (``python/sglang``): every file a
symlink into the installed package except the driven ones, which are real copies that
cosmic-ray rewrites in place, so the venv's own files are never touched. Each copy is a
git checkout whose one commit is the pristine package, so a mutant's gate is judged on
its diff.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path


def mirror(src: Path, dst: Path, real: set[Path], rel: Path = Path()) -> None:
    """``dst`` mirrors ``src`` with symlinks; the ``real`` files (and the folders down to them)
    are copies, so cosmic-ray's in-place edits stay in ``dst``. No ``__pycache__`` in a real
    folder: the installed bytecode must not stand in for a mutated source."""
    dst.mkdir(parents=True)
    on_path = {p for r in real for p in r.parents}
    for entry in src.iterdir():
        r = rel / entry.name
        if r in real:
            shutil.copy2(entry, dst / entry.name)
        elif entry.is_dir() and r in on_path:
            mirror(entry, dst / entry.name, real, r)
        elif entry.name != "__pycache__":
            (dst / entry.name).symlink_to(entry)


#: What a mutant's gate and its judges write into a worker's copy: never part of the change.
COPY_OUTPUTS = ("gate-report/", "changed.txt", "launches.jsonl", "mutant-outputs.json", "*.sqlite", "*.log",
                "no-db/", "__pycache__/")


def commit_pristine(copy: Path) -> None:
    """The copy as a git checkout whose one commit is the pristine package: the gate is then run
    with ``--base HEAD`` and knows the mutated lines from the working tree's diff, so a mutant on a
    line no property ran is its exit 3 ("never ran"), never a survivor."""
    (copy / ".gitignore").write_text("".join(f"{p}\n" for p in COPY_OUTPUTS))
    env = dict(os.environ, GIT_AUTHOR_NAME="vmfuzz", GIT_AUTHOR_EMAIL="vmfuzz@localhost",
               GIT_COMMITTER_NAME="vmfuzz", GIT_COMMITTER_EMAIL="vmfuzz@localhost")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "pristine"]):
        subprocess.run(["git", "-C", str(copy), *args], check=True, capture_output=True, env=env)


def pristine_copy(work: Path) -> tuple[Path, dict]:
    """worker-0's copy, for writing an exec's mutants into again one at a time, and driven.json; exits if
    a driven file there is not the installed one. A stop mid-mutant from then on unwinds through
    cosmic-ray's ``use_mutation``, which puts the pristine file back."""
    copy = work / "worker-0"
    driven = json.loads((work / "driven.json").read_text())
    dirty = [rel for rel in driven["files"]
             if (copy / "python" / "sglang" / rel).read_bytes() != (Path(driven["package"]) / rel).read_bytes()]
    if dirty:
        sys.exit(f"mutation_score: {copy} is not pristine ({', '.join(dirty)} differ from the installed "
                 f"package): is an exec still running there?")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return copy, driven


def mutant_written(copy: Path, item):
    """Work item ``item``'s mutant written into ``copy`` again, cosmic-ray's own operator and occurrence,
    for the ``with`` block; yields whether it applied (False: cosmic-ray could not apply it again). The
    pristine file is put back after, whatever the block did."""
    import cosmic_ray.plugins
    from cosmic_ray.mutating import use_mutation
    m = item.mutations[0]
    operator = cosmic_ray.plugins.get_operator(m.operator_name)(**(m.operator_args or {}))
    return _applied(use_mutation(copy / m.module_path, operator, m.occurrence))


@contextlib.contextmanager
def _applied(mutation):
    with mutation as (_, mutated):
        yield mutated is not None


def written_diff(copy: Path, item, package: Path) -> str:
    """The unified diff of the mutant now written into ``copy`` against the installed file (for a result whose
    diff was lost: cosmic-ray's http distributor keeps none for a gate whose answer it stopped waiting for)."""
    import difflib
    rel = str(item.mutations[0].module_path).removeprefix("python/sglang/")
    mine, theirs = (copy / item.mutations[0].module_path).read_text(), (package / rel).read_text()
    return "".join(difflib.unified_diff(theirs.splitlines(True), mine.splitlines(True), f"a/{rel}", f"b/{rel}"))
