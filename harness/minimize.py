"""Shrinks one externally supplied failing case until no single simplification keeps it failing.

Hypothesis shrinks what it generated; a case from production (a deployment
description, a repro file from a bug report) was not generated, so it is
shrunk here, greedily: try each one-step simplification, take the first that
still fails the same way, start over; stop when none does. Every candidate is
re-validated, so the result is always a case a server could have produced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

from harness.config import Batch, Config, ConfigError
from harness.properties import PROPERTIES, PropertyFailure

Case = tuple[Config, list[Batch]]

#: For a deployment: the first of these the observed batch fails is the one kept failing.
DEPLOYMENT_ORDER = ("no-oob-write", "capacity-soundness", "fallback-equivalence", "reference-agreement",
                    "capacity-liveness", "multi-step-reuse")


def _lower(v: int, floor: int) -> list[int]:
    """Smaller values to try, boldest first."""
    return [x for x in dict.fromkeys((floor, v // 2, v - 1)) if floor <= x < v]


def _valid(config: Config, steps: list[Batch]) -> Case | None:
    try:
        config.validate()
        return config, [b.validate(config) for b in steps]
    except ConfigError:
        return None


def _with(config: Config, **kw) -> Config:
    fields = {f: getattr(config, f) for f in config.__struct_fields__}
    return Config(**{**fields, **kw})


def _drop_requests(b: Batch) -> Iterator[Batch]:
    """Halves, quarters, ... then single requests: 48 requests shrink in a few dozen tries."""
    n = b.bs
    size = n // 2
    while size >= 1:
        for start in range(0, n, size):
            keep = [i for i in range(n) if not start <= i < start + size]
            if keep:
                yield Batch(tuple(b.seq_lens[i] for i in keep),
                            None if b.trees is None else tuple(b.trees[i] for i in keep))
        size //= 2


def candidates(case: Case) -> Iterator[Case]:
    config, steps = case
    if len(steps) > 1:
        for i in range(len(steps)):
            yield config, steps[:i] + steps[i + 1:]
    for i, b in enumerate(steps):
        for smaller in _drop_requests(b):
            yield config, steps[:i] + [smaller] + steps[i + 1:]
    for m in _lower(config.max_bs, 1):
        yield _with(config, max_bs=m), steps
    longest = max(max(b.seq_lens) for b in steps)
    for c in dict.fromkeys([longest] + _lower(config.max_context_len, 0)):
        if c < config.max_context_len:
            yield _with(config, max_context_len=c), [
                Batch(tuple(min(s, c) for s in b.seq_lens), b.trees) for b in steps]
    for i, b in enumerate(steps):
        if any(b.seq_lens):
            yield config, steps[:i] + [Batch((0,) * b.bs, b.trees)] + steps[i + 1:]
        for j, s in enumerate(b.seq_lens):
            for t in _lower(s, 0):
                lens = b.seq_lens[:j] + (t,) + b.seq_lens[j + 1:]
                yield config, steps[:i] + [Batch(lens, b.trees)] + steps[i + 1:]
    for i, b in enumerate(steps):
        if b.trees is not None:
            yield config, steps[:i] + [Batch(b.seq_lens)] + steps[i + 1:]
    if not config.trivial:
        simple = [Batch(b.seq_lens) for b in steps]  # a new tree shape: simplest trees
        for d in _lower(config.d, 2):
            yield _with(config, num_draft_tokens=d), simple
        for k in _lower(config.topk, 1):
            yield _with(config, topk=k), simple
        for s in _lower(config.spec_steps, 1):
            yield _with(config, spec_steps=s), simple


def minimize(case: Case, still_fails: Callable[[Case], str | None], *, on_step=lambda case, detail: None
             ) -> tuple[Case, str, int]:
    """Greedy fixpoint. ``still_fails(case)`` is the failure detail, or None. Returns (case, detail, tries)."""
    detail = still_fails(case)
    if detail is None:
        raise ValueError("the case does not fail to begin with")
    tries = 0
    improved = True
    while improved:
        improved = False
        for cand in candidates(case):
            cand = _valid(*cand)
            if cand is None:
                continue
            tries += 1
            d = still_fails(cand)
            if d is not None:
                case, detail, improved = cand, d, True
                on_step(case, detail)
                break
    return case, detail, tries


def describe(case: Case) -> str:
    config, steps = case
    c = config
    head = (f"{c.mode.name}{'' if c.is_read else ' (unread)'} max_bs {c.max_bs}, context {c.max_context_len}, "
            f"d {c.d}, topk {c.topk}, steps {c.spec_steps}")
    def lens(b: Batch) -> str:
        s = list(b.seq_lens)
        shown = s if len(s) <= 8 else s[:4] + ["..."] + s[-2:]
        return f"bs {b.bs} seq_lens [{', '.join(map(str, shown))}]" + ("" if b.trees is None else " (custom trees)")
    return head + "; " + "; ".join(f"step {i}: {lens(b)}" for i, b in enumerate(steps))


def _checker(prop, target, device: str, fault: str | None, timeout: float):
    if fault is None:
        def still_fails(case: Case) -> str | None:
            try:
                prop.check(target, case[0], case[1], device)
            except PropertyFailure as exc:
                return exc.detail if exc.prop == prop.name else None
            except KeyboardInterrupt as exc:
                from harness.signals import from_user
                if from_user(exc):
                    raise
                return "target raised KeyboardInterrupt"
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - a target that raises fails too
                from harness.edges import target_raised
                return target_raised(exc)
            return None
        return still_fails, lambda: None
    from harness.isolation import IsolatedChecker, TargetFault
    iso = IsolatedChecker(target, timeout)

    def still_fails_isolated(case: Case) -> str | None:
        try:
            iso(prop, case[0], case[1], device)
        except TargetFault as exc:
            return exc.detail if exc.kind == fault else None
        except Exception:  # noqa: BLE001 - a different failure is not the one being kept
            return None
        return None
    return still_fails_isolated, iso.close


def minimize_file(args) -> int:
    from harness.cli import _check_device, _resolve_target
    from harness.commands import write_command_report as _write_command_report
    from harness.command_report import Check, CommandSummary
    from harness.errors import EXIT_FINDING, EXIT_OK, UsageError
    from harness.deployment import DeploymentError, is_deployment
    from harness.deployment import loads as loads_deployment
    from harness.replay import DEFAULT_TARGET, properties_for
    from harness.repro_file import decode, dump, from_case, to_case
    from harness.session import default_report_dir
    from harness.validate import LimitError, check_case, read_input
    import time

    _check_device(args.device)
    if args.property and args.property not in PROPERTIES:
        raise UsageError(f"vmfuzz: unknown property {args.property!r} (known: {', '.join(PROPERTIES)})")
    if args.output and Path(args.output).is_dir():
        raise UsageError(f"vmfuzz: -o {args.output} is a directory (give the repro file to write)")
    try:
        data = read_input(args.file, "input file")  # read once: a pipe has no second reading
    except LimitError as exc:
        raise UsageError(f"vmfuzz: {exc}") from None
    fault = None
    limited = []
    if is_deployment(data):
        try:
            dep = loads_deployment(data, args.file)
            case = (dep.config(), [dep.observed()])
        except DeploymentError as exc:
            raise UsageError(f"vmfuzz: {exc}") from None
        target = _resolve_target(args.target or DEFAULT_TARGET)
        order = [args.property] if args.property else list(DEPLOYMENT_ORDER)
    else:
        repro = decode(data, args.file)
        case = to_case(repro)
        fault = repro.fault
        target = _resolve_target(args.target or repro.target or DEFAULT_TARGET)
        order = [p.name for p in properties_for(repro, args.property)]
    # Default output under the report folder: minimizing a file in the repository
    # must not leave an untracked file beside it.
    report_dir = Path(args.report_dir or default_report_dir())
    args.report_dir = str(report_dir)
    summary = CommandSummary("minimize", target.name, extra={"input": args.file})
    t0 = time.monotonic()
    for name in order:
        prop = PROPERTIES[name]
        if prop.trivial != case[0].trivial:
            continue
        try:
            check_case(case[0], case[1], name)
        except LimitError as exc:
            limited.append(f"{name}: {exc}")
            continue
        still_fails, close = _checker(prop, target, args.device, fault, 30.0)
        try:
            if still_fails(case) is None:
                continue
            print(f"before: {describe(case)}")
            print(f"        fails {name} on {target.name}", flush=True)
            small, detail, tries = minimize(case, still_fails)
        finally:
            close()
        print(f"after:  {describe(small)}")
        print(f"        still fails {name} ({tries} candidates tried): {detail}")
        out = Path(args.output) if args.output else report_dir / f"{Path(args.file).stem}.min.json"
        out = dump(from_case(target.name, name, small[0], small[1], detail=detail, fault=fault), out)
        print(f"wrote {out}")
        summary.checks.append(Check(name, "failed", detail, fault or "property", str(out)))
        summary.headline = f"minimized to: {describe(small)}"
        summary.extra.update(before=describe(case), after=describe(small), tries=tries, output=str(out))
        summary.seconds = time.monotonic() - t0
        _write_command_report(summary, args)
        return EXIT_FINDING
    if limited:
        # Not "fails nothing": some properties could not be tried at this size.
        raise UsageError(f"vmfuzz: {args.file}: " + limited[0])
    print(f"vmfuzz minimize: {args.file} fails no property on {target.name}: nothing to minimize")
    summary.checks += [Check(n, "held") for n in order if PROPERTIES[n].trivial == case[0].trivial]
    summary.headline = "fails no property: nothing to minimize"
    summary.seconds = time.monotonic() - t0
    _write_command_report(summary, args)
    return EXIT_OK
