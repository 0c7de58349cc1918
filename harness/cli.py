"""``vmfuzz``: the command line (exit 0: all held; 1: a finding, on disk; 2: bad input)."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from harness.errors import EXIT_FINDING, EXIT_OK, EXIT_USAGE, UsageError  # noqa: F401 - re-exported
from harness.profiles import DEFAULT_DB_DIR, PROFILES


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise UsageError(f"{self.prog}: {message}")


def _common_run_args(p) -> None:
    p.add_argument("--workers", type=int, default=1, help="processes to spread the properties over")
    p.add_argument("--report-dir", default=None, help="default: reports/<UTC timestamp>/")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--db", default=DEFAULT_DB_DIR, metavar="DIR",
                   help=f"example database and last run's failures (pr reads it, nightly writes it; "
                        f"default {DEFAULT_DB_DIR})")
    p.add_argument("--isolate", choices=["auto", "on", "off"], default="auto",
                   help="run each example in a watched worker (auto: on for sglang and plug-in targets)")
    p.add_argument("--example-timeout", type=float, default=None, metavar="S",
                   help="seconds one example may take under isolation before it is a target-hang "
                        "(default 30, or the target's own for the profile)")
    p.add_argument("--repro-root", default="repro", help=argparse.SUPPRESS)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vmfuzz", description="Property-based harness for SGLang's target-verify tree mask.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="search every property for a counterexample")
    run.add_argument("--target", default="reference")
    run.add_argument("--seed", type=int, default=None, help="makes the run reproducible (default: random, printed)")
    run.add_argument("--max-examples", type=int, default=None, help="examples per property (per round)")
    run.add_argument("--time-budget", type=float, default=None, help="seconds for the whole run")
    run.add_argument("--profile", choices=sorted(PROFILES), default="dev")
    run.add_argument("--property", action="append", dest="properties", metavar="NAME",
                     help="run only this property (repeatable)")
    run.add_argument("--deployment", default=None, metavar="FILE",
                     help="confine the search to one server configuration (JSON, see WORKFLOWS.md)")
    run.add_argument("--bounds", default=None, metavar="K=V,...",
                     help="case size ceiling, e.g. d=16,topk=8,spec_steps=6,max_bs=16,context=256 "
                          "(default: the target's, widened step by step in nightly)")
    run.add_argument("--no-share", dest="share", action="store_false",
                     help="search every property on its own (no shared runs of a case; for comparison)")
    _common_run_args(run)
    rep = sub.add_parser("replay", help="re-run a repro file's property")
    rep.add_argument("file")
    rep.add_argument("--target", default=None, help="default: the target recorded in the file")
    rep.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    rep.add_argument("--isolate", choices=["auto", "on", "off"], default="auto")
    rep.add_argument("--example-timeout", type=float, default=30.0, metavar="S")

    gate = sub.add_parser("gate", help="pr profile, only when the change touches verify-mask code")
    gate.add_argument("--target", default="reference")
    which = gate.add_mutually_exclusive_group()
    which.add_argument("--changed-files", default=None, metavar="FILE", help="one changed path per line")
    which.add_argument("--base", default=None, metavar="REV", help="changed paths from git diff REV...HEAD")
    _common_run_args(gate)

    mini = sub.add_parser("minimize", help="shrink a failing repro or deployment file")
    mini.add_argument("file")
    mini.add_argument("--target", default=None, help="default: the target recorded in a repro file, else reference")
    mini.add_argument("-o", "--output", default=None, help="repro file to write (default: FILE.min.json)")
    mini.add_argument("--property", default=None, help="for a deployment: the property to keep failing")
    mini.add_argument("--device", choices=["cpu", "cuda"], default="cpu")

    st = sub.add_parser("selftest", help="prove the properties catch every catalogued variant")
    st.add_argument("--target", default="reference")
    st.add_argument("--seed", type=int, default=0)
    st.add_argument("--max-examples", type=int, default=100, help="examples per property before a variant survives it")
    st.add_argument("--variant", action="append", dest="variants", metavar="NAME")
    st.add_argument("--device", choices=["cpu", "cuda"], default="cpu")

    sub.add_parser("targets", help="list targets and known-bad variants")

    # Issue 5: the arithmetic policy check and the small-scope enumeration.
    for name, helptext in (("verify-policy", "capacity soundness/liveness over a production-scale grid"),
                           ("exhaustive", "every configuration within small bounds, every property")):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("--target", default="reference")
        cmd.add_argument("--report-dir", default=None, help="default: reports/<UTC timestamp>/")
        if name == "exhaustive":
            cmd.add_argument("--workers", type=int, default=2, help="processes checking configurations")
    return p


def _resolve_target(spec: str):
    from harness.targets import TargetUnavailable, resolve
    try:
        return resolve(spec)
    except TargetUnavailable as exc:
        raise UsageError(f"vmfuzz: target {spec!r} unavailable: {exc}") from None


def _check_device(device: str) -> None:
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise UsageError("vmfuzz: --device cuda: no CUDA device is available here")


def cmd_targets(args) -> int:
    from harness.targets import BUILTIN, CATALOGUE
    width = max(len(n) for n in list(BUILTIN) + [f"+{v}" for v in CATALOGUE])
    print("targets:")
    for name, (desc, _) in BUILTIN.items():
        print(f"  {name:<{width}}  {desc}")
    print("  module:attr" + " " * max(1, width - 9) + "a plug-in object implementing the target protocol")
    print("variants (layer over any target, e.g. reference+pr33127):")
    for v in CATALOGUE.values():
        print(f"  +{v.name:<{width - 1}}  {v.description}")
    return EXIT_OK


def _show(res, log) -> None:
    if res.not_driven and not res.findings:
        log(f"  {res.prop:<22} not driven: {res.not_driven}")
        return
    status = "FAILED" if res.findings else ("skipped" if res.skipped else "held")
    log(f"  {res.prop:<22} {status:<7} {res.examples:>5} examples {res.seconds:6.1f}s")
    from harness.session import ci
    if res.classes and not ci():
        log("      classes: " + ", ".join(f"{k} ({v})" for k, v in sorted(res.classes.items())))
    for f in res.findings:
        log(f"      finding ({f.kind}): {f.detail}")
        log(f"      repro:   {f.path}")


def _isolate(choice: str, spec: str) -> bool:
    if choice != "auto":
        return choice == "on"
    # The embedded model cannot crash the process; real or foreign code can.
    return not spec.split("+")[0] == "reference"


def plan_run(args, *, command: str = "run", profile_name: str | None = None):
    """Checks the arguments shared by run and gate; returns (plan, target)."""
    from harness.properties import PROPERTIES
    from harness.campaign import Bounds
    from harness.session import RunPlan, default_report_dir

    profile = PROFILES[profile_name or args.profile]
    properties = getattr(args, "properties", None) or list(PROPERTIES)
    for name in properties:
        if name not in PROPERTIES:
            raise UsageError(f"vmfuzz: unknown property {name!r} (known: {', '.join(PROPERTIES)})")
    max_examples = getattr(args, "max_examples", None)
    if max_examples is not None and max_examples < 1:
        raise UsageError("vmfuzz: --max-examples must be at least 1")
    budget = getattr(args, "time_budget", None)
    if budget is not None and budget <= 0:
        raise UsageError("vmfuzz: --time-budget must be positive")
    if args.workers < 1:
        raise UsageError("vmfuzz: --workers must be at least 1")
    if args.example_timeout is not None and args.example_timeout <= 0:
        raise UsageError("vmfuzz: --example-timeout must be positive")
    deployment = None
    if getattr(args, "deployment", None):
        from harness.deployment import DeploymentError, load
        try:
            deployment = load(args.deployment)
        except DeploymentError as exc:
            raise UsageError(f"vmfuzz: {exc}") from None
    _check_device(args.device)
    target = _resolve_target(args.target)
    seed = getattr(args, "seed", None)
    if seed is None:
        seed = profile.fixed_seed if profile.fixed_seed is not None else random.SystemRandom().randrange(2**31)
    # A slow target (sglang runs its kernel in the Triton interpreter) carries
    # its own example budget per profile and size ceiling.
    own_budget = getattr(target, "budget", {}).get(profile.name)
    plan = RunPlan(target=args.target, profile=profile, seed=seed,
                   max_examples=max_examples or min(profile.max_examples, own_budget or profile.max_examples),
                   time_budget=budget if budget is not None else profile.time_budget,
                   report_dir=Path(args.report_dir) if args.report_dir else default_report_dir(),
                   properties=properties, workers=args.workers, device=args.device, db_dir=Path(args.db),
                   isolate=_isolate(args.isolate, args.target),
                   # Production shapes in the Triton interpreter take tens of seconds a
                   # case: a slow target names its own limit per profile.
                   example_timeout=args.example_timeout
                   or getattr(target, "example_timeout", {}).get(profile.name) or 30.0,
                   deployment=deployment, repro_root=Path(args.repro_root), command=command,
                   bounds=getattr(target, "bounds", None) or Bounds(), share=getattr(args, "share", True))
    user_bounds = getattr(args, "bounds", None)
    if user_bounds is not None:
        plan.bounds = parse_bounds(user_bounds, plan.bounds)
    else:
        # A slow target widens its bounds step by step where the profile's budget allows.
        plan.bounds_steps = tuple(getattr(target, "bounds_ladder", {}).get(profile.name, ()))
    return plan, target


#: ``--bounds`` keys: Bounds fields, and the short names a person types
BOUND_KEYS = {"max_bs": "max_bs", "context": "max_context_len", "max_context_len": "max_context_len",
              "d": "num_draft_tokens", "num_draft_tokens": "num_draft_tokens", "topk": "topk",
              "spec_steps": "spec_steps", "overshoot": "overshoot"}
BOUND_FLOORS = {"num_draft_tokens": 2}


def parse_bounds(text: str, base):
    """``k=v,...`` over ``base`` (a Bounds); a bad key or value is one UsageError line."""
    import dataclasses
    changes = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        field = BOUND_KEYS.get(key.strip())
        if field is None or not eq:
            raise UsageError(f"vmfuzz: --bounds {text!r}: {part!r} is not KEY=VALUE with KEY one of "
                             f"{', '.join(sorted(BOUND_KEYS))}")
        try:
            n = int(value)
        except ValueError:
            raise UsageError(f"vmfuzz: --bounds {text!r}: {key.strip()} must be an integer, got {value!r}") from None
        floor = BOUND_FLOORS.get(field, 1)
        if n < floor:
            raise UsageError(f"vmfuzz: --bounds {text!r}: {key.strip()} must be at least {floor}, got {n}")
        changes[field] = n
    if not changes:
        raise UsageError(f"vmfuzz: --bounds {text!r}: give at least one KEY=VALUE")
    return dataclasses.replace(base, **changes)


def execute_and_report(plan, target) -> int:
    from harness.report import write_reports
    from harness.session import execute

    budget = f", budget {plan.time_budget:g}s" if plan.time_budget else ""
    print(f"vmfuzz {plan.command}: target {target.name}, seed {plan.seed}, profile {plan.profile.name}, "
          f"{plan.max_examples} examples per property{budget}, {plan.workers} worker(s)"
          f"{', isolated' if plan.isolate else ''}", flush=True)
    outcome = execute(plan, target, _show)
    summary = write_reports(outcome, plan.report_dir)
    if outcome.deployment:
        d = outcome.deployment
        print(f"deployment {d['label']}: {'CAN' if d['can_write_out_of_range'] else 'cannot'} "
              f"write out of range: {d['why']}")
    print(f"reports: {plan.report_dir}/ (summary.json, summary.md, junit.xml, report.html)")
    if outcome.interrupted:
        print("vmfuzz: interrupted (findings written so far are kept, reports cover what ran)", file=sys.stderr)
        return 130
    if outcome.failed:
        print(f"{summary['counts']['findings']} finding(s) written under {plan.findings_dir}; "
              "replay with: vmfuzz replay FILE")
        return EXIT_FINDING
    undriven = [r.prop for r in outcome.results if r.not_driven]
    if undriven:
        print(f"{len(outcome.results) - len(undriven)} properties held; not driven on {target.name}: "
              + ", ".join(undriven))
    else:
        print(f"all {len(outcome.results)} properties held")
    return EXIT_OK


def cmd_run(args) -> int:
    plan, target = plan_run(args)
    return execute_and_report(plan, target)


def cmd_replay(args) -> int:
    from harness.isolation import TargetFault
    from harness.properties import PropertyFailure
    from harness.replay import replay
    from harness.repro_file import load

    repro = load(args.file)
    _check_device(args.device)
    target = _resolve_target(args.target or repro.target)
    try:
        replay(repro, target, args.device, isolate=_isolate(args.isolate, target.name),
               timeout=args.example_timeout)
    except PropertyFailure as exc:
        print(f"FAILED {exc.prop} on {target.name}: {exc.detail}")
        return EXIT_FINDING
    except TargetFault as exc:
        print(f"FAILED {repro.property} on {target.name}: {exc}")
        return EXIT_FINDING
    print(f"held {repro.property} on {target.name}")
    return EXIT_OK


def cmd_gate(args) -> int:
    from harness.gate import ChangeError, changed_from_file, changed_since, touches_verify_mask
    try:
        if args.changed_files:
            changed = changed_from_file(args.changed_files)
        elif args.base:
            changed = changed_since(args.base)
        else:
            changed = None
    except ChangeError as exc:
        raise UsageError(f"vmfuzz gate: {exc}") from None
    if changed is not None:
        hits = touches_verify_mask(changed)
        if not hits:
            print(f"vmfuzz gate: skipped: none of the {len(changed)} changed file(s) touches verify-mask code")
            return EXIT_OK
        print(f"vmfuzz gate: {len(hits)} changed file(s) touch verify-mask code: {', '.join(hits[:5])}"
              + (" ..." if len(hits) > 5 else ""))
    args.properties, args.seed, args.max_examples, args.time_budget, args.deployment = None, None, None, None, None
    plan, target = plan_run(args, command="gate", profile_name="pr")
    return execute_and_report(plan, target)


def cmd_minimize(args) -> int:
    from harness.minimize import minimize_file
    return minimize_file(args)


def cmd_selftest(args) -> int:
    from harness.selftest import selftest
    if args.max_examples < 1:
        raise UsageError("vmfuzz: --max-examples must be at least 1")
    _check_device(args.device)
    return selftest(args, _resolve_target)


def _findings_dir(args) -> Path:
    from harness.session import default_report_dir
    return Path(args.report_dir or default_report_dir()) / "findings"


def cmd_verify_policy(args) -> int:
    from harness.policy import verify_policy
    target = _resolve_target(args.target)
    report = verify_policy(target, findings_dir=_findings_dir(args))
    print(f"vmfuzz verify-policy: target {target.name}: {report.configs} configurations, "
          f"{report.checks} batch sizes checked in {report.seconds:.1f}s")
    for v in report.first.values():
        print(f"  {v.prop}: {report.violations[v.prop]} violation(s); first: {v.detail}")
        print(f"      repro: {v.path}")
    if not report.ok:
        return EXIT_FINDING
    print("capacity-soundness and capacity-liveness held")
    return EXIT_OK


def cmd_exhaustive(args) -> int:
    from harness.exhaustive import run_exhaustive
    if args.workers < 1:
        raise UsageError("vmfuzz: --workers must be at least 1")
    target = _resolve_target(args.target)
    report = run_exhaustive(target, findings_dir=_findings_dir(args), workers=args.workers, echo=print)
    return EXIT_OK if report.ok else EXIT_FINDING


COMMANDS = {"run": cmd_run, "replay": cmd_replay, "targets": cmd_targets, "gate": cmd_gate,
            "minimize": cmd_minimize, "selftest": cmd_selftest,
            "verify-policy": cmd_verify_policy, "exhaustive": cmd_exhaustive}


def main(argv: list[str] | None = None) -> int:
    from harness.repro_file import ReproError
    try:
        args = _parser().parse_args(argv)
        import torch
        # Cases are tiny tensors: intra-op threads only add scheduling latency
        # (a 2-thread reduction took milliseconds); parallelism is per worker.
        torch.set_num_threads(1)
        return COMMANDS[args.command](args)
    except (UsageError, ReproError) as exc:
        print(str(exc) if str(exc).startswith("vmfuzz") else f"vmfuzz: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("vmfuzz: interrupted (findings written so far are kept)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
