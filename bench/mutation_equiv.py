"""Is a surviving mutant equivalent? What the gate handed every check, against the pristine copy's.

The gate records, during its own run, everything the target hands each
property's check on every example it checks (``vmfuzz.harness.engine.core.output_record``):
each call's result and its arguments after the call, one digest per leaf, keyed
by the property, the case and the call. A survivor's record is compared with two
records of the pristine code run through the same gate, seed and property
selection; what differs between those two is noise and never compared. Identical
everywhere both checked: suspected-equivalent. Any difference: survived, naming
the output that differs (a real gap of the gate).

The pristine records are made once per property selection, the first time a
survivor needs them, under a lock (two workers may need the same one at once),
in ``WORK/pristine-gate/``; the pristine code is the installed package.
"""

from __future__ import annotations

import fcntl
import hashlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
HARNESS_ROOT = HERE.parent
#: pristine gate runs per selection: what differs between them is run-to-run noise
PRISTINE_RUNS = 2


def gate_command(properties: list[str], change: list[str], report: Path) -> list[str]:
    """The gate as the bench runs it: one mutant's properties, no example database (each mutant
    is scored on the gate alone, not on what earlier searches saved)."""
    cmd = [sys.executable, "-W", "ignore", "-m", "vmfuzz", "gate", "--target", "sglang", *change,
           "--report-dir", str(report), "--overwrite", "--db", "no-db"]
    for p in properties:
        cmd += ["--property", p]
    return cmd


def pristine_records(work: Path, properties: list[str], changed: list[str], env: dict) -> list[dict] | str:
    """The pristine code's records for ``properties`` (made now if missing), or why there are none."""
    from vmfuzz.harness.engine.core import output_record
    key = hashlib.sha256(",".join(sorted(properties)).encode()).hexdigest()[:12]
    folder = work / "pristine-gate" / key
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = []
        for k in range(PRISTINE_RUNS):
            run = folder / f"run-{k}"
            if not (run / "done").exists():
                said = _record_pristine(run, properties, changed, env)
                if said:
                    return said
            out.append(output_record.merged(run))
    return out


def _record_pristine(run: Path, properties: list[str], changed: list[str], env: dict) -> str | None:
    """One gate run on the installed (pristine) package, recorded into ``run``; None, or why not."""
    import shutil
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    listed = run / "changed.txt"
    listed.write_text("".join(f"python/sglang/{rel}\n" for rel in changed))
    # a folder with no checkout in it: the gate then tests the installed package
    with tempfile.TemporaryDirectory(prefix="vmfuzz-pristine-") as cwd:
        proc = subprocess.run(gate_command(properties, ["--changed-files", str(listed)], run / "report"),
                              cwd=cwd, capture_output=True, text=True,
                              env=dict(env, **{"VMFUZZ_OUTPUT_RECORD_DIR": str(run)}))
    # Exit 3 is a gate that ran and could not vouch for some lines (listed by name, with no diff to
    # narrow them): what it checked is recorded all the same. A finding or a refusal is no baseline.
    if proc.returncode not in (0, 3):
        last = (proc.stdout + proc.stderr).strip().splitlines() or ["no output"]
        return f"not checked (the pristine gate exited {proc.returncode}: {last[-1][:200]})"
    (run / "done").write_text("")
    return None


def field_of(key: str) -> str:
    """Which output a key is, without its property, case and call numbers: ``read_replay ->.qo_indptr``."""
    m = re.search(r" call\d+:(.*)$", key)
    what = m.group(1) if m else key.rsplit(" ", 1)[-1]
    return re.sub(r"\[\d+\]|#len|#type", "", what)


def verdict(diffs: list[str], compared: int) -> str:
    """One line for the score: what ``mutation_table`` reads as suspected-equivalent or survived."""
    if not compared:
        return "not checked (no output both runs recorded)"
    if not diffs:
        return f"identical ({compared} outputs compared, every example the gate ran)"
    fields = list(dict.fromkeys(field_of(k) for k in diffs))
    return (f"differs: {', '.join(fields[:3])}{' ...' if len(fields) > 3 else ''} "
            f"({len(diffs)} of {compared} outputs; first {diffs[0]})")


def compare(work: Path, properties: list[str], changed: list[str], env: dict, mutant: Path) -> str:
    """The ``vmfuzz-equiv:`` line of a survivor whose gate recorded into ``mutant``."""
    from vmfuzz.harness.engine.core import output_record
    pristine = pristine_records(work, properties, changed, env)
    if isinstance(pristine, str):
        return pristine
    diffs, compared = output_record.differences(pristine, output_record.merged(mutant))
    return verdict(diffs, compared)

