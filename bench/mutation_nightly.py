"""A nightly as a third judge of mutants the gate already ran: what a longer search adds.

``mutation_score.py nightly WORK --budget S`` writes each chosen mutant into
worker-0's copy again (cosmic-ray's own operator and occurrence, as the
SGLang-tests column does), runs ``vmfuzz run --target sglang --profile nightly
--time-budget S`` on it (the copy first on the path, a fresh example database and
report directory per mutant, the properties that drive the mutated file, as the
gate was given), reads what killed it from the run's summary.json origins (never
its words), and puts the file back. Verdicts go to WORK/nightly.json after each
mutant, so a rerun with the same budget and seed resumes.

By default only the gate's survivors are run: a nightly costs its whole budget on
a mutant it cannot kill, so the survivors are where it can add something for its
cost. ``--mutants non-equivalent`` runs every killed and surviving mutant, which is
what a nightly's own score needs (about S seconds each); ``--mutants never-ran``
the suspected-equivalents whose mutated line the gate never reached. ``--limit K``
draws K of them (with ``--seed``).

``--first-finding`` stops each mutant's nightly (SIGTERM: it writes its reports)
as soon as its first finding is saved. A kill needs only one finding, so a killed
mutant costs its seconds to that finding rather than the whole budget, which is
what makes a nightly's score over every non-equivalent mutant affordable. Its
cost: when a raise is found first, a property that would have caught the mutant
later is not asked, so the by-a-check figure is a lower bound; killed-or-not is
exact.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from mutation_copy import mutant_written, pristine_copy
from mutation_records import HARNESS_ROOT, RAISING, imported_from, killing_origins

CHOICES = ("survived", "non-equivalent", "never-ran")


def chosen(work: Path, which: str, limit: int | None = None, seed: int = 1) -> list[dict]:
    """The mutants to run, as score.json's rows (report must have run); ``limit`` of them drawn with
    ``seed`` when there are more. ``never-ran``: mutants whose mutated line no property of the gate ran (its
    exit 3, not-exercised), where a longer search could show what they change."""
    import random
    rows = json.loads((work / "score.json").read_text())["mutants"]
    if which == "never-ran":
        out = [r for r in rows if r["outcome"] == "not-exercised"]
    else:
        keep = ("survived",) if which == "survived" else ("survived", "killed")
        out = [r for r in rows if r["outcome"] in keep]
    if limit is not None and len(out) > limit:
        out = sorted(random.Random(seed).sample(sorted(out, key=lambda r: r["job"]), limit), key=lambda r: r["job"])
    return out


@functools.lru_cache(maxsize=1)
def _known() -> tuple:
    """The shipped known findings that apply to the installed SGLang (the mutants' release)."""
    from importlib.metadata import PackageNotFoundError, version

    from vmfuzz.harness.engine.regression.known import applicable, default_known_root, entries
    try:
        installed = version("sglang")
    except PackageNotFoundError:
        return ()  # no release: no known finding applies
    return tuple(k for _, k in applicable(entries(default_known_root()), {"sglang": installed}))


def saved_origins(findings: Path) -> list[dict]:
    """The typed origins of the findings a run saved in ``findings``, upstream's known defects left out: a
    run replays each known finding first and saves what reproduces (``known-NAME.json``), which says
    nothing of a mutant. Matched on the origin's fields, as the run itself excuses them."""
    import msgspec

    from vmfuzz.harness.model.origin import Origin
    out = []
    for saved in sorted(findings.glob("*.json")):
        try:
            origin = json.loads(saved.read_text()).get("origin")
            typed = msgspec.convert(origin, Origin)
        except (OSError, ValueError, AttributeError, msgspec.ValidationError):
            continue
        if not any(k.matches(typed) for k in _known()):
            out.append(origin)
    return out


def verdict(code: int, summary: Path) -> dict:
    """What the nightly said of one mutant, from its exit and the typed origins of its summary and of the
    findings saved beside it. A run stopped at its first finding (143) can end before its summary lists a
    finding a worker had already saved; the saved file's own origin still names it."""
    origins = killing_origins(summary) + saved_origins(summary.parent / "findings")
    props = sorted({o["property"] for o in origins if o.get("effect") not in RAISING and o.get("property")})
    # 143: SIGTERM, sent at the first finding under --first-finding; the reports are still written
    if code in (1, 143) and props:
        said = "killed (a property's check)"
    elif code in (1, 143) and origins:
        said = "killed (the mutant raising)"
    elif code == 0:
        said = "survived"
    elif code == 3:
        said = "could not check (exit 3)"
    else:
        said = f"error (exit {code}{', no origin' if code in (1, 143) else ''})"
    return {"verdict": said, "properties": props, "exit": code}


def run_one(copy: Path, rel: str, properties: list[str], budget: float, seed: int, scratch: Path,
            first_finding: bool = False) -> dict:
    """The nightly on ``copy`` as it is now (mutated by the caller); with ``first_finding``, stopped
    once a finding is saved in its report's findings folder."""
    for d in ("report", "db"):
        shutil.rmtree(scratch / d, ignore_errors=True)
    cmd = [sys.executable, "-W", "ignore", "-m", "vmfuzz", "run", "--target", "sglang", "--profile", "nightly",
           "--time-budget", str(budget), "--workers", "2", "--seed", str(seed), "--db", str(scratch / "db"),
           "--report-dir", str(scratch / "report"), "--overwrite"]
    for p in properties:
        cmd += ["--property", p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(copy.resolve() / "python"), str(HARNESS_ROOT)]),
               PYTHONDONTWRITEBYTECODE="1", TRITON_INTERPRET="1")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    start = time.monotonic()
    # a budget is the run's own; the margin covers the import and the report before it is called a hang
    code = _wait(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, env=env,
                                  cwd=scratch),
                 start + budget * 1.5 + 300, scratch / "report" / "findings" if first_finding else None)
    if code is None:
        return {"verdict": "error (ran past its budget by half)", "properties": [], "exit": None,
                "wall_s": round(time.monotonic() - start)}
    out = verdict(code, scratch / "report" / "summary.json")
    imported = imported_from(scratch / "report" / "summary.json")
    if imported is not None and Path(imported).resolve() != (copy / "python" / "sglang").resolve():
        # a verdict on the installed package says nothing of the mutant
        out = {"verdict": f"error (the run imported SGLang from {imported}, not the mutated copy)",
               "properties": [], "exit": code}
    out["wall_s"] = round(time.monotonic() - start)
    return out


