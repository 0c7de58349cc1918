"""summary.md: the run's report for a PR comment, its first line the verdict (``MD_HEADLINE``).

Written from summary.json's record alone (a run's, or ``merge``'s joined one), so
the comment a CI posts says what the record says, and the verdict every other
report reads.
"""

from __future__ import annotations

from vmfuzz.harness.model.summary_file import shared_runs
from vmfuzz.harness.model.verdict import Kind
from vmfuzz.harness.report.replays import replay_lines
from vmfuzz.harness.report.terminal import changed_line_rows, gate_line, shown
from vmfuzz.harness.report.unchecked import cap_line, unchecked_line

def shared_run_lines(props: list[dict]) -> list[str]:
    """Each shared run's time, once: its members' seconds are shares of it, never each its own."""
    return [f"\nShared run of {', '.join(m['name'] for m in members)}: "
            f"{sum(m['seconds'] for m in members):.1f} s (each case run once, every one judged on it)."
            for members in shared_runs(props).values()]


def _changed_lines_md(gate: dict) -> list[str]:
    """The gate's measured lines: one row per changed file, then each could-not-check line."""
    measured = changed_line_rows(gate)
    if not measured:
        return []
    out = ["| changed file | verdict | lines, and the property that ran each |", "|---|---|---|"]
    out += [f"| `{shown(path)}` | {verdict} | {detail} |" for path, verdict, detail in measured]
    out += [f"\n- could not check: {w}" for w in gate.get("could_not_check") or []]
    return out + [""]


#: summary.md's first-line words for each verdict (a PR comment's headline): every kind, and exit 3
#: always reads "could not check"
MD_HEADLINE = {
    Kind.HELD: "passed", Kind.KNOWN: "passed (known findings only)", Kind.NEW_FINDING: "**FAILED**",
    Kind.HELD_IN_PART: "**COULD NOT CHECK** (held in part)", Kind.COULD_NOT_CHECK: "**COULD NOT CHECK**",
    Kind.NEEDS_GPU: "**COULD NOT CHECK** (needs a GPU)", Kind.OUT_OF_STEP: "**COULD NOT CHECK** (vmfuzz out of step)",
    Kind.CANNOT_LOAD: "**COULD NOT CHECK** (cannot load the code under test)",
    Kind.LANE_LOST: "**COULD NOT CHECK** (a search lane was lost)", Kind.INTERRUPTED: "**INTERRUPTED**",
}


