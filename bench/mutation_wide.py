"""Equivalent beyond the gate's own examples: a wider search on each mutant the gate calls equivalent.

The gate passing a mutant whose outputs are identical to the pristine code's on
the gate's examples shows only that those examples did not tell them apart; such
a mutant is "suspected-equivalent". ``mutation_score.py widen WORK`` runs, on each
one, a deterministic search wider than the gate's: another seed, more examples a
property, and the nightly's wider case bounds (``vmfuzz run --profile pr --seed
S --max-examples N --bounds B``, the properties that drive the mutated file),
with what the target hands every check recorded, on the mutated copy and twice
on the installed package (what differs between the two pristine runs is noise).
Then:

- outputs identical on every case both searched, and no finding: **equivalent**;
- a difference, or a new finding: **survived** (a false green of the gate, with that reason);
- nothing compared (the search could not check, or exited otherwise): it stays suspected-equivalent.

Each verdict is appended to the mutant's stored output as a ``vmfuzz-wide:`` line, which
bench/mutation_records.py reads; a mutant that already has one is not searched again.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mutation_copy import mutant_written, pristine_copy
from mutation_equiv import field_of
from mutation_records import HARNESS_ROOT, RAISING, WIDE_LINE, classify, imported_from, killing_origins, line

#: a seed the gate never uses (its own is the pr profile's fixed one)
WIDE_SEED = 8191
#: examples a property: several times the gate's own
WIDE_EXAMPLES = 120
#: the nightly ladder's middle step for the sglang target: wider than the gate's, still fast in the interpreter
WIDE_BOUNDS = "max_bs=8,context=64,d=10,topk=5,spec_steps=4"
PRISTINE_RUNS = 2


def search_command(properties: list[str], seed: int, examples: int, bounds: str, report: Path,
                   budget: float) -> list[str]:
    """One deterministic search (the pr profile: one pass of ``examples`` a property, no rounds) with a fresh
    example database, so what earlier mutants' searches saved plays no part."""
    cmd = [sys.executable, "-W", "ignore", "-m", "vmfuzz", "run", "--target", "sglang", "--profile", "pr",
           "--seed", str(seed), "--max-examples", str(examples), "--bounds", bounds, "--time-budget", str(budget),
           "--workers", "1", "--db", str(report.parent / "no-db"), "--report-dir", str(report), "--overwrite"]
    for p in properties:
        cmd += ["--property", p]
    return cmd


def record_search(folder: Path, cmd: list[str], package_parent: Path | None) -> int:
    """``cmd`` run with its outputs recorded into ``folder``; SGLang imported from ``package_parent``
    (a copy's ``python/``) or, with None, the installed package. Returns the exit code."""
    from vmfuzz.harness.engine.core import output_record
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = [str(package_parent)] if package_parent else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, str(HARNESS_ROOT)]), PYTHONDONTWRITEBYTECODE="1",
               TRITON_INTERPRET="1", **{output_record.DIR_ENV: str(folder)})
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    with tempfile.TemporaryDirectory(prefix="vmfuzz-wide-") as cwd:  # no checkout here: only PYTHONPATH decides
        return subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


def verdict(code: int, origins: list[dict], pristine_codes: list[int], diffs: list[str], compared: int,
            scope: str) -> str:
    """The ``vmfuzz-wide:`` line for one mutant: its search's exit and new origins, the pristine searches'
    exits, and its recorded outputs against theirs."""
    if any(c not in (0, 3) for c in pristine_codes):
        return f"not checked (the pristine wider search exited {pristine_codes}: no baseline)"
    if code == 1 and origins:
        props = sorted({o["property"] for o in origins if o.get("effect") not in RAISING and o.get("property")})
        return f"killed ({', '.join(props) or 'the mutant raising'}; {scope})"
    if code not in (0, 3):
        return f"not checked (the wider search exited {code})"
    if not compared:
        return f"not checked (no output both searches recorded; exit {code})"
    if diffs:
        fields = list(dict.fromkeys(field_of(k) for k in diffs))
        return (f"differs: {', '.join(fields[:3])}{' ...' if len(fields) > 3 else ''} ({len(diffs)} of "
                f"{compared} outputs; {scope}; first {diffs[0]})")
    return f"identical ({compared} outputs compared; {scope})"


