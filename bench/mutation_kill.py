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

After the exit line, each on its own line so no tail cut loses it:
``vmfuzz-cpu:`` the gate's own user+sys CPU seconds and its example count (the
score's throughput); ``vmfuzz-origin:`` each typed origin of what killed it;
``vmfuzz-stillborn:`` for a kill by the mutant raising in a Triton kernel, whether
Triton's own frontend refuses the mutated kernel (bench/stillborn.py); ``vmfuzz-equiv:`` for a survivor, what the gate handed its checks on every example it ran
against the pristine code's, recorded by the gate itself (bench/mutation_equiv.py); ``vmfuzz-sglang-tests:`` SGLang's
own tests on the same mutant, where prepare was given a checkout
(bench/sglang_tests.py).

    python bench/mutation_kill.py WORK/driven.json
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
HARNESS_ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from mutation_records import killing_origins  # noqa: E402


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
    Path("launches.jsonl").unlink(missing_ok=True)
    # The gate, with each Triton kernel launch's argument types recorded for the stillborn verdict.
    # A copy that prepare committed is judged on its diff (the mutated lines: exit 3 when no property
    # ran them); an older one on its changed files.
    if Path(".git").exists():
        change = ["--base", "HEAD"]
    else:
        Path("changed.txt").write_text("".join(f"python/sglang/{rel}\n" for rel in changed))
        change = ["--changed-files", "changed.txt"]
    cmd = [sys.executable, "-W", "ignore", str(HERE / "stillborn.py"), "launches.jsonl", "gate", "--target", "sglang",
           "--repo", ".", *change, "--report-dir", "gate-report", "--overwrite",
           # an empty example database: each mutant is scored on the gate alone,
           # not on what earlier mutants' searches saved
           "--db", "no-db"]
    for p in properties:
        cmd += ["--property", p]
    env = dict(os.environ, PYTHONPATH=str(HARNESS_ROOT), PYTHONDONTWRITEBYTECODE="1", TRITON_INTERPRET="1")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    outputs = Path("gate-outputs").resolve()
    import shutil
    shutil.rmtree(outputs, ignore_errors=True)
    outputs.mkdir()
    start, cpu = time.monotonic(), children_cpu()
    # the gate records what it hands every check: a survivor's equivalence is judged on its own run
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, VMFUZZ_OUTPUT_RECORD_DIR=str(outputs)))
    cpu = children_cpu() - cpu
    print(f"vmfuzz-kill: exit {proc.returncode} in {time.monotonic() - start:.1f}s; file {', '.join(changed)}; "
          f"properties {', '.join(properties)}")
    summary = Path("gate-report") / "summary.json"
    print(f"vmfuzz-cpu: {cpu:.2f} s gate; examples {examples(summary)}")
    # what killed it, as typed origins read from the gate's own summary.json (never its words):
    # the score credits a property only through these lines, first, so no tail cut can lose them
    for origin in killing_origins(summary):
        print("vmfuzz-origin: " + json.dumps(origin, sort_keys=True))
    print("vmfuzz-lines: " + json.dumps(mutated_line_verdict(summary, driven, changed), sort_keys=True), flush=True)
    if proc.returncode == 1 and all(o.get("effect") in ("raise", "crash", "hang") for o in killing_origins(summary)):
        print("vmfuzz-stillborn: " + stillborn_verdict(driven, changed), flush=True)
    if proc.returncode == 2 and (refused := python_refusal(changed)):  # the gate could not import the copy
        print("vmfuzz-stillborn: " + refused, flush=True)
    if proc.returncode == 0:
        import mutation_equiv
        print("vmfuzz-equiv: " + mutation_equiv.compare(Path(argv[0]).resolve().parent, properties, changed, env,
                                                        outputs), flush=True)
    import sglang_tests
    print("vmfuzz-sglang-tests: " + sglang_tests.verdict(driven.get("sglang_tests"), changed, Path(".")), flush=True)
    print((proc.stdout + proc.stderr)[-4000:])
    return proc.returncode


def stillborn_verdict(driven: dict, changed: list[str]) -> str:
    """Whether Triton's frontend refuses a mutated kernel the gate launched (bench/stillborn.py)."""
    import stillborn
    refused = python_refusal(changed)
    if refused:  # a property raised importing it: no Triton kernel to judge
        return refused
    said = []
    for rel in changed:
        mine = Path("python") / "sglang" / rel
        said.append(stillborn.verdict(mine, Path(driven["package"]) / rel,
                                      stillborn.launches(Path("launches.jsonl"), mine), mutated_lines(driven, rel)))
    refused = [s for s in said if s.startswith("refused")]
    return refused[0] if refused else "; ".join(said)


def python_refusal(changed: list[str]) -> str | None:
    """``refused: WHY`` for the first mutated file Python's own compiler refuses (stillborn), else None."""
    import stillborn
    for rel in changed:
        refused = stillborn.python_refuses((Path("python") / "sglang" / rel).read_text(), rel)
        if refused:
            return refused
    return None


def children_cpu() -> float:
    """User + system CPU seconds of the waited-for children so far (the gate and its workers)."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def examples(summary: Path) -> int | None:
    """The property examples the gate ran, from its summary.json (None: no summary)."""
    try:
        return int(json.loads(summary.read_text())["counts"]["examples"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def mutated_lines(driven: dict, rel: str) -> list[int]:
    """The copy's line numbers (1-based) that differ from the installed file's; for a deletion,
    the line after it."""
    import difflib
    mine = (Path("python") / "sglang" / rel).read_text().splitlines()
    theirs = (Path(driven["package"]) / rel).read_text().splitlines()
    out = []
    for op, _, _, j1, j2 in difflib.SequenceMatcher(None, theirs, mine, autojunk=False).get_opcodes():
        if op != "equal":
            out.extend(range(j1 + 1, max(j2, j1 + 1) + 1))
    return out


def mutated_line_verdict(summary: Path, driven: dict, changed: list[str]) -> dict:
    """What the gate measured of the mutated statements (its summary's ``gate.lines``): which
    properties ran them, whether none did on the mask's path (``never_ran``), or whether they lie
    outside what the gate judges (``outside``). Empty when the gate measured nothing."""
    try:
        lines = json.loads(summary.read_text()).get("gate", {}).get("lines") or []
    except (OSError, ValueError, AttributeError):
        return {}
    out = {"never_ran": False, "outside": False, "at_import": False, "judged_by": [], "measured": False}
    for rel in changed:
        record = next((f for f in lines if f.get("path") == f"python/sglang/{rel}"), None)
        if record is None or record.get("changed_lines") is None:
            continue
        firsts = sorted(record["changed_lines"])
        for n in mutated_lines(driven, rel):
            first = max((f for f in firsts if f <= n), default=None)
            if first is None:
                continue
            out["measured"] = True
            out["never_ran"] |= first in record.get("never_ran", [])
            out["outside"] |= first in record.get("outside", [])
            out["at_import"] |= first in record.get("at_import", [])
            out["judged_by"] = sorted(set(out["judged_by"]) | set(record.get("judged", {}).get(str(first), [])))
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
