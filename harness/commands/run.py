"""``vmfuzz run``: search every property for a counterexample, then report.

``execute_and_report`` is shared with ``gate``, which is a run under the pr
profile, taken only when the change touches mask code; both make their plan with
``vmfuzz.harness.commands.planning.plan``.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING

from vmfuzz.harness.commands.planning import plan
from vmfuzz.harness.commands.request import RunRequest
from vmfuzz.harness.report.terminal import classes_line, paint, plural

if TYPE_CHECKING:
    from vmfuzz.harness.engine.campaign.watch import GateWatch


def run(request: RunRequest) -> int:
    from vmfuzz.harness.commands.common import import_finding, load_failed
    from vmfuzz.harness.engine.core.failures import ImportRaised
    from vmfuzz.harness.model.errors import CannotLoad, OutOfStep
    from vmfuzz.harness.engine.core import line_trace
    # a run asked for a line record (scripts/covered_files.py) records what the import runs too
    line_trace.observe_imports_from_environment()
    try:
        plan_, target = plan(request)
    except ImportRaised as exc:  # the code under test does not load: that is the finding
        return import_finding(exc, request.command, request.target, request.report_dir)
    except (CannotLoad, OutOfStep) as exc:  # it cannot load here: could not check, with its reports
        return load_failed(exc, request.command, request.target, request.report_dir)
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
    if not res.findings and not res.unchecked:
        from vmfuzz.harness.properties import sub_checks_absent
        for name, why in sub_checks_absent(res.prop, res.classes).items():
            log(f"      sub-check {name}: no promise here, {why}")
    if res.classes:
        log("      " + classes_line(res.classes, verbose))
    if res.corpus:
        log(f"      deep boundary corpus: {plural(len(res.corpus), 'case')} first"
            + ("".join(f"\n        {c}" for c in res.corpus) if verbose else " (-v: each)"))
    for f in res.findings:
        log(f"      finding ({f.kind}): {f.detail}")
        log(f"      repro:   {f.path}")


def execute_and_report(plan_, target, gate: GateWatch | None = None, *, verbose: bool = False,
                       culprit=None) -> int:
    """``gate``: the gate's watch over its change, started before the search and stopped once its
    coverage is computed from what ran, for the reports. ``culprit(outcome)``: a gate's base asked about
    the cases vmfuzz fell out of step on, before the coverage and the verdict read them (its records)."""
    from vmfuzz.harness.engine.campaign.session import execute
    from vmfuzz.harness.engine.core import clock
    from vmfuzz.harness.report.progress import progress
    from vmfuzz.harness.report.summary import build_summary, write_summary
    from vmfuzz.harness.report.terminal import gate_line
    from vmfuzz.harness.report.verdict import say_written, verdict, write_reports_somewhere

    if gate is not None:
        clock.phase("while setting up the watch over the changed lines")
        gate.start()
    try:
        budget = f", budget {plan_.time_budget:g}s" if plan_.time_budget else ""
        # a searching profile's count is per round: it searches round after round until its budget is spent
        count = (f"rounds of {plural(plan_.max_examples, 'example')} per property until the budget is spent"
                 if plan_.profile.rounds and plan_.time_budget
                 else f"{plural(plan_.max_examples, 'example')} per property")
        print(f"vmfuzz {plan_.command}: target {target.name}, seed {plan_.seed}, profile {plan_.profile.name}, "
              f"{count}{budget}, {plural(plan_.workers, 'worker')}{', isolated' if plan_.isolate else ''}",
              flush=True)
        # made here, beside the lines it interleaves with, and handed down: the engine draws no screen of its own
        ui = progress(len(plan_.properties), f"{target.name} ({plan_.profile.name})", per_slot=plan_.max_examples,
                      budget=plan_.time_budget if plan_.profile.rounds else None)
        clock.phase("while searching")
        outcome = execute(plan_, target, partial(show_result, verbose=verbose), ui)
        from vmfuzz.harness.engine.search.deep_corpus import constants_of
        outcome.shape_constants = constants_of(target).source
        clock.phase("while the base ran the cases vmfuzz fell out of step on")
        asked = culprit(outcome) if culprit is not None and not outcome.interrupted else []
        if gate is not None:
            clock.phase("while measuring the changed lines")
            outcome.gate = gate.coverage(target, outcome)
            if asked:
                outcome.gate["out_of_step_on_base"] = asked
    finally:
        # the lines are measured: the reports need no more of them
        if gate is not None:
            gate.stop()
    if clock.running():
        # a gate's cap is the whole gate's: its time is the gate's wall, and what the cap stopped is said
        clock.settle()
        outcome.seconds = clock.elapsed()
        outcome.unfinished += [line for line in clock.cut_lines() if line not in outcome.unfinished]
    if gate is not None:
        print(gate_line(outcome.gate))
    # the verdict is decided here, once, before any report is written: every report and the exit code read it
    summary = build_summary(outcome, signal_code=_interrupted() if outcome.interrupted else None)
    summary, written = write_reports_somewhere(write_summary, summary, plan_.report_dir)
    say_written(outcome, written)
    return verdict(plan_, target, outcome, summary, written)


def _interrupted() -> int:
    """The signal's exit code, said on stderr."""
    from vmfuzz.harness.engine.core.signals import exit_code, name
    print(f"vmfuzz: interrupted by {name()} (findings written so far are kept, reports cover what ran)",
          file=sys.stderr)
    return exit_code()


