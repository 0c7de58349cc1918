"""``vmfuzz replay FILE``: re-run a repro's property (or every one that applies) on a target."""

from __future__ import annotations

import sys
import time

from harness.commands.common import (check_device, check_timeout, isolated, repro_target, report_dir_of,
                                     write_command_report)
from harness.model.errors import EXIT_FINDING, EXIT_OK, EXIT_OUT_OF_STEP, OutOfStep, UsageError, out_of_step_line
from harness.report.terminal import status_word


def run(args) -> int:
    from harness.engine.replay import DEFAULT_TARGET, properties_for
    from harness.model.repro_file import load
    from harness.report.summary import CommandSummary

    check_timeout(args.example_timeout)
    repro = load(args.file)
    props = properties_for(repro, args.property)
    check_device(args.device)
    target = repro_target(args.target, repro.target, DEFAULT_TARGET)
    isolate = isolated(args.isolate, target.name)
    summary = CommandSummary("replay", target.name, extra={"repro": args.file})
    t0 = time.monotonic()
    for prop in props:
        t = time.monotonic()
        check = _check(args, repro, target, prop, isolate)
        check.seconds = time.monotonic() - t
        summary.checks.append(check)
        print(f"{status_word(check.status)} {check.name} on {target.name}"
              f"{f': {check.detail}' if check.detail else ''}", flush=True)
    summary.seconds = time.monotonic() - t0
    write_command_report(summary, report_dir_of(args))
    if summary.failed:
        return EXIT_FINDING
    stuck = [c for c in summary.checks if c.kind == "out-of-step"]
    if stuck:
        print(out_of_step_line(stuck[0].detail), file=sys.stderr)
        return EXIT_OUT_OF_STEP
    if not any(c.status == "held" for c in summary.checks):
        # Nothing was checked: exit 0 would read as "held".
        raise UsageError(f"vmfuzz replay: {args.file}: no property could be replayed on {target.name} "
                         f"({summary.checks[0].detail if summary.checks else 'none applies'})")
    return EXIT_OK


def _check(args, repro, target, prop, isolate: bool):
    from harness.engine.isolation import TargetFault, target_raised
    from harness.engine.replay import replay
    from harness.engine.signals import from_user
    from harness.model.repro_file import ReproError
    from harness.properties import PropertyFailure
    from harness.report.summary import Check
    try:
        replay(repro, target, args.device, isolate=isolate, timeout=args.example_timeout, prop=prop.name)
    except PropertyFailure as exc:
        return Check(prop.name, "failed", exc.detail, "property", args.file)
    except TargetFault as exc:
        return Check(prop.name, "failed", str(exc), exc.kind, args.file)
    except OutOfStep as exc:  # vmfuzz's seam no longer fits the code: could not check, not a finding
        return Check(prop.name, "error", str(exc), "out-of-step")
    except ReproError as exc:  # the target cannot drive this property
        return Check(prop.name, "skipped", str(exc))
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - the target's own error
        if isinstance(exc, KeyboardInterrupt) and from_user(exc):
            raise  # a real Ctrl-C: exit 130, not a finding
        return Check(prop.name, "failed", target_raised(exc), "target-raised", args.file)
    return Check(prop.name, "held")
