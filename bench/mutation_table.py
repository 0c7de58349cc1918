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
  bench/mutation_equiv.py), and that no wider search has shown equivalent. A survivor whose
  outputs differ is a real gap of the gate, listed with the buffer that differs;
  one whose outputs were not compared counts as survived;
- equivalent: suspected-equivalent, and identical again over a wider search than the gate's
  (``vmfuzz-wide: identical``, bench/mutation_wide.py); a wider search that shows a difference or a
  finding makes it a survivor.

The quoted shares and the false greens with their reasons: bench/mutation_shares.py.

A kill is credited to a property only through a ``vmfuzz-origin:`` line naming
it with a property's own effect; a kill whose origins are all the mutant
raising, crashing or hanging is its own column; a kill with no origin credits
nothing. The diff-text heuristic this replaced (only a log line, an assert's
message or a string changed) is gone: every mutant it matched produces
identical outputs, so the behaviour check finds all of them and more.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from mutation_nightly import section
from mutation_shares import shares
from mutation_records import (CPU_LINE, EQUIV_LINE, EXIT_LINE, OUTCOMES, STILLBORN_LINE, TESTS_LINE, WIDE_LINE,
                              classify, killed_by, killing_properties, line, measured_lines)

#: the fates of a mutant the gate passed on the mask's path
PASSED = ("survived", "suspected-equivalent", "equivalent")


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
            "equiv": line(EQUIV_LINE, out) if outcome in PASSED else None,
            "wide": line(WIDE_LINE, out) if outcome in PASSED else None,
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


COLUMNS = ("killed", "by a check", "by raising", "survived", "suspected-equivalent", "equivalent", "not-exercised",
           "off-path", "timed-out", "out-of-step", "error", "stillborn")


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
    """The figures a maintainer can quote, each false green with its reason, and the gate's throughput."""
    got = shares(done)
    out = ["## Headline", "",
           f"**Caught by a property's check: {got.over_all()} of all exercised non-raising mutants**, beside "
           f"**{got.over_non_equivalent()} of those not shown equivalent** ({got.equivalent} shown equivalent by "
           "a wider search than the gate's are left out of the second; a suspected-equivalent one stays in it).",
           "", f"Exercised non-raising ({got.exercised}): the mutated line ran under a property on the mask's path "
           f"and the mutant did not raise: {total['by a check']} killed by a property's check, "
           f"{total['killed'] - total['by a check'] - total['by raising']} killed with no origin printed, "
           f"{total['survived']} survived, {total['suspected-equivalent']} suspected-equivalent (identical on the "
           f"gate's examples only), {total['equivalent']} equivalent (identical in the wider search too).", "",
           f"**False green: {len(got.false_greens)}** (the gate exited 0 on the mask's path and the mutant is not "
           "shown equivalent)" + (", each with its reason:" if got.false_greens else "."), ""]
    out += [f"- `{r['file']}:{r['line']}` {r['operator']}: {why}" for r, why in got.false_greens]
    out += ["" if got.false_greens else None,
            f"Counted apart: {total['by raising']} killed only by the mutant raising or crashing, "
            f"{total['not-exercised']} not exercised (exit 3 naming the mutated line), {total['off-path']} off the "
            f"mask's path, {total['out-of-step']} out of step, {total['error']} error, {total['timed-out']} timed "
            f"out, {total['stillborn']} stillborn."]
    out = [x for x in out if x is not None]
    if total["stillborn"]:
        python = sum(r["outcome"] == "stillborn" and "Python's compiler" in (r["stillborn"] or "") for r in done)
        out += ["", f"Of the {total['stillborn']} stillborn (each never running anywhere), "
                    f"{total['stillborn'] - python} raised in a Triton kernel that Triton's compiler "
                    f"refuses (its frontend, lowering to TTIR for a CUDA GPU); in {python}, Python's own compiler "
                    "refuses the mutated file."]
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
        alive = [r for r in done if r["outcome"] in PASSED]
        out += [f"Of the {len(gate_killed)} mutants the gate kills, SGLang's tests kill {tests_kill(gate_killed)}; "
                f"of the {len(alive)} it leaves alive (survived, suspected-equivalent or equivalent), they kill "
                f"{tests_kill(alive)}.", ""]
    return out


def survivor_notes(done: list[dict]) -> list[str]:
    surv = ["# Surviving mutants (where the gate is blind)", ""]
    for r in done:
        if r["outcome"] in PASSED:
            what = r["outcome"] if r["outcome"] != "survived" else f"survived; outputs {r['equiv'] or 'not compared'}"
            what += f"; wider search: {r['wide']}" if r.get("wide") else ""
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
    md += section(done, nightly)
    data["nightly"] = nightly
    (work / "score.md").write_text("\n".join(md))
    (work / "survivors.md").write_text("\n".join(survivor_notes(done)))
    (work / "score.json").write_text(json.dumps(data, indent=1))
    print(data["headline"])
    print("\n".join(headline(Counter(data["total"]), done)[2:]).strip())
    print(f"tables: {work / 'score.md'}; survivors' diffs: {work / 'survivors.md'}")
    return data