def _wait(proc: subprocess.Popen, until: float, findings: Path | None) -> int | None:
    """The run's exit status; None (and the run killed) past ``until``. A new finding saved in ``findings``
    (not a known one's replay) sends SIGTERM once, after which the run writes its reports and exits 143."""
    stopping = False
    while proc.poll() is None:
        if time.monotonic() > until:
            proc.kill()
            proc.wait()
            return None
        if findings is not None and not stopping and saved_origins(findings):
            proc.send_signal(signal.SIGTERM)
            stopping = True
        time.sleep(0.5)
    # A run past its own signal handling (its reports written, or not yet started) dies of the SIGTERM
    # itself: the same stop, judged by what it saved
    return 143 if stopping and proc.returncode == -signal.SIGTERM else proc.returncode


def rejudge(work: Path, budget: float, seed: int, which: str, limit: int | None = None,
            first_finding: bool = False) -> dict:
    """Run the nightly on the chosen mutants; WORK/nightly.json after each one."""
    from cosmic_ray.work_db import WorkDB, use_db

    copy, driven = pristine_copy(work)
    out = work / "nightly.json"
    state = {"budget": budget, "seed": seed, "first_finding": first_finding, "verdicts": {}}
    if out.exists():
        old = json.loads(out.read_text())
        if (old.get("budget"), old.get("seed"), old.get("first_finding", False)) == (budget, seed, first_finding):
            state["verdicts"] = old["verdicts"]
    rows = {r["job"]: r for r in chosen(work, which, limit, seed)}
    with use_db(str(work / "session.sqlite"), WorkDB.Mode.open) as db:
        items = [item for item, _ in db.completed_work_items if item.job_id in rows]
    scratch = work / "nightly-scratch"
    scratch.mkdir(exist_ok=True)
    print(f"mutation_score: a {budget:.0f}s nightly on {len(items)} mutant(s) ({which}), seed {seed}"
          + (", each stopped at its first finding" if first_finding else ""))
    for item in items:
        if item.job_id in state["verdicts"]:
            continue
        m = item.mutations[0]
        rel = str(m.module_path).removeprefix("python/sglang/")
        with mutant_written(copy, item) as applied:
            said = (run_one(copy, rel, sorted(driven["files"][rel]), budget, seed, scratch, first_finding) if applied
                    else {"verdict": "error: cosmic-ray could not apply this mutant again", "properties": []})
        said["gate"] = rows[item.job_id]["outcome"]
        state["verdicts"][item.job_id] = said
        print(f"mutation_score: {rel}:{m.start_pos[0]} {m.operator_name.split('/')[-1]}: {said['verdict']}", flush=True)
        out.write_text(json.dumps(state, indent=1))
    return state


def section(done: list[dict], state: dict | None) -> list[str]:
    """score.md's lines for the nightly, beside the gate's verdicts."""
    if not state or not state.get("verdicts"):
        return []
    verdicts = state["verdicts"]
    stopped = ", each stopped at its first finding" if state.get("first_finding") else ""
    out = [f"## A {state['budget']:.0f}-second nightly (seed {state['seed']}{stopped}) beside the gate", "",
           "| mutant | gate | nightly | nightly's killing properties | seconds |", "|---|---|---|---|---|"]
    for r in done:
        v = verdicts.get(r["job"])
        if v:
            out.append(f"| `{r['file']}:{r['line']}` {r['operator']} | {r['outcome']} | {v['verdict']} "
                       f"| {', '.join(v['properties']) or '-'} | {v.get('wall_s', '-')} |")
    for gate, what in (("survived", "survivor(s)"), ("suspected-equivalent", "suspected-equivalent(s)")):
        ran = [v for v in verdicts.values() if v.get("gate") == gate]
        caught = sum(v["verdict"] == "killed (a property's check)" for v in ran)
        if ran:
            out += ["", f"Of the gate's {len(ran)} {what} run, the nightly killed {caught} by a property's check."]
    ran = [v for v in verdicts.values() if v.get("gate") in ("killed", "survived")]
    if ran:
        checked = sum(v["verdict"] == "killed (a property's check)" for v in ran)
        raised = sum(v["verdict"] == "killed (the mutant raising)" for v in ran)
        out += ["", f"**Of the {len(ran)} non-equivalent mutants run, the nightly killed {checked + raised} "
                    f"({100 * (checked + raised) // len(ran)}%)**: {checked} by a property's check "
                    f"({100 * checked // len(ran)}%), {raised} only by the mutant raising."]
        if stopped:
            out.append("Each run stopped at its first finding: where a raise came first, a later property's "
                       "catch was not asked for, so the by-a-check figure is a lower bound.")
    return out + [""]
