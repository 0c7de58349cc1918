"""The mutation score's tables, read from a cosmic-ray session that bench/mutation_score.py ran.

Each sampled mutant is one of:

- killed: the gate exited 1 (a property failed, or a saved repro);
- survived (**false green**): the gate exited 0 on a mutated line a property ran or that lies on
  the mask's path, and its outputs were not shown identical;
- not-exercised: the gate exited 3 because no property ran the mutated line on the mask's path
  (its diff coverage, ``vmfuzz-lines: never_ran``): the gate said it could not check, never a pass;
- off-path: the gate exited 0 and measured the mutated line outside what it judges (a function no
  surface row names, run by no property: decode or prefill only): out of scope, counted apart;
- timed-out: the gate ran past the per-mutant timeout;
- out-of-step: the gate exited 3 (vmfuzz could not check this code: never a kill);
- error: the gate exited 2, or cosmic-ray could not run the mutant (never a kill);
- stillborn: killed only by the mutant raising, in a Triton kernel that Triton's own
  frontend refuses to compile for a GPU (``vmfuzz-stillborn: refused``, bench/stillborn.py),
  or a file Python's compiler refuses (the gate cannot import it):
  the mutant never runs anywhere, so it is neither a kill nor a survivor;
- suspected-equivalent: a survivor whose gate handed its checks byte-identical
  outputs to the pristine code's, on every example both gate runs checked
  (``vmfuzz-equiv: identical``, recorded by the gate itself and compared by
  bench/mutation_equiv.py; older runs compared the fixed cases replayed after it). A survivor whose
  outputs differ is a real gap of the gate, listed with the buffer that differs;
  one whose outputs were not compared counts as survived.

A kill is credited to a property only through a ``vmfuzz-origin:`` line naming
it with a property's own effect; a kill whose origins are all the mutant
raising, crashing or hanging is its own column; a kill with no origin credits
nothing. The diff-text heuristic this replaced (only a log line, an assert's
message or a string changed) is gone: every mutant it matched produces
identical outputs, so the behaviour check finds all of them and more.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

OUTCOMES = ("killed", "survived", "suspected-equivalent", "not-exercised", "off-path", "timed-out", "out-of-step",
            "error", "stillborn")
EXIT_LINE = re.compile(r"vmfuzz-kill: exit (-?\d+)")
EQUIV_LINE = re.compile(r"^vmfuzz-equiv: (.*)$", re.M)
STILLBORN_LINE = re.compile(r"^vmfuzz-stillborn: (.*)$", re.M)
TESTS_LINE = re.compile(r"^vmfuzz-sglang-tests: (.*)$", re.M)
LINES_LINE = re.compile(r"^vmfuzz-lines: (\{.*\})$", re.M)
CPU_LINE = re.compile(r"^vmfuzz-cpu: ([\d.]+) s gate; examples (\d+|None)", re.M)
RAISING = ("raise", "crash", "hang")


def line(pattern: re.Pattern, output: str | None) -> str | None:
    m = pattern.search(output or "")
    return m.group(1).strip() if m else None


def classify(result) -> str:
    if result.worker_outcome != "normal":
        return "error"
    if result.output == "timeout":
        return "timed-out"
    m = EXIT_LINE.search(result.output or "")
    code = int(m.group(1)) if m else None
    measured = measured_lines(result.output)
    if code == 0:
        if measured.get("outside") and not measured.get("judged_by"):
            return "off-path"
        equiv = line(EQUIV_LINE, result.output) or ""
        return "suspected-equivalent" if equiv.startswith("identical") else "survived"
    if code == 1:
        refused = (line(STILLBORN_LINE, result.output) or "").startswith("refused")
        return "stillborn" if refused and killed_by(result.output) == "the mutant raising" else "killed"
    if code == 3:
        return "not-exercised" if measured.get("never_ran") else "out-of-step"
    # a mutant Python itself will not compile (the gate cannot import it: exit 2) never runs anywhere
    if code == 2 and (line(STILLBORN_LINE, result.output) or "").startswith("refused"):
        return "stillborn"
    return "error"


def measured_lines(output: str | None) -> dict:
    """What the gate measured of the mutated line (bench/mutation_kill.py's ``vmfuzz-lines:``)."""
    said = line(LINES_LINE, output)
    try:
        return json.loads(said) if said else {}
    except ValueError:
        return {}


#: one typed origin of what killed the mutant, printed first by bench/mutation_kill.py
ORIGIN_LINE = re.compile(r"^vmfuzz-origin: (\{.*\})$", re.M)


def killed_by(output: str) -> str:
    """Who killed it, from the origins the kill command printed (never from message text):
    a property's own check when some origin is a property's judgement; the mutant raising (or
    crashing) when every origin is a raise/crash/hang, which is its own column and never a
    property's kill; "unknown" when no origin was printed (a run with no output credits nothing)."""
    origins = [json.loads(m) for m in ORIGIN_LINE.findall(output or "")]
    if not origins:
        return "unknown"
    if any(o.get("effect") not in RAISING for o in origins):
        return "a property's check"
    return "the mutant raising"


def killing_properties(output: str) -> list[str]:
    """The properties a kill is credited to: those named by a non-raise origin."""
    origins = [json.loads(m) for m in ORIGIN_LINE.findall(output or "")]
    return sorted({o["property"] for o in origins if o.get("effect") not in RAISING and o.get("property")})


def mutant_row(job: str, m, result) -> dict:
    """One sampled mutant as the tables read it: its fate, who killed it, what its outputs showed,
    SGLang's tests' verdict and the gate's CPU time."""
    outcome, out = classify(result), result.output
    cpu = CPU_LINE.search(out or "")
    return {"job": job, "file": str(m.module_path).removeprefix("python/sglang/"),
            "operator": m.operator_name.split("/")[-1], "line": m.start_pos[0], "outcome": outcome,
            "diff": result.diff or "",
            "killed_by": killed_by(out) if outcome == "killed" else None,
            "properties": killing_properties(out) if outcome == "killed" else [],
            "equiv": line(EQUIV_LINE, out) if outcome in ("survived", "suspected-equivalent") else None,
            "lines": measured_lines(out),
            "stillborn": line(STILLBORN_LINE, out),
            "sglang_tests": line(TESTS_LINE, out),
            "gate_cpu_s": float(cpu.group(1)) if cpu else None,
            "examples": int(cpu.group(2)) if cpu and cpu.group(2) != "None" else None,
            "exit_line": (EXIT_LINE.search(out or "") or [None])[0]}


def rows(work: Path):
    from cosmic_ray.work_db import WorkDB, use_db
    with use_db(str(work / "session.sqlite"), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome != "skipped":
                yield mutant_row(item.job_id, item.mutations[0], result)


COLUMNS = ("killed", "by a check", "by raising", "survived", "suspected-equivalent", "not-exercised", "off-path",
           "timed-out", "out-of-step", "error", "stillborn")


def _column(r: dict) -> list[str]:
    """The columns a mutant counts in: its outcome, and a kill's split by who killed it."""
    extra = {"a property's check": ["by a check"], "the mutant raising": ["by raising"]}.get(r["killed_by"], [])
    return [r["outcome"], *extra]


def _table(title: str, counts: dict[str, Counter]) -> list[str]:
    out = [f"| {title} | " + " | ".join(COLUMNS) + " | score |", "|---" * (len(COLUMNS) + 2) + "|"]
    for key in sorted(counts):
        c = counts[key]
        judged = c["killed"] + c["survived"]
        score = f"{c['killed'] / judged:.0%}" if judged else "-"
        out.append(f"| `{key}` | " + " | ".join(str(c[o]) for o in COLUMNS) + f" | {score} |")
    return out


def headline(total: Counter, done: list[dict]) -> list[str]:
    """The sentence a maintainer can quote, and the gate's throughput."""
    non_equivalent = total["killed"] + total["survived"]
    by_check = total["by a check"]
    out = ["## Headline", ""]
    on_path = sum(total[c] for c in ("killed", "survived", "suspected-equivalent", "not-exercised"))
    if on_path:
        out += [f"**False green: {total['survived']} of {on_path} mutants on the mask's path "
                f"({total['survived'] / on_path:.0%})**: the gate exited 0 although the mutant ran under a "
                f"property and its outputs were not shown identical. {total['not-exercised']} exited 3 (a "
                f"mutated line no property ran, named by the gate), {total['off-path']} lie off the mask's path "
                "(counted apart).", ""]
    if non_equivalent:
        out.append(f"**The gate kills {by_check / non_equivalent:.0%} of non-equivalent mutants by a property's "
                   f"check** ({by_check} killed by a property's check / ({total['killed']} killed + "
                   f"{total['survived']} survived with outputs not shown identical); "
                   f"{total['by raising']} more only by the mutant raising or crashing.")
        ran_on = non_equivalent - total["by raising"]
        if total["by raising"] and ran_on:
            # Not the headline: a raise is the gate's kill but no property's, and a maintainer asks both
            # how often the gate stops a bad change and how often a property saw what went wrong.
            out += ["", f"Of the {ran_on} non-equivalent mutants that did not raise (a raise leaves no output for "
                        f"any check to judge), the properties caught {by_check / ran_on:.0%} ({by_check}/{ran_on})."]
    else:
        out.append("No mutant was judged (none killed, none survived).")
    if total["stillborn"]:
        python = sum(r["outcome"] == "stillborn" and "Python's compiler" in (r["stillborn"] or "") for r in done)
        out += ["", f"{total['stillborn']} stillborn mutant(s) left out of both figures, each never running "
                    f"anywhere: {total['stillborn'] - python} raised in a Triton kernel that Triton's compiler "
                    f"refuses (its frontend, lowering to TTIR for a CUDA GPU); in {python}, Python's own compiler "
                    "refuses the mutated file."]
    unrun = sum(r["outcome"] == "suspected-equivalent" and "never ran" in (r["equiv"] or "") for r in done)
    if unrun:
        out += ["", f"{unrun} of the {total['suspected-equivalent']} suspected-equivalent mutants never ran their "
                    f"mutated line on the fixed cases (identical because unreached, not shown equivalent); "
                    f"counted as survivors the figure is {by_check / (non_equivalent + unrun):.0%}."]
    cpus = [r["gate_cpu_s"] for r in done if r["gate_cpu_s"] is not None]
    if cpus and sum(cpus) > 0:
        kills = sum(r["outcome"] == "killed" for r in done if r["gate_cpu_s"] is not None)
        examples = [r["examples"] for r in done if r["gate_cpu_s"] is not None and r["examples"] is not None]
        out += ["", f"Throughput: {kills / (sum(cpus) / 60):.2f} kills per CPU-minute of the gate "
                    f"({kills} kills, {sum(cpus):.0f} CPU s (user+sys) over {len(cpus)} gate runs)"
                + (f"; {sum(examples) / sum(cpus):.1f} property examples per CPU-second" if examples else "")
                + "."]
    return out + [""]


def side_by_side(done: list[dict]) -> list[str]:
    """Each mutant's fate under the gate and under SGLang's own tests."""
    out = ["## The gate beside SGLang's own tests", "",
           "| mutant | gate | killing properties | outputs vs pristine | SGLang's tests |", "|---|---|---|---|---|"]
    for r in done:
        gate = r["outcome"] + (f" ({r['killed_by']})" if r["killed_by"] else "")
        out.append(f"| `{r['file']}:{r['line']}` {r['operator']} | {gate} | {', '.join(r['properties']) or '-'} "
                   f"| {r['equiv'] or '-'} | {r['sglang_tests'] or 'not run: no checkout given'} |")
    tests = Counter("not run" if (r["sglang_tests"] or "not run").startswith("not run")
                    else r["sglang_tests"].split(" ")[0].rstrip(":") for r in done)
    out += ["", "SGLang's tests: " + ", ".join(f"{n} {k}" for k, n in sorted(tests.items())) + ".", ""]
    if tests["killed"] + tests["survived"]:
        def tests_kill(rs):
            return sum((r["sglang_tests"] or "").startswith("killed") for r in rs)
        gate_killed = [r for r in done if r["outcome"] == "killed"]
        alive = [r for r in done if r["outcome"] in ("survived", "suspected-equivalent")]
        out += [f"Of the {len(gate_killed)} mutants the gate kills, SGLang's tests kill {tests_kill(gate_killed)}; "
                f"of the {len(alive)} it leaves alive (survived or suspected-equivalent), they kill "
                f"{tests_kill(alive)}.", ""]
    return out


def survivor_notes(done: list[dict]) -> list[str]:
    surv = ["# Surviving mutants (where the gate is blind)", ""]
    for r in done:
        if r["outcome"] in ("survived", "suspected-equivalent"):
            what = r["outcome"] if r["outcome"] != "survived" else f"survived; outputs {r['equiv'] or 'not compared'}"
            surv += [f"## {r['file']}:{r['line']} {r['operator']} ({what})", "", "```diff", r["diff"].strip(),
                     "```", ""]
    return surv


def render(done: list[dict], plan: dict) -> tuple[list[str], dict]:
    """score.md's lines and score.json's data from the mutants' rows."""
    by_file, by_op, total = defaultdict(Counter), defaultdict(Counter), Counter()
    for r in done:
        for col in _column(r):
            by_file[r["file"]][col] += 1
            by_op[r["operator"]][col] += 1
            total[col] += 1
    judged = total["killed"] + total["survived"]
    head = (f"{len(done)} of {plan['sample']} sampled mutants run (seed {plan['seed']}; {plan.get('in_scope', plan['of'])} in scope ({plan.get('scope', 'files')}), {plan['of']} in the driven files); "
            + ", ".join(f"{total[o]} {o}" for o in OUTCOMES)
            + (f"; score killed / (killed + survived) = {total['killed'] / judged:.0%}" if judged else ""))
    by_killer = Counter(r["killed_by"] for r in done if r["killed_by"])
    killers = "Killed by: " + ", ".join(f"{n} {k}" for k, n in sorted(by_killer.items())) + "."
    md = ["# Mutation score of `vmfuzz gate --target sglang`", "", head, "", *headline(total, done), killers, "",
          *_table("file", by_file), "", *_table("operator", by_op), "", *side_by_side(done)]
    data = {"headline": head, "total": dict(total), "killed_by": dict(by_killer),
            "by_file": {k: dict(v) for k, v in by_file.items()}, "by_operator": {k: dict(v) for k, v in by_op.items()},
            "mutants": done}
    return md, data


def report(work: Path) -> dict:
    done = list(rows(work))
    # SGLang's tests judged after the exec (mutation_score.py sglang-tests): their verdicts win
    rejudged = work / "sglang_tests.json"
    if rejudged.exists():
        verdicts = json.loads(rejudged.read_text())["verdicts"]
        for r in done:
            r["sglang_tests"] = verdicts.get(r["job"], r["sglang_tests"])
    md, data = render(done, json.loads((work / "plan.json").read_text()))
    # a nightly run after the exec (mutation_score.py nightly): its own section, the gate's figures untouched
    nightly = json.loads((work / "nightly.json").read_text()) if (work / "nightly.json").exists() else None
    from mutation_nightly import section
    md += section(done, nightly)
    data["nightly"] = nightly
    (work / "score.md").write_text("\n".join(md))
    (work / "survivors.md").write_text("\n".join(survivor_notes(done)))
    (work / "score.json").write_text(json.dumps(data, indent=1))
    print(data["headline"])
    print("\n".join(headline(Counter(data["total"]), done)[2:]).strip())
    print(f"tables: {work / 'score.md'}; survivors' diffs: {work / 'survivors.md'}")
    return data
