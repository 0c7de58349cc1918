"""What a run's reports say at the end: where they went, the lines a person reads, the exit code.

Read from the verdict the summary holds (decided once, before the reports were
written: ``vmfuzz.harness.report.decide``): the verdict a person reads is the
one the reports on disk hold, and the exit code is that verdict's.
"""

from __future__ import annotations

import sys
from pathlib import Path

from vmfuzz.harness.model.errors import EXIT_COULD_NOT_CHECK
from vmfuzz.harness.model.verdict import Kind, Verdict
from vmfuzz.harness.report.terminal import paint, plural


def write_reports_somewhere(write, summary: dict, report_dir: Path):
    """``summary`` (its verdict decided) written into ``report_dir`` by ``write``, or, when that broke
    mid-run, into a fallback place (said on stderr) with the verdict those reports then hold
    (``not_written``); returns (the summary as written, where it went: None when nowhere could hold it)."""
    from vmfuzz.harness.report.decide import verdict_of, with_verdict
    try:
        write(summary, report_dir)
        return summary, report_dir
    except OSError as exc:
        from vmfuzz.harness.model.validate import fallback_dir
        summary = with_verdict(summary, not_written(verdict_of(summary), report_dir))
        where = fallback_dir() / "reports"
        try:
            write(summary, where)
        except OSError as again:
            # A limit on every file this process writes (ulimit -f) stops the fallback too: the
            # findings are on disk and the verdict stands; the reports are what is missing.
            print(f"vmfuzz: cannot write reports to {report_dir} ({exc.strerror or exc}) nor to {where} "
                  f"({again.strerror or again}); the findings' repros are on disk", file=sys.stderr)
            return summary, None
        print(f"vmfuzz: cannot write reports to {report_dir} ({exc.strerror or exc}); wrote them to {where}",
              file=sys.stderr)
        return summary, where


def say_written(outcome, written: Path | None) -> None:
    """The deployment's verdict (when the run had one) and where the reports went."""
    if outcome.deployment:
        _say_deployment(outcome.deployment)
    print(f"reports: {written}/ (summary.json, summary.md, junit.xml, report.html)" if written
          else "reports: none written (see above)")


def _say_deployment(d: dict) -> None:
    print(f"deployment {d['label']}: {'CAN' if d['can_write_out_of_range'] else 'cannot'} "
          f"write out of range: {d['why']}")
    for part in ("routing", "allocation"):
        v = d.get(part)
        if v:
            state = {True: "held", False: "FAILED", None: "not checked"}[v["ok"]]
            print(f"  {part}: {state}: {v['why']}")


def _say_known(plan_, outcome) -> None:
    """Known findings (upstream's defects): listed by every command, failing only with --fail-on-known;
    one whose replay ran and held is said retired, one that fails another way is a finding."""
    from vmfuzz.harness.model.known_file import DIFFERENT, GONE, REPRODUCES
    for o in outcome.known:
        k = o.entry
        if o.status == GONE:
            print(f"known finding {k.name} no longer reproduces on this SGLang (its replay held; sglang {k.sglang} "
                  "in known/): retire it or narrow its range")
        elif o.status == DIFFERENT:
            print(f"{paint('known finding fails differently', 'FAILED')} {k.name} ({k.repro.property}): "
                  f"{o.detail}\n      repro:   {o.repro}")
        elif o.status == REPRODUCES:
            state = paint("known finding", "FAILED") if plan_.fail_on_known else "known finding"
            print(f"{state} (upstream's to fix, not a new cause): {k.name} ({k.repro.property}): {k.reason}"
                  + (f"\n      repro:   {o.repro}" if o.repro else ""))
        else:
            print(f"known finding {k.name}: its replay could not run ({o.detail})")


def _say_groups(groups: list[dict]) -> None:
    """One block per cause: what it is, which properties saw it, its one minimal repro."""
    for i, g in enumerate(groups, 1):
        head = f"known group ({g['known']})" if g.get("known") else paint("finding group", "FAILED")
        print(f"{head} {i}: {g['signature']} ({plural(g['count'], 'finding')}, "
              f"seen by {', '.join(g['properties'])})")
        print(f"      repro:   {g['repro']} ({g['repro_property']}): {g['detail']}")
        if g.get("partly_known"):
            print(f"      new cause, beside known entry {g['partly_known']}'s: {'; '.join(g['not_known'])}")


