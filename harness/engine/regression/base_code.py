"""The base's code in a fresh process: its ``python/`` taken out of git and imported alone.

A gate with a base asks the base's SGLang what the change's own code cannot say
of itself: whether a known entry's defect is the base's (``known_on_base``), and
whether a case vmfuzz fell out of step on runs there (``out_of_step_on_base``).
Both take the base's tree out of git (nothing of the user's checkout or its
worktrees is touched) and run a child that imports that tree's SGLang and
nothing of the change's, as OSS-Fuzz's CIFuzz builds the base apart from the PR.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def start_on_base(checkout_root: Path, base: str, scratch: Path, module: str,
                  args: list[str]) -> tuple[subprocess.Popen | None, str | None]:
    """``python -m module BASE_PYTHON_DIR ARGS...`` on the base's ``python/`` (under ``scratch``),
    started now; (the process, None), or (None, why the base's tree could not be had)."""
    tree = scratch / "base"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(checkout_root), "archive", "--format=tar", base, "--", "python"],
                             capture_output=True)
    if archive.returncode:
        why = archive.stderr.decode(errors="replace").strip().splitlines()
        return None, f"git archive of the base failed: {why[-1] if why else archive.returncode}"
    untar = subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, capture_output=True)
    if untar.returncode or not (tree / "python" / "sglang").is_dir():
        return None, "the base has no python/sglang"
    import vmfuzz
    harness_root = str(Path(vmfuzz.__file__).resolve().parent.parent)
    from vmfuzz.harness.engine.core import line_trace, output_record, provoke
    # the change's measurements (its lines, its outputs, its provoked expressions) are no business of the base's
    measuring = {"PYTHONPATH", line_trace.DIR_ENV, line_trace.FILES_ENV, output_record.DIR_ENV, provoke.PLAN_ENV}
    env = {k: v for k, v in os.environ.items() if k not in measuring}
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "python"), harness_root])
    proc = subprocess.Popen([sys.executable, "-W", "ignore", "-m", module, str(tree / "python"), *args],
                            env=env, cwd=scratch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    from vmfuzz.harness.engine.core import clock
    clock.track(proc)  # a gate its cap ends leaves no base process running, nor its scratch
    clock.leave_no(scratch)
    return proc, None


def load_base(python_dir: Path, spec: str = "sglang"):
    """In the child: the target ``spec`` over the base's SGLang, imported from ``python_dir`` alone;
    raises (any exception) when the base's SGLang does not load or loads from elsewhere."""
    from vmfuzz.harness.targets import resolve
    from vmfuzz.harness.targets.sglang.loader import import_from_checkout, imported_sglang
    import_from_checkout(python_dir)
    target = resolve(spec)
    where = imported_sglang()[1]
    if python_dir.resolve() not in where.resolve().parents:
        raise ImportError(f"sglang imports from {where}, not from the base")
    return target


#: the base's scratch trees being removed beside the gate's own work
_removing: list = []


def remove_later(scratch: Path) -> None:
    """``scratch`` (the base's ``python/`` and the bytecode its process wrote: thousands of files, seconds
    on a loaded machine) removed in the background, off the gate's way to its verdict."""
    import shutil
    import threading
    remover = threading.Thread(target=shutil.rmtree, args=(scratch,), kwargs={"ignore_errors": True},
                               name="vmfuzz-remove-base", daemon=True)
    remover.start()
    _removing.append((remover, scratch))


def removed(timeout: float) -> None:
    """Waits for the removals begun, at most ``timeout`` seconds in all (the gate's last act); what is
    still there then is left to a detached ``rm``, which outlives this process."""
    import time
    from vmfuzz.harness.engine.core import clock
    end = time.monotonic() + timeout
    left = []
    while _removing:
        remover, scratch = _removing.pop()
        remover.join(max(0.0, end - time.monotonic()))
        if remover.is_alive():
            left.append(str(scratch))
    clock.remove_detached(left)