def summary_md(s: dict) -> str:
    from vmfuzz.harness.report.decide import verdict_of
    c = s["counts"]
    v = verdict_of(s)
    lines = [f"### vmfuzz {s['command']}: {MD_HEADLINE[v.kind]} on `{s['target']}`", "",
             *([f"{v.headline}: {v.why}  ", ""] if v.why and v.exit_code != 0 else []),
             f"profile `{s['profile']}`, seed `{s['seed']}`, {c['examples']} examples, "
             f"{c['held']} held / {c['failed']} failed / {c['skipped']} skipped"
             + (f" / {c['held_in_part']} held in part" if c.get("held_in_part") else "")
             + (f" / {c['could_not_check']} could not check" if c.get("could_not_check") else "")
             + f", {s['timings']['total_seconds']:.0f}s", ""]
    timing = [line + "  " for line in (unchecked_line(s), cap_line(s)) if line]
    lines += timing + [""] if timing else []
    lines += _code_under_test(s)
    if s.get("groups"):  # first: one line per cause, before the table and the findings
        lines += [f"#### Finding groups ({len(s['groups'])}: one per cause)", ""]
        lines += [f"- **{g['signature']}**{' (known: `' + g['known'] + '`)' if g.get('known') else ''}: "
                  f"{g['count']} finding(s), seen by {', '.join(g['properties'])}  \n"
                  f"  repro: `{g['repro']}` (`vmfuzz replay {g['repro']}`)" for g in s["groups"]]
        lines += [""]
    if s.get("deployment"):
        d = s["deployment"]
        lines += [f"Deployment {d['label']}: **{'can' if d['can_write_out_of_range'] else 'cannot'} "
                  f"write out of range** ({d['why']})", ""]
        for part in ("routing", "allocation"):
            if d.get(part):
                state = {True: "held", False: "**FAILED**", None: "not checked"}[d[part]["ok"]]
                lines += [f"- {part}: {state}: {d[part]['why']}"]
        lines += [""] if any(d.get(p) for p in ("routing", "allocation")) else []
    if s.get("gate"):
        line = gate_line(s["gate"], quote="`")
        lines += [f"G{line[1:]} (of {len(s['gate']['changed'])} changed)", "", *_changed_lines_md(s["gate"])]
    lines += ["| property | status | examples | seconds |", "|---|---|---:|---:|"]
    lines += [f"| {p['name']} | {p['status']} | {p['examples']} | "
              + ("shared |" if p.get("shared_run") else f"{p['seconds']:.1f} |") for p in s["properties"]]
    lines += shared_run_lines(s["properties"])
    lines += [f"\n- `{p['name']}` out of step: {p['out_of_step']}" for p in s["properties"] if p.get("out_of_step")]
    for w in s.get("warnings", []) + (s.get("gate") or {}).get("warnings", []):
        lines += [f"\n- warning: {w}"]
    lines += replay_lines(s) if s["replays"] else []
    if s.get("known_findings"):
        lines += ["", "#### Known findings (upstream's to fix; `known/`)", ""]
        lines += [f"- `{k['name']}` ({k['property']}, sglang {k['sglang']}): {k['status']}: {k['reason']}"
                  for k in s["known_findings"]]
    if s["findings"]:
        lines += ["", "#### Findings", ""]
        lines += [f"- `{f['property']}` ({f['kind']}): {f['detail']}  \n  repro: `{f['repro']}` "
                  f"(`vmfuzz replay {f['repro']}`)" for f in s["findings"]]
    deep = s.get("deep_boundary_corpus") or {}
    if deep.get("cases"):
        lines += ["", f"Deep boundary corpus: {deep['runs']} run(s) of {len(deep['cases'])} case(s) before "
                  f"the search, {deep['seconds']:.1f}s (sized from {deep['sized_from'] or 'the model'}):", ""]
        lines += [f"- {c}" for c in deep["cases"]]
    if s.get("bounds"):
        widest = s["bounds"][-1]
        lines += ["", f"Bounds ({len(s['bounds'])} step(s), widest): "
                  + ", ".join(f"{k} {v}" for k, v in widest.items())
                  + ("; reached " + ", ".join(f"{k} {v}" for k, v in s["reached"].items()) if s.get("reached") else "")]
    if len(s.get("bounds") or []) > 1:
        lines += ["", "| property | " + " | ".join(f"step {i + 1} (s)" for i in range(len(s["bounds"]))) + " |",
                  "|---|" + "---:|" * len(s["bounds"])]
        lines += [f"| {p['name']} | " + " | ".join(f"{x:.1f}" for x in p["seconds_by_bound_step"]) + " |"
                  for p in s["properties"]]
    if s.get("kernel") and s["kernel"].get("kernel_share") is not None:
        k = s["kernel"]
        lines += ["", f"Kernel launches: {k['launches']}, {k['kernel_seconds']:.1f}s inside them = "
                  f"{100 * k['kernel_share']:.0f}% of the search ({100 * (1 - k['kernel_share']):.0f}% harness overhead)"]
    versions = ", ".join(f"{k} {v}" for k, v in s["versions"].items())
    lines += ["", f"<sub>{versions}</sub>", ""]
    return "\n".join(lines)


def _code_under_test(s: dict) -> list[str]:
    """Which SGLang the verdict is about: the package's own version and where it was imported from."""
    versions = s.get("versions") or {}
    if "sglang path" not in versions:
        return []
    checkout = (s.get("gate") or {}).get("checkout")
    return [f"Code under test: sglang `{versions.get('sglang')}` from `{versions['sglang path']}`"
            + (f" (the checkout at `{checkout}`)" if checkout else ""), ""]