def held_line(summary: dict, target_name: str) -> str:
    """``all 3 properties held``: what held, and which properties this target could not drive."""
    props = summary["properties"]
    undriven = [p["name"] for p in props if p["status"] == "not driven"]
    if undriven:
        return (f"{plural(len(props) - len(undriven), 'property', 'properties')} {paint('held')}; "
                f"not driven on {target_name}: " + ", ".join(undriven))
    if len(props) == 1:
        return f"{props[0]['name']} {paint('held')}"
    return f"all {len(props)} properties {paint('held')}"


def _findings_line(v: Verdict, summary: dict, target_name: str) -> str:
    return f"{paint('FAILED')}: {v.why}"


def _unchecked(v: Verdict, summary: dict, target_name: str) -> str:
    return paint(f"{v.headline}: {v.why}", "could not check")


#: the terminal's closing line for each verdict: every kind (tests/test_verdict.py), and exit 3
#: always reads "could not check"
CLOSING = {
    Kind.HELD: lambda v, s, t: held_line(s, t),
    Kind.KNOWN: lambda v, s, t: held_line(s, t) + " (known findings only: upstream's to fix)",
    Kind.NEW_FINDING: _findings_line,
    **dict.fromkeys((Kind.HELD_IN_PART, Kind.COULD_NOT_CHECK, Kind.NEEDS_GPU, Kind.OUT_OF_STEP, Kind.CANNOT_LOAD,
                     Kind.LANE_LOST), _unchecked),
    Kind.INTERRUPTED: lambda v, s, t: paint(f"{v.headline}: {v.why}", "could not check"),
}


def closing_line(v: Verdict, summary: dict, target_name: str) -> str:
    return CLOSING[v.kind](v, summary, target_name)


def not_written(v: Verdict, report_dir: Path) -> Verdict:
    """The verdict when the reports could not go where they were asked: a pass becomes could not
    check (CI finds nothing where it looks); a finding or another exit 3 stands."""
    if v.exit_code != 0:
        return v
    return Verdict.of(Kind.COULD_NOT_CHECK, f"the reports could not be written to {report_dir}")


def verdict(plan_, target, outcome, summary: dict, written: Path | None) -> int:
    """The run's last lines and its exit code, read from the verdict the summary holds (decided once,
    before the reports were written: ``vmfuzz.harness.report.decide``)."""
    from vmfuzz.harness.report.decide import verdict_of
    from vmfuzz.harness.report.unchecked import cap_line
    v = verdict_of(summary)
    if v.kind is Kind.INTERRUPTED:
        print(closing_line(v, summary, target.name))
        return v.exit_code
    if cap_line(summary):
        print(cap_line(summary))
    _say_known(plan_, outcome)
    groups = summary.get("groups", [])
    if v.kind is Kind.NEW_FINDING and groups:
        where = plan_.findings_dir if written == plan_.report_dir else "the repro paths above"
        _say_groups(groups)
        new = [g for g in groups if not g.get("known") or plan_.fail_on_known]
        known = len(groups) - len(new)
        also = f", and {plural(known, 'known group')} (listed above)" if known else ""
        print(f"{paint(plural(len(new), 'finding group'), 'FAILED')} "
              f"({plural(sum(g['count'] for g in new), 'finding')}){also} "
              f"written under {where}; replay a group's repro with: vmfuzz replay FILE")
        return v.exit_code
    for w in (summary.get("gate") or {}).get("warnings", []):
        print(f"vmfuzz: warning: {w}", file=sys.stderr)
    gate_lines = (summary.get("gate") or {}).get("could_not_check") or []
    unfinished = summary.get("unfinished") or []
    if unfinished and v.kind is Kind.COULD_NOT_CHECK and v.why.startswith(unfinished[0]):
        for line in unfinished + gate_lines:  # what the run did not finish, then the gate's lines: each a line
            print(f"vmfuzz: could not check: {line}", file=sys.stderr)
    elif v.kind in (Kind.COULD_NOT_CHECK, Kind.NEEDS_GPU) and gate_lines and v.why.startswith(gate_lines[0]):
        for line in gate_lines:  # the gate's measured lines: each is a line
            print(f"vmfuzz: could not check: {line}", file=sys.stderr)
    elif v.exit_code == EXIT_COULD_NOT_CHECK:
        print(f"vmfuzz: could not check: {v.why}", file=sys.stderr)
    if v.kind is Kind.NEW_FINDING:
        print(f"the deployment's routing or allocation fails (recorded in {written}/summary.json)")
        return v.exit_code
    known_groups = [g for g in groups if g.get("known")]
    if known_groups and v.exit_code == 0:
        _say_groups(known_groups)
        print(f"no new finding group; {plural(len(known_groups), 'known group')} listed above "
              "(upstream's to fix; --fail-on-known fails on them)")
    print(closing_line(v, summary, target.name))
    return v.exit_code
