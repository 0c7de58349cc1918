"""``vmfuzz replay FILE``: re-run a repro's property (or every one that applies) on a target.

FILE may also be a deployment file: its observed batch is replayed with its config."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from vmfuzz.harness.commands.common import check_device, isolated, repro_target, write_command_report
from vmfuzz.harness.commands.request import ReplayRequest
from vmfuzz.harness.model.errors import EXIT_FINDING, EXIT_OK, EXIT_OUT_OF_STEP, OutOfStep, UsageError, out_of_step_line
from vmfuzz.harness.report.terminal import status_word


def run(request: ReplayRequest) -> int:
    from vmfuzz.harness.engine.regression.replay import DEFAULT_TARGET
    from vmfuzz.harness.report.summary import CommandSummary

    repro, props = _load(request.file, request.property)
    check_device(request.device)
    target = repro_target(request.target, repro.target, DEFAULT_TARGET)
    isolate = isolated(request.isolate, target.name)
    summary = CommandSummary("replay", target.name, extra={"repro": str(request.file)})
    t0 = time.monotonic()
    for prop in props:
        t = time.monotonic()
        check = _check(request, repro, target, prop, isolate)
        check.seconds = time.monotonic() - t
        summary.checks.append(check)
        print(f"{status_word(check.status)} {check.name} on {target.name}"
              f"{f': {check.detail}' if check.detail else ''}", flush=True)
    summary.seconds = time.monotonic() - t0
    write_command_report(summary, request.report_dir)
    if summary.failed:
        return EXIT_FINDING
    stuck = [c for c in summary.checks if c.kind == "out-of-step"]
    if stuck:
        print(out_of_step_line(stuck[0].detail), file=sys.stderr)
        return EXIT_OUT_OF_STEP
    if not any(c.status in ("held", "known") for c in summary.checks):
        # Nothing was checked: exit 0 would read as "held".
        raise UsageError(f"vmfuzz replay: {request.file}: no property could be replayed on {target.name} "
                         f"({summary.checks[0].detail if summary.checks else 'none applies'})")
    return EXIT_OK


def _load(file: Path, prop: str | None):
    """The repro to replay and its properties, from a repro file or a deployment file."""
    from vmfuzz.harness.engine.regression.replay import properties_for
    from vmfuzz.harness.engine.regression.shrink import DEPLOYMENT_ORDER
    from vmfuzz.harness.model.deployment_file import DeploymentError, is_deployment
    from vmfuzz.harness.model.deployment_file import loads as loads_deployment
    from vmfuzz.harness.model.repro_file import ReproError, decode, from_case, to_case
    from vmfuzz.harness.model.validate import LimitError, read_input
    from vmfuzz.harness.properties import PROPERTIES
    try:
        data = read_input(file, "repro file")  # read once: a pipe has no second reading
    except LimitError as exc:
        raise ReproError(str(exc)) from None
    if not is_deployment(data):
        repro = decode(data, file)
        return repro, properties_for(repro, prop)
    try:
        dep = loads_deployment(data, str(file))
        # no target and no property: the command line's, else the deployment's properties below
        repro = from_case("", "", dep.config(), [dep.observed()])
    except DeploymentError as exc:
        raise UsageError(f"vmfuzz: {exc}") from None
    if prop:
        return repro, properties_for(repro, prop)
    config, _ = to_case(repro)  # the limits of a replayed case, as a repro file's
    return repro, [PROPERTIES[n] for n in DEPLOYMENT_ORDER if PROPERTIES[n].applies(config)]


def _check(request, repro, target, prop, isolate: bool):
    from vmfuzz.harness.engine.core.failures import failure_of
    from vmfuzz.harness.engine.regression.known import shipped_known_name
    from vmfuzz.harness.engine.core.isolation import TargetFault
    from vmfuzz.harness.engine.regression.replay import replay
    from vmfuzz.harness.engine.core.signals import from_user
    from vmfuzz.harness.model.origin import encode
    from vmfuzz.harness.model.repro_file import ReproError
    from vmfuzz.harness.properties import PropertyFailure
    from vmfuzz.harness.report.summary import Check
    try:
        replay(repro, target, request.device, isolate=isolate, timeout=request.example_timeout, prop=prop.name)
    except OutOfStep as exc:  # vmfuzz's seam no longer fits the code: could not check, not a finding
        return Check(prop.name, "error", str(exc), "out-of-step")
    except ReproError as exc:  # the target cannot drive this property
        return Check(prop.name, "skipped", str(exc))
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - a failure, or the target's error
        if isinstance(exc, KeyboardInterrupt) and from_user(exc):
            raise  # a real Ctrl-C: exit 130, not a finding
        origin, detail = failure_of(prop.name, exc)
        kind = ("property" if isinstance(exc, PropertyFailure) else
                exc.kind if isinstance(exc, TargetFault) else "target-raised")
        if repro.origin is not None and repro.origin.cause() != origin.cause():
            detail = f"fails differently from its recorded origin ({repro.origin.label()}): {detail}"
        known = shipped_known_name(target, origin)
        status = "known" if known and not request.fail_on_known else "failed"
        if known:
            detail = f"known finding {known}: {detail}"
        return Check(prop.name, status, detail, kind, str(request.file), origin=encode(origin))
    return Check(prop.name, "held")
