"""The bodies of the commands whose output is a ``command_report`` (replay, verify-policy,
exhaustive, bisect), and the small pieces of terminal output they share with ``cli``.

``cli`` keeps the argument parsing and one line per command that calls in here.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from harness.errors import EXIT_FINDING, EXIT_OK, UsageError
from harness.repro_file import ReproError


def classes_line(classes: dict[str, int], verbose: bool = False) -> str:
    """Which boundary classes a property's examples reached: a short summary, or every one with -v."""
    if verbose:
        return "classes: " + ", ".join(f"{k} ({v})" for k, v in sorted(classes.items()))
    from harness.terminal import plural
    path = ", ".join(f"{k.removeprefix('path ')} {classes[k]}" for k in ("path reuse", "path fallback")
                     if k in classes)
    layouts = sorted(k.removeprefix("layout ") for k in classes if k.startswith("layout "))
    parts = [plural(len(classes), "class", "classes") + " reached"]
    if path:
        parts.append(path)
    if layouts:
        parts.append("/".join(layouts))
    return "classes: " + "; ".join(parts) + " (-v: every class)"


def quiet_dependency_warnings() -> None:
    """The target's import chain warns about its own dependencies (requests about
    chardet, urllib3 versions): noise in a gate's log, never a finding."""
    import warnings
    for message in (r"Unable to find acceptable character detection dependency",
                    r"urllib3 \(.*\) or chardet \(.*\)/charset_normalizer \(.*\) doesn't match"):
        warnings.filterwarnings("ignore", message=message)
    # Spawned workers (isolation, --workers) import the target afresh: same filter.
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"),
                                                          "ignore:Unable to find acceptable character detection"]))


def replay_command(args) -> int:
    from harness.command_report import Check, CommandSummary
    from harness.isolation import TargetFault
    from harness.properties import PropertyFailure
    from harness.replay import DEFAULT_TARGET, properties_for, replay
    from harness.repro_file import load

    from harness.cli import _check_device, _isolate, _resolve_target
    from harness.edges import check_timeout
    check_timeout(args.example_timeout)
    repro = load(args.file)
    props = properties_for(repro, args.property)
    _check_device(args.device)
    target = _resolve_target(args.target or repro.target or DEFAULT_TARGET)
    isolate = _isolate(args.isolate, target.name)
    summary = CommandSummary("replay", target.name, extra={"repro": args.file})
    t0 = time.monotonic()
    for prop in props:
        t = time.monotonic()
        try:
            replay(repro, target, args.device, isolate=isolate, timeout=args.example_timeout, prop=prop.name)
        except PropertyFailure as exc:
            check = Check(prop.name, "failed", exc.detail, "property", args.file)
        except TargetFault as exc:
            check = Check(prop.name, "failed", str(exc), exc.kind, args.file)
        except ReproError as exc:  # the target cannot drive this property
            check = Check(prop.name, "skipped", str(exc))
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - the target's own error
            from harness.edges import target_raised
            from harness.signals import from_user
            if isinstance(exc, KeyboardInterrupt) and from_user(exc):
                raise  # a real Ctrl-C: exit 130, not a finding
            check = Check(prop.name, "failed", target_raised(exc), "target-raised", args.file)
        else:
            check = Check(prop.name, "held")
        check.seconds = time.monotonic() - t
        summary.checks.append(check)
        _say_verdict(check, target.name)
    summary.seconds = time.monotonic() - t0
    write_command_report(summary, args)
    if summary.failed:
        return EXIT_FINDING
    if not any(c.status == "held" for c in summary.checks):
        # Nothing was checked: exit 0 would read as "held".
        raise UsageError(f"vmfuzz replay: {args.file}: no property could be replayed on {target.name} "
                         f"({summary.checks[0].detail if summary.checks else 'none applies'})")
    return EXIT_OK


def _say_verdict(check, target_name: str) -> None:
    from harness.terminal import status_word
    tail = f": {check.detail}" if check.detail else ""
    print(f"{status_word(check.status)} {check.name} on {target_name}{tail}", flush=True)


def write_command_report(summary, args) -> Path:
    from harness.command_report import write
    from harness.session import default_report_dir
    report_dir = Path(getattr(args, "report_dir", None) or default_report_dir())
    write(summary, report_dir)
    print(f"reports: {report_dir}/ (summary.json, summary.md, junit.xml)")
    return report_dir


def verify_policy_command(args) -> int:
    from harness.command_report import Check, CommandSummary
    from harness.cli import _findings_dir, _resolve_target
    from harness.policy import verify_policy
    target = _resolve_target(args.target)
    report = verify_policy(target, findings_dir=_findings_dir(args))
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
    write_command_report(summary, args)
    return EXIT_OK if report.ok else EXIT_FINDING


def exhaustive_command(args) -> int:
    from harness.cli import _findings_dir, _resolve_target
    from harness.edges import check_workers
    from harness.exhaustive import run_exhaustive
    check_workers(args.workers)
    target = _resolve_target(args.target)
    report = run_exhaustive(target, findings_dir=_findings_dir(args), workers=args.workers,
                            echo=lambda s: print(s, flush=True))
    from harness.command_report import Check, CommandSummary
    summary = CommandSummary("exhaustive", target.name, seconds=report.seconds)
    for t in report.tallies:
        scope = f"{t.configs} configs, {t.batches} batches"
        summary.checks.append(Check(t.prop, "held", scope, seconds=t.seconds) if t.failure is None else
                              Check(t.prop, "failed", t.failure, "property", str(t.path) if t.path else None,
                                    t.seconds))
    write_command_report(summary, args)
    return EXIT_OK if report.ok else EXIT_FINDING


def bisect_command(args) -> int:
    from harness.bisect import BisectError, bisect
    from harness.command_report import Check, CommandSummary

    if args.timeout <= 0:
        raise UsageError("vmfuzz: --timeout must be positive")
    print(f"vmfuzz bisect: {args.repro} on {args.target}, good {args.good}, bad {args.bad}, in {args.repo}",
          flush=True)
    try:
        res = bisect(args.repro, args.repo, args.good, args.bad, target=args.target, prop=args.property,
                     timeout=args.timeout, echo=lambda s: print(s, flush=True))
    except BisectError as exc:
        raise UsageError(f"vmfuzz bisect: {exc}") from None
    summary = CommandSummary("bisect", args.target, seconds=res.seconds,
                             extra={"repro": args.repro, "repo": args.repo, "first_bad": res.first_bad,
                                    "subject": res.subject, "finding": res.detail, "property": res.property,
                                    "candidates": res.candidates})
    status = {"good": "held", "bad": "failed", "skip": "skipped"}
    for t in res.tested:
        summary.checks.append(Check(f"{t.commit[:12]} {t.subject}", status[t.verdict], t.detail,
                                    "property" if t.verdict == "bad" else "", None))
    if res.first_bad:
        summary.headline = f"first bad commit: {res.first_bad[:12]} {res.subject}"
        print(f"first bad commit: {res.first_bad} {res.subject}")
    else:
        summary.headline = f"first bad commit is one of {len(res.candidates)} (others untestable)"
        print("first bad commit is one of (skipped commits in between could not be tested):")
        for sha in res.candidates:
            print(f"  {sha}")
    if res.detail:
        print(f"  finding ({res.property or 'property'}): {res.detail}")
    write_command_report(summary, args)
    return EXIT_FINDING
