"""``vmfuzz minimize FILE``: shrink a failing repro or deployment file to a smallest failing case."""

from __future__ import annotations

import time
from pathlib import Path

from vmfuzz.harness.commands.common import check_device, claimed_report_dir, repro_target, resolve_target, write_command_report
from vmfuzz.harness.commands.request import MinimizeRequest
from vmfuzz.harness.model.errors import EXIT_FINDING, EXIT_OK, UsageError


def run(request: MinimizeRequest) -> int:
    from vmfuzz.harness.model.validate import LimitError, check_case
    from vmfuzz.harness.properties import PROPERTIES
    from vmfuzz.harness.report.summary import Check, CommandSummary

    check_device(request.device)
    if request.output and request.output.is_dir():
        raise UsageError(f"vmfuzz: -o {request.output} is a directory (give the repro file to write)")
    case, fault, target, order, keep = _load(request)
    # Default output under the report folder: minimizing a file in the repository
    # must not leave an untracked file beside it.
    report_dir = claimed_report_dir(request.report_dir)
    summary = CommandSummary("minimize", target.name, extra={"input": str(request.file)})
    t0 = time.monotonic()
    limited, tried = [], []
    for name in _applicable(request, order, case[0], target):
        try:
            check_case(case[0], case[1], name)
        except LimitError as exc:
            limited.append(f"{name}: {exc}")
            continue
        tried.append(name)
        out = _shrink(request, PROPERTIES[name], target, case, fault, summary, report_dir, keep)
        if out is not None:
            summary.seconds = time.monotonic() - t0
            write_command_report(summary, report_dir)
            return EXIT_FINDING
    if limited:
        # Not "fails nothing": some properties could not be tried at this size.
        raise UsageError(f"vmfuzz: {request.file}: " + limited[0])
    known = [c.name for c in summary.checks if c.status == "known"]
    if keep is not None:
        why = f"its recorded finding ({keep.label()}) does not reproduce"
    else:
        why = "it fails no property" + (" but known ones (listed above)" if known else "")
    print(f"vmfuzz minimize: {request.file} on {target.name}: {why}: nothing to minimize")
    # Only what was tried held; a property left out above was never checked.
    summary.checks += [Check(n, "held") for n in tried if n not in known]
    summary.headline = f"{why}: nothing to minimize"
    summary.seconds = time.monotonic() - t0
    write_command_report(summary, report_dir)
    return EXIT_OK


def _applicable(request, order: list[str], config, target) -> list[str]:
    """The properties of ``order`` this case is for and ``target`` can drive.

    A property named with ``--property`` that cannot judge this case is bad
    input: left out silently, the file would read as "fails nothing".
    """
    from vmfuzz.harness.properties import PROPERTIES
    names = []
    for name in order:
        prop = PROPERTIES[name]
        why = None if prop.applies(config) else "does not apply to this config"
        if why is None and prop.missing(target):
            why = f"cannot be driven on {target.name} (it has no {', '.join(prop.missing(target))})"
        if why is None:
            names.append(name)
        elif request.property:
            raise UsageError(f"vmfuzz minimize: {request.file}: property {name} {why}")
    if not names:
        raise UsageError(f"vmfuzz minimize: {request.file}: no property applies to this case on {target.name}")
    return names


def _load(request):
    """(case, fault, target, property names in the order tried) from a repro or deployment file."""
    from vmfuzz.harness.model.deployment_file import DeploymentError, is_deployment
    from vmfuzz.harness.model.deployment_file import loads as loads_deployment
    from vmfuzz.harness.engine.regression.replay import DEFAULT_TARGET, properties_for
    from vmfuzz.harness.engine.regression.shrink import DEPLOYMENT_ORDER
    from vmfuzz.harness.model.repro_file import decode, to_case
    from vmfuzz.harness.model.validate import LimitError, read_input
    try:
        data = read_input(request.file, "input file")  # read once: a pipe has no second reading
    except LimitError as exc:
        raise UsageError(f"vmfuzz: {exc}") from None
    if is_deployment(data):
        try:
            dep = loads_deployment(data, str(request.file))
            case = (dep.config(), [dep.observed()])
        except DeploymentError as exc:
            raise UsageError(f"vmfuzz: {exc}") from None
        target = resolve_target(request.target or DEFAULT_TARGET)
        return case, None, target, [request.property] if request.property else list(DEPLOYMENT_ORDER), None
    repro = decode(data, request.file)
    target = repro_target(request.target, repro.target, DEFAULT_TARGET)
    # a finding's repro keeps its origin: only that property, shrunk only while that cause fails
    keep = repro.origin if repro.origin is not None and not request.property else None
    names = [keep.property] if keep is not None else [p.name for p in properties_for(repro, request.property)]
    return to_case(repro), repro.fault, target, names, keep


def _shrink(request, prop, target, case, fault, summary, report_dir: Path, keep=None):
    """Shrinks ``case`` for ``prop`` if it fails it (with ``keep``'s cause, when given) with a new
    finding; the minimized repro's path, else None (a known finding is listed, not minimized)."""
    from vmfuzz.harness.engine.regression.known import shipped_known_name
    from vmfuzz.harness.engine.regression.shrink import checker, describe, minimize
    from vmfuzz.harness.model.origin import encode
    from vmfuzz.harness.model.repro_file import dump, from_case
    from vmfuzz.harness.report.summary import Check
    still_fails, close = checker(prop, target, request.device, fault, 30.0, keep=keep)
    try:
        first = still_fails(case)
        if first is None:
            return None
        known = shipped_known_name(target, first.origin)
        if known and not request.fail_on_known:
            print(f"known   {prop.name} on {target.name} fails with known finding {known} "
                  f"({first.origin.label()}): upstream's, not minimized")
            summary.checks.append(Check(prop.name, "known", f"known finding {known}: {str(first)}", "property",
                                        origin=encode(first.origin)))
            return None
        print(f"before: {describe(case)}")
        print(f"        fails {prop.name} on {target.name}", flush=True)
        small, detail, tries = minimize(case, still_fails)
    finally:
        close()
    from vmfuzz.harness.model.validate import server_problem
    print(f"after:  {describe(small)}")
    unserved = server_problem(small[0])
    if unserved:  # the input itself was outside what a server runs: said, not hidden
        print(f"        note: no server runs this config ({unserved})")
    print(f"        still fails {prop.name} ({tries} candidates tried): {detail}")
    out = request.output or report_dir / f"{request.file.stem}.min.json"
    origin, detail = detail.origin, str(detail)
    out = dump(from_case(target.name, prop.name, small[0], small[1], detail=detail, fault=fault,
                         origin=origin), out)
    print(f"wrote {out}")
    print(f"        kept its origin: {origin.label()}")
    summary.checks.append(Check(prop.name, "failed", detail, fault or "property", str(out),
                                origin=encode(origin)))
    summary.headline = f"minimized to: {describe(small)}"
    summary.extra.update(before=describe(case), after=describe(small), tries=tries, output=str(out),
                         server_valid=unserved is None)
    return out
