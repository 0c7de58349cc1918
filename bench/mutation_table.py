"""The mutation score's tables, read from a cosmic-ray session that bench/mutation_score.py ran.

Each sampled mutant is one of:

- killed: the gate exited 1 (a property failed, or a saved repro);
- survived: the gate exited 0;
- timed-out: the gate ran past the per-mutant timeout;
- out-of-step: the gate exited 3 (vmfuzz could not check this code: never a kill);
- error: the gate exited 2, or cosmic-ray could not run the mutant (never a kill);
- suspected-equivalent: a survivor whose diff touches only what cannot change the mask:
  a log or warning call, an assert's message, a docstring or comment. Reported
  apart from the survivors, and still listed with them in survivors.md.

Mutants whose module output is byte-identical on the corpus would be a stronger
equivalence test; it is not run (it would need every driven function's outputs
recorded per mutant).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

OUTCOMES = ("killed", "survived", "suspected-equivalent", "timed-out", "out-of-step", "error")
EXIT_LINE = re.compile(r"vmfuzz-kill: exit (-?\d+)")
# lines whose change cannot reach the mask: logging, warnings, assert messages, strings alone
INERT = re.compile(r"^\s*(logger\.|log\.|logging\.|warnings\.warn|print\(|#|\"\"\"|'''|[rfbu]?[\"'].*[\"'],?\s*$)")


def changed_lines(diff: str) -> list[str]:
    return [ln[1:] for ln in (diff or "").splitlines()
            if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]


def suspected_equivalent(diff: str) -> bool:
    lines = changed_lines(diff)
    if not lines:
        return True
    return all(INERT.match(ln) or re.match(r"^\s*assert .*,\s*[rfbu]?[\"']", ln) and _same_condition(lines)
               for ln in lines)


def _same_condition(lines: list[str]) -> bool:
    """An assert whose condition is unchanged (only its message differs)."""
    conds = {ln.split(",")[0].strip() for ln in lines if ln.strip().startswith("assert ")}
    return len(conds) == 1


def classify(result) -> str:
    if result.worker_outcome != "normal":
        return "error"
    if result.output == "timeout":
        return "timed-out"
    m = EXIT_LINE.search(result.output or "")
    code = int(m.group(1)) if m else None
    if code == 0:
        return "suspected-equivalent" if suspected_equivalent(result.diff) else "survived"
    if code == 1:
        return "killed"
    if code == 3:
        return "out-of-step"
    return "error"


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
    if any(o.get("effect") not in ("raise", "crash", "hang") for o in origins):
        return "a property's check"
    return "the mutant raising"


def killing_properties(output: str) -> list[str]:
    """The properties a kill is credited to: those named by a non-raise origin."""
    origins = [json.loads(m) for m in ORIGIN_LINE.findall(output or "")]
    return sorted({o["property"] for o in origins if o.get("effect") not in ("raise", "crash", "hang")})


def rows(work: Path):
    from cosmic_ray.work_db import WorkDB, use_db
    with use_db(str(work / "session.sqlite"), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome == "skipped":
                continue
            m = item.mutations[0]
            file = str(m.module_path).removeprefix("python/sglang/")
            yield {"job": item.job_id, "file": file, "operator": m.operator_name.split("/")[-1],
                   "line": m.start_pos[0], "outcome": classify(result), "diff": result.diff or "",
                   "killed_by": killed_by(result.output) if classify(result) == "killed" else None,
                   "exit_line": (EXIT_LINE.search(result.output or "") or [None])[0]}


def _table(title: str, counts: dict[str, Counter]) -> list[str]:
    out = [f"| {title} | " + " | ".join(OUTCOMES) + " | score |", "|---" * (len(OUTCOMES) + 2) + "|"]
    for key in sorted(counts):
        c = counts[key]
        judged = c["killed"] + c["survived"]
        score = f"{c['killed'] / judged:.0%}" if judged else "-"
        out.append(f"| `{key}` | " + " | ".join(str(c[o]) for o in OUTCOMES) + f" | {score} |")
    return out


def report(work: Path) -> dict:
    done = list(rows(work))
    plan = json.loads((work / "plan.json").read_text())
    by_file, by_op, total = defaultdict(Counter), defaultdict(Counter), Counter()
    for r in done:
        by_file[r["file"]][r["outcome"]] += 1
        by_op[r["operator"]][r["outcome"]] += 1
        total[r["outcome"]] += 1
    judged = total["killed"] + total["survived"]
    head = (f"{len(done)} of {plan['sample']} sampled mutants run (seed {plan['seed']}; {plan.get('in_scope', plan['of'])} in scope ({plan.get('scope', 'files')}), {plan['of']} in the driven files); "
            + ", ".join(f"{total[o]} {o}" for o in OUTCOMES)
            + (f"; score killed / (killed + survived) = {total['killed'] / judged:.0%}" if judged else ""))
    by_killer = Counter(r["killed_by"] for r in done if r["killed_by"])
    killers = "Killed by: " + ", ".join(f"{n} {k}" for k, n in sorted(by_killer.items())) + "."
    md = [f"# Mutation score of `vmfuzz gate --target sglang`", "", head, "", killers, "",
          *_table("file", by_file), "", *_table("operator", by_op), ""]
    (work / "score.md").write_text("\n".join(md))
    surv = ["# Surviving mutants (where the gate is blind)", ""]
    for r in done:
        if r["outcome"] in ("survived", "suspected-equivalent"):
            surv += [f"## {r['file']}:{r['line']} {r['operator']} ({r['outcome']})", "", "```diff", r["diff"].strip(),
                     "```", ""]
    (work / "survivors.md").write_text("\n".join(surv))
    data = {"headline": head, "total": dict(total), "killed_by": dict(by_killer), "by_file": {k: dict(v) for k, v in by_file.items()},
            "by_operator": {k: dict(v) for k, v in by_op.items()},
            "mutants": [{k: v for k, v in r.items()} for r in done]}
    (work / "score.json").write_text(json.dumps(data, indent=1))
    print(head)
    print(f"tables: {work / 'score.md'}; survivors' diffs: {work / 'survivors.md'}")
    return data
