"""cosmic-ray's test command for one mutant: the gate, restricted to the properties that drive
the mutated file.

Run by a cosmic-ray worker in its own copy of SGLang (a folder laid out like an
SGLang checkout, ``python/sglang``), after cosmic-ray has written one mutant into
it. The mutated file is found by comparing the copy's driven files with the
installed (pristine) ones, so one command serves every work item.

cosmic-ray reads any non-zero exit as "killed"; the gate's exit 2 and 3 are not
kills (the harness could not check, or the input was bad), so the first line of
the output names the gate's own exit, and ``mutation_score.py report`` reads it
from there: ``vmfuzz-kill: exit N``.

    python bench/mutation_kill.py WORK/driven.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HARNESS_ROOT = Path(__file__).resolve().parent.parent


def mutated_files(driven: dict) -> list[str]:
    """The driven files (sglang-relative) whose copy differs from the installed package."""
    pristine = Path(driven["package"])
    here = Path("python") / "sglang"
    return [rel for rel in driven["files"]
            if (here / rel).read_bytes() != (pristine / rel).read_bytes()]


def main(argv: list[str]) -> int:
    driven = json.loads(Path(argv[0]).read_text())
    changed = mutated_files(driven)
    if not changed:
        print("vmfuzz-kill: exit 2 (no driven file differs from the installed package: nothing was mutated)")
        return 2
    properties = sorted({p for rel in changed for p in driven["files"][rel]})
    Path("changed.txt").write_text("".join(f"python/sglang/{rel}\n" for rel in changed))
    cmd = [sys.executable, "-W", "ignore", "-m", "harness", "gate", "--target", "sglang", "--repo", ".",
           "--changed-files", "changed.txt", "--report-dir", "gate-report", "--overwrite",
           # an empty example database: each mutant is scored on the gate alone,
           # not on what earlier mutants' searches saved
           "--db", "no-db"]
    for p in properties:
        cmd += ["--property", p]
    env = dict(os.environ, PYTHONPATH=str(HARNESS_ROOT), PYTHONDONTWRITEBYTECODE="1", TRITON_INTERPRET="1")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    print(f"vmfuzz-kill: exit {proc.returncode} in {time.monotonic() - start:.1f}s; file {', '.join(changed)}; "
          f"properties {', '.join(properties)}")
    # what killed it, as typed origins read from the gate's own summary.json (never its words):
    # the score credits a property only through these lines, first, so no tail cut can lose them
    for origin in killing_origins(Path("gate-report") / "summary.json"):
        print("vmfuzz-origin: " + json.dumps(origin, sort_keys=True))
    print((proc.stdout + proc.stderr)[-4000:])
    return proc.returncode


def killing_origins(summary: Path) -> list[dict]:
    """The origins of the new finding groups and of the failing saved-repro replays (known ones left out)."""
    try:
        s = json.loads(summary.read_text())
    except (OSError, ValueError):
        return []
    out = [g["origin"] for g in s.get("groups", []) if g.get("origin") and not g.get("known")]
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
