"""``vmfuzz run``: search every property for a counterexample, then report.

``execute_and_report`` is shared with ``gate``, which is a run under the pr
profile, taken only when the change touches mask code; both make their plan with
``vmfuzz.harness.commands.planning.plan``.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

from vmfuzz.harness.commands.common import write_reports_somewhere
from vmfuzz.harness.commands.planning import plan
from vmfuzz.harness.commands.request import RunRequest
from vmfuzz.harness.model.errors import (EXIT_COULD_NOT_CHECK, EXIT_FINDING, EXIT_OK, EXIT_OUT_OF_STEP,
                                  UsageError, out_of_step_line)
from vmfuzz.harness.report.terminal import classes_line, paint, plural


def run(request: RunRequest) -> int:
    from vmfuzz.harness.commands.common import import_finding
    from vmfuzz.harness.engine.core.failures import ImportRaised
    try:
        plan_, target = plan(request)
    except ImportRaised as exc:  # the code under test does not load: that is the finding
        return import_finding(exc, request.command, request.target, request.report_dir)
    return execute_and_report(plan_, target, verbose=request.verbose)


def show_result(res, log, *, verbose: bool = False) -> None:
    """One property's lines, printed as it finishes."""
    if res.out_of_step and not res.findings:
        log(f"  {res.prop:<22} {paint('out of step')}: {res.out_of_step} (could not check; not a finding)")
        return
    if res.not_driven and not res.findings:
        log(f"  {res.prop:<22} {paint('not driven')}: {res.not_driven}")
        return
    from vmfuzz.harness.properties import sub_checks_not_driven
    gaps = sub_checks_not_driven(res.prop, res.classes) if not res.findings and not res.unchecked else {}
    status = "FAILED" if res.findings else ("could not check" if res.unchecked else
                                            "held in part" if gaps else "held")
    # cut short: how far it got of the count a full search runs
    count = plural(res.examples, 'example')
    if res.unchecked:
        count = f"{res.examples:,}/{res.planned:,} examples" if res.planned else "not started"
    log(f"  {res.prop:<22} {paint(status, width=7)} {count:>14} {res.seconds:6.1f}s")
    for name, why in gaps.items():
        log(f"      sub-check {name}: {why}")
    if res.classes:
        log("      " + classes_line(res.classes, verbose))
    if res.corpus:
        log(f"      deep boundary corpus: {plural(len(res.corpus), 'case')} first"
            + ("".join(f"\n        {c}" for c in res.corpus) if verbose else " (-v: each)"))
    for f in res.findings:
        log(f"      finding ({f.kind}): {f.detail}")
        log(f"      repro:   {f.path}")


def execute_and_report(plan_, target, gate=None, *, verbose: bool = False) -> int:
    """``gate(outcome) -> dict``: the gate's coverage, computed from what ran, for the reports."""
    from vmfuzz.harness.engine.campaign.session import execute
    from vmfuzz.harness.report.progress import progress
    from vmfuzz.harness.report.summary import write_reports
    from vmfuzz.harness.report.terminal import gate_line

    budget = f", budget {plan_.time_budget:g}s" if plan_.time_budget else ""
    # a searching profile's count is per round: it searches round after round until its budget is spent
    count = (f"rounds of {plural(plan_.max_examples, 'example')} per property until the budget is spent"
             if plan_.profile.rounds and plan_.time_budget else f"{plural(plan_.max_examples, 'example')} per property")
    print(f"vmfuzz {plan_.command}: target {target.name}, seed {plan_.seed}, profile {plan_.profile.name}, "
          f"{count}{budget}, {plural(plan_.workers, 'worker')}{', isolated' if plan_.isolate else ''}", flush=True)
    # made here, beside the lines it interleaves with, and handed down: the engine draws no screen of its own
    ui = progress(len(plan_.properties), f"{target.name} ({plan_.profile.name})", per_slot=plan_.max_examples,
                  budget=plan_.time_budget if plan_.profile.rounds else None)
    outcome = execute(plan_, target, partial(show_result, verbose=verbose), ui)
    from vmfuzz.harness.engine.search.deep_corpus import constants_of
    outcome.shape_constants = constants_of(target).source
    if gate is not None:
        outcome.gate = gate(outcome)
        print(gate_line(outcome.gate))
    summary, written = write_reports_somewhere(write_reports, outcome, plan_.report_dir)
    if outcome.deployment:
        _say_deployment(outcome.deployment)
    print(f"reports: {written}/ (summary.json, summary.md, junit.xml, report.html)" if written
          else "reports: none written (see above)")
    return _verdict(plan_, target, outcome, summary, written)


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
    from vmfuzz.harness.engine.regression.known import DIFFERENT, GONE, REPRODUCES
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


def _verdict(plan_, target, outcome, summary: dict, written: Path) -> int:
    if outcome.interrupted:
        from vmfuzz.harness.engine.core.signals import exit_code, name
        print(f"vmfuzz: interrupted by {name()} (findings written so far are kept, reports cover what ran)",
              file=sys.stderr)
        return exit_code()
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
