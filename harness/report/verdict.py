"""What a run's reports say at the end: where they went, the lines a person reads, the exit code.

Written from the outcome and the summary alone, after the reports: the verdict a
person reads is the one the reports on disk hold.
"""

from __future__ import annotations

import sys
from pathlib import Path

from vmfuzz.harness.model.errors import (EXIT_COULD_NOT_CHECK, EXIT_FINDING, EXIT_OK, EXIT_OUT_OF_STEP,
                                         out_of_step_line)
from vmfuzz.harness.report.terminal import paint, plural


def write_reports_somewhere(write, outcome, report_dir: Path):
    """Reports into ``report_dir``, or, when it broke mid-run, into a fallback place (said on stderr);
    returns (summary, where they went: None when nowhere could hold them)."""
    try:
        return write(outcome, report_dir), report_dir
    except OSError as exc:
        from vmfuzz.harness.model.validate import fallback_dir
        where = fallback_dir() / "reports"
        try:
            summary = write(outcome, where)
        except OSError as again:
            # A limit on every file this process writes (ulimit -f) stops the fallback too: the
            # findings are on disk and the verdict stands; the reports are what is missing.
            from vmfuzz.harness.report.summary import build_summary
            print(f"vmfuzz: cannot write reports to {report_dir} ({exc.strerror or exc}) nor to {where} "
                  f"({again.strerror or again}); the findings' repros are on disk", file=sys.stderr)
            return build_summary(outcome), None
        print(f"vmfuzz: cannot write reports to {report_dir} ({exc.strerror or exc}); wrote them to {where}",
              file=sys.stderr)
        return summary, where


def say_written(outcome, written: Path | None) -> None:
    """The deployment's verdict (when the run had one) and where the reports went."""
    if outcome.deployment:
        _say_deployment(outcome.deployment)
    print(f"reports: {written}/ (summary.json, summary.md, junit.xml, report.html)" if written
          else "reports: none written (see above)")


def _out_of_step(outcome) -> bool:
    """Exit 3's one line when a check could not be made: a saved repro that could not be
    replayed (never a pass), or a check vmfuzz is out of step for.

    The gate counts only the out-of-step checks that drive a file the change
    touches (the rest are warnings in its summary); a run counts every one.
    """
    gate = outcome.gate or {}
    stuck = gate["out_of_step"] if "out_of_step" in gate else [why for _, why in outcome.out_of_step]
    for w in gate.get("warnings", []):
        print(f"vmfuzz: warning: {w}", file=sys.stderr)
    unreplayed = [o for o in outcome.replays if o.source == "saved" and o.status == "error"]
    if unreplayed:
        o = unreplayed[0]
        print(f"vmfuzz: could not check: saved repro {o.path} could not be replayed: {o.detail}", file=sys.stderr)
        return True
    if stuck:
        print(out_of_step_line(stuck[0]), file=sys.stderr)
    return bool(stuck)


def _lines_unchecked(outcome) -> bool:
    """The gate's measured lines: a changed line on the mask's path that no property ran,
    a mask-path function never entered, a file this machine cannot run. Each is a line."""
    stuck = (outcome.gate or {}).get("could_not_check") or []
    for line in stuck:
        print(f"vmfuzz: could not check: {line}", file=sys.stderr)
    return bool(stuck)


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


def verdict(plan_, target, outcome, summary: dict, written: Path | None) -> int:
    """The run's last lines and its exit code, read from the outcome and the summary as written
    (an interrupted run's is the caller's: the signal that stopped it is the engine's to name)."""
    from vmfuzz.harness.report.unchecked import cap_line, unchecked_line
    if cap_line(summary):
        print(cap_line(summary))
    _say_known(plan_, outcome)
    if outcome.failed:
        where = plan_.findings_dir if written == plan_.report_dir else "the repro paths above"
        groups = summary.get("groups", [])
        _say_groups(groups)
        new = [g for g in groups if not g.get("known") or plan_.fail_on_known]
        known = len(groups) - len(new)
        also = f", and {plural(known, 'known group')} (listed above)" if known else ""
        print(f"{paint(plural(len(new), 'finding group'), 'FAILED')} "
              f"({plural(sum(g['count'] for g in new), 'finding')}){also} "
              f"written under {where}; replay a group's repro with: vmfuzz replay FILE")
        return EXIT_FINDING
    if written != plan_.report_dir:
        # the reports are not where CI looks for them (stderr said where, if anywhere): not a pass
        print("vmfuzz: could not check: the reports could not be written to " + str(plan_.report_dir), file=sys.stderr)
        return EXIT_COULD_NOT_CHECK
    if _out_of_step(outcome):
        return EXIT_OUT_OF_STEP
    if _lines_unchecked(outcome):
        return EXIT_COULD_NOT_CHECK
    if outcome.deployment and any((outcome.deployment.get(p) or {}).get("ok") is False
                                  for p in ("routing", "allocation")):
        print(f"the deployment's routing or allocation fails (recorded in {written}/summary.json)")
        return EXIT_FINDING
    known_groups = [g for g in summary.get("groups", []) if g.get("known")]
    if known_groups:
        _say_groups(known_groups)
        print(f"no new finding group; {plural(len(known_groups), 'known group')} listed above "
              "(upstream's to fix; --fail-on-known fails on them)")
    # A property the clock stopped before it was checked (the pr cap, or a budget spent before
    # its search) is never "held", and a run that checked none is never "all 0 held".
    if unchecked_line(summary):
        print(paint(unchecked_line(summary), "could not check"))
        return EXIT_COULD_NOT_CHECK
    undriven = [r.prop for r in outcome.results if r.not_driven]
    if undriven and len(undriven) == len(outcome.results):
        # Nothing was judged: "0 properties held" is not a pass.
        print(f"vmfuzz: could not check: none of the {plural(len(undriven), 'selected property', 'selected properties')} "
              f"could be driven on {target.name} (" + "; ".join(f"{r.prop}: {r.not_driven}" for r in outcome.results)
              + ")", file=sys.stderr)
        return EXIT_COULD_NOT_CHECK
    if undriven:
        held = len(outcome.results) - len(undriven)
        print(f"{plural(held, 'property', 'properties')} {paint('held')}; "
              f"not driven on {target.name}: " + ", ".join(undriven))
    elif len(outcome.results) == 1:
        print(f"{outcome.results[0].prop} {paint('held')}")
    else:
        print(f"all {len(outcome.results)} properties {paint('held')}")
    return EXIT_OK
