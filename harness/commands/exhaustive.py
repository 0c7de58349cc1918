"""``vmfuzz exhaustive``: every configuration within small bounds, every property."""

from __future__ import annotations

import sys

from vmfuzz.harness.commands.common import (claimed_report_dir, findings_dir, resolve_target,
                                     write_command_report)
from vmfuzz.harness.commands.request import EnumerateRequest
from vmfuzz.harness.model.errors import EXIT_FINDING, EXIT_OK


def run(request: EnumerateRequest) -> int:
    from vmfuzz.harness.engine.search.exhaustive import run_exhaustive
    from vmfuzz.harness.report.summary import Check, CommandSummary
    target = resolve_target(request.target)
    report_dir = claimed_report_dir(request.report_dir)
    report = run_exhaustive(target, findings_dir=findings_dir(report_dir), workers=request.workers,
                            echo=lambda s: print(s, flush=True))
    summary = CommandSummary("exhaustive", target.name, seconds=report.seconds,
                             extra={"interrupted": report.interrupted})
    for t in report.tallies:
        scope = f"{t.configs} configs, {t.batches} batches"
        if t.not_driven:
            summary.checks.append(Check(t.prop, "skipped", f"not driven: {t.not_driven}"))
            continue
        summary.checks.append(Check(t.prop, "held", scope, seconds=t.seconds) if t.failure is None else
                              Check(t.prop, "failed", t.failure, "property", str(t.path) if t.path else None,
                                    t.seconds))
    if report.interrupted:
        from vmfuzz.harness.properties import PROPERTIES
        finished = {t.prop for t in report.tallies}
        summary.checks += [Check(p, "skipped", "interrupted before it finished") for p in PROPERTIES
                           if p not in finished]
        summary.headline = f"interrupted: {len(finished)} of {len(PROPERTIES)} properties checked"
    write_command_report(summary, report_dir)
    if report.interrupted:
        from vmfuzz.harness.engine.core.signals import exit_code
        print("vmfuzz: interrupted (reports cover the properties that finished)", file=sys.stderr)
        return exit_code()
    return EXIT_OK if report.ok else EXIT_FINDING
