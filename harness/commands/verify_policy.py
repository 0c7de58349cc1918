"""``vmfuzz verify-policy``: capacity soundness and liveness over a production-scale grid, by arithmetic."""

from __future__ import annotations

from vmfuzz.harness.commands.common import claimed_report_dir, findings_dir, resolve_target, write_command_report
from vmfuzz.harness.commands.request import EnumerateRequest
from vmfuzz.harness.model.errors import EXIT_FINDING, EXIT_OK


def run(request: EnumerateRequest) -> int:
    from vmfuzz.harness.engine.search.policy import verify_policy
    from vmfuzz.harness.report.summary import Check, CommandSummary
    target = resolve_target(request.target)
    report_dir = claimed_report_dir(request.report_dir)
    report = verify_policy(target, findings_dir=findings_dir(report_dir))
    print(f"vmfuzz verify-policy: target {target.name}: {report.configs:,} configurations, "
          f"{report.checks:,} batch sizes checked in {report.seconds:.1f}s")
    summary = CommandSummary("verify-policy", target.name, seconds=report.seconds,
                             extra={"configurations": report.configs, "batch_sizes": report.checks,
                                    "violations": report.violations})
    for name in ("capacity-soundness", "capacity-liveness"):
        v = report.first.get(name)
        summary.checks.append(Check(name, "held") if v is None else
                              Check(name, "failed", f"{report.violations[name]} violation(s); first: {v.detail}",
                                    "property", str(v.path) if v.path else None))
    for v in report.first.values():
        print(f"  {v.prop}: {report.violations[v.prop]} violation(s); first: {v.detail}")
        print(f"      repro: {v.path}")
    if report.ok:
        print("capacity-soundness and capacity-liveness held")
    write_command_report(summary, report_dir)
    return EXIT_OK if report.ok else EXIT_FINDING