def pristine_records(work: Path, cmd_for, properties: list[str]) -> tuple[list[dict], list[int]]:
    """The installed package's records for this selection (made once, under a lock: two callers may need
    the same), and the searches' exits."""
    from vmfuzz.harness.engine.core import output_record
    key = hashlib.sha256(",".join(sorted(properties)).encode()).hexdigest()[:12]
    folder = work / "pristine-wide" / key
    folder.mkdir(parents=True, exist_ok=True)
    records, codes = [], []
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for k in range(PRISTINE_RUNS):
            run = folder / f"run-{k}"
            if not (run / "exit").exists():
                code = record_search(run / "record", cmd_for(run / "report"), None)
                (run / "exit").write_text(str(code))
            codes.append(int((run / "exit").read_text()))
            records.append(output_record.merged(run / "record"))
    return records, codes


def judge(work: Path, copy: Path, rel: str, properties: list[str], seed: int, examples: int, bounds: str,
          budget: float) -> str:
    """The wider search on ``copy`` as it is now (the caller wrote the mutant into it)."""
    from vmfuzz.harness.engine.core import output_record
    scope = f"seed {seed}, {examples} examples a property, bounds {bounds}"

    def cmd_for(report: Path) -> list[str]:
        return search_command(properties, seed, examples, bounds, report, budget)

    pristine, codes = pristine_records(work, cmd_for, properties)
    scratch = work / "wide-scratch"
    shutil.rmtree(scratch, ignore_errors=True)  # nothing of the last mutant's search, its database included
    code = record_search(scratch / "record", cmd_for(scratch / "report"), copy / "python")
    summary = scratch / "report" / "summary.json"
    imported = imported_from(summary)
    if imported is not None and Path(imported).resolve() != (copy / "python" / "sglang").resolve():
        return f"not checked (the search imported SGLang from {imported}, not the mutated copy)"
    diffs, compared = output_record.differences(pristine, output_record.merged(scratch / "record"))
    return verdict(code, killing_origins(summary), codes, diffs, compared, scope)


def rejudge(work: Path, seed: int = WIDE_SEED, examples: int = WIDE_EXAMPLES, bounds: str = WIDE_BOUNDS,
            budget: float = 1800.0) -> int:
    """The wider search on every suspected-equivalent mutant of a finished run without a ``vmfuzz-wide:``
    line; the line is stored with its output after each one (a rerun resumes). Returns how many were searched."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkResult

    copy, driven = pristine_copy(work)
    searched = 0
    with use_db(str(work / "session.sqlite"), WorkDB.Mode.open) as db:
        todo = [(item, result) for item, result in db.completed_work_items
                if result.worker_outcome != "skipped" and classify(result) == "suspected-equivalent"
                and line(WIDE_LINE, result.output) is None]
        print(f"mutation_score: a wider search on {len(todo)} suspected-equivalent mutant(s) "
              f"(seed {seed}, {examples} examples a property, bounds {bounds})", flush=True)
        for item, result in todo:
            m = item.mutations[0]
            rel = str(m.module_path).removeprefix("python/sglang/")
            with mutant_written(copy, item) as applied:
                said = (judge(work, copy, rel, sorted(driven["files"][rel]), seed, examples, bounds, budget)
                        if applied else "not checked (cosmic-ray could not apply this mutant again)")
            db.set_result(item.job_id, WorkResult(
                worker_outcome=result.worker_outcome, test_outcome=result.test_outcome, diff=result.diff,
                output=(result.output or "") + f"\nvmfuzz-wide: {said}\n"))
            searched += 1
            print(f"mutation_score: {rel}:{m.start_pos[0]} {m.operator_name.split('/')[-1]}: {said}", flush=True)
    return searched
