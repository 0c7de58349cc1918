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
    p.add_argument("--report-dir", default=None, metavar="DIR", help="default: reports/<UTC timestamp>/")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where tensors live")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="every boundary class each property reached, not the one-line summary")
    p.add_argument("--db", default=DEFAULT_DB_DIR, metavar="DIR",
                   help=f"example database and last run's failures (pr reads it, nightly writes it; "
                        f"default {DEFAULT_DB_DIR})")
    p.add_argument("--isolate", choices=["auto", "on", "off"], default="auto",
                   help="run each example in a watched worker (auto: on for sglang and plug-in targets)")
    p.add_argument("--example-timeout", type=float, default=None, metavar="S",
                   help="seconds one example may take under isolation before it is a target-hang "
                        "(default 30, or the target's own for the profile)")
    p.add_argument("--repro-root", default=None, metavar="DIR",
                   help="canonical repros replayed first by the pr profile (default: ./repro if it exists, "
                        "else the repro/ folder of vmfuzz's own checkout)")


TARGET_HELP = ("reference (default), sglang, or module:attr; layer a known-bad variant with +NAME "
               "(vmfuzz targets)")

EPILOG = """exit codes:
  0    every property held (or nothing to do: a skipped gate)
  1    a finding: the repro file is on disk before it is printed
  2    bad input or an unavailable target (one line on stderr)
  130  interrupted (findings so far are kept)

Each command writes summary.json, summary.md and junit.xml to --report-dir
(default reports/<UTC timestamp>/). `vmfuzz COMMAND --help` for its options."""


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vmfuzz", description="Property-based harness for SGLang's target-verify tree mask.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND",
                           title="commands")

    run = sub.add_parser("run", help="search every property for a counterexample")
    run.add_argument("--target", default="reference", help=TARGET_HELP)
    run.add_argument("--seed", type=int, default=None, help="makes the run reproducible (default: random, printed)")
    run.add_argument("--max-examples", type=int, default=None, help="examples per property (per round)")
    run.add_argument("--time-budget", type=float, default=None, help="seconds for the whole run")
    run.add_argument("--profile", choices=sorted(PROFILES), default="dev",
                     help="; ".join(f"{p.name}: {p.summary}" for p in PROFILES.values()))
    run.add_argument("--property", action="append", dest="properties", metavar="NAME",
                     help="run only this property (repeatable)")
    run.add_argument("--deployment", default=None, metavar="FILE",
                     help="confine the search to one server configuration (JSON; README, Deployments)")
    run.add_argument("--bounds", default=None, metavar="K=V,...",
                     help="case size ceiling, e.g. d=16,topk=8,spec_steps=6,max_bs=16,context=256 "
                          "(default: the target's, widened step by step in nightly)")
    run.add_argument("--no-share", dest="share", action="store_false",
                     help="search every property on its own (no shared runs of a case; for comparison)")
    _common_run_args(run)
    rep = sub.add_parser("replay", help="re-run a repro file's property")
    rep.add_argument("file", metavar="FILE", help="repro file (only config and batches are required)")
    rep.add_argument("--target", default=None,
                     help="default: the target recorded in the file, else reference")
    rep.add_argument("--property", default=None, metavar="NAME",
                     help="default: the property recorded in the file, else every property that applies")
    rep.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where tensors live")
    rep.add_argument("--isolate", choices=["auto", "on", "off"], default="auto",
                     help="run in a watched worker (auto: on for sglang and plug-in targets)")
    rep.add_argument("--example-timeout", type=float, default=30.0, metavar="S",
                     help="seconds the case may take under isolation before it is a target-hang")
    rep.add_argument("--report-dir", default=None, metavar="DIR", help="default: reports/<UTC timestamp>/")

    gate = sub.add_parser("gate", help="pr profile, only when the change touches verify-mask code")
    gate.add_argument("--target", default="reference", help=TARGET_HELP)
    which = gate.add_mutually_exclusive_group()
    which.add_argument("--changed-files", default=None, metavar="FILE", help="one changed path per line")
    which.add_argument("--base", default=None, metavar="REV", help="changed paths from git diff REV...HEAD")
    gate.add_argument("--repo", default=".", metavar="PATH",
                      help="the checkout under test: where --base is diffed, or the root --changed-files "
                           "paths are relative to (default: the current directory)")
    gate.add_argument("--property", action="append", dest="properties", metavar="NAME",
                      help="search only this property (repeatable; default every one); saved repros still replay")
    _common_run_args(gate)

    mini = sub.add_parser("minimize", help="shrink a failing repro or deployment file")
    mini.add_argument("file", metavar="FILE", help="repro file or deployment file")
    mini.add_argument("--target", default=None, help="default: the target recorded in a repro file, else reference")
    mini.add_argument("-o", "--output", default=None, metavar="OUT",
                      help="repro file to write (default: REPORT_DIR/<FILE's name>.min.json)")
    mini.add_argument("--property", default=None, metavar="NAME",
                      help="the property to keep failing (default: the repro's, else the first that fails)")
    mini.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where tensors live")
    mini.add_argument("--report-dir", default=None, metavar="DIR", help="default: reports/<UTC timestamp>/")

    st = sub.add_parser("selftest", help="prove the properties catch every catalogued variant")
    st.add_argument("--target", default="reference", help="the target the variants are layered over")
    st.add_argument("--seed", type=int, default=0, help="search seed (default 0: the matrix is reproducible)")
    st.add_argument("--max-examples", type=int, default=100, help="examples per property before a variant survives it")
    st.add_argument("--variant", action="append", dest="variants", metavar="NAME",
                    help="only this catalogued variant (repeatable; default every one, see vmfuzz targets)")
    st.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where tensors live")
    st.add_argument("--report-dir", default=None, metavar="DIR", help="default: reports/<UTC timestamp>/")

    sub.add_parser("targets", help="list targets and known-bad variants")

    surf = sub.add_parser("surface", help="each part of SGLang's mask path: which property drives it, or why none")
    surf.add_argument("--target", default="sglang", help="whose mask path to list (default sglang: the installed package)")
    surf.add_argument("--json", action="store_true", help="print the rows as JSON")
    bis = sub.add_parser("bisect", help="first commit of an SGLang checkout on which a repro fails (git bisect run)")
    bis.add_argument("repro", metavar="REPRO", help="repro file to replay at each revision")
    bis.add_argument("--repo", required=True, metavar="PATH",
                     help="SGLang checkout (python/sglang/...); left on the branch it was on")
    bis.add_argument("--good", required=True, metavar="REV", help="a revision on which the repro holds")
    bis.add_argument("--bad", required=True, metavar="REV", help="a later revision on which it fails")
    bis.add_argument("--target", default="sglang", help="target loaded from each revision's code (default sglang)")
    bis.add_argument("--property", default=None, metavar="NAME",
                     help="default: the repro's property, else every property that applies")
    bis.add_argument("--timeout", type=float, default=600.0, metavar="S",
                     help="seconds one revision's replay may take before it counts as a hang (bad)")
    bis.add_argument("--report-dir", default=None, metavar="DIR", help="default: reports/<UTC timestamp>/")

    # Issue 5: the arithmetic policy check and the small-scope enumeration.
    for name, helptext in (("verify-policy", "capacity soundness/liveness over a production-scale grid"),
                           ("exhaustive", "every configuration within small bounds, every property")):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("--target", default="reference", help=TARGET_HELP)
        cmd.add_argument("--report-dir", default=None, metavar="DIR", help="default: reports/<UTC timestamp>/")
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


#: -v: the full boundary-class list per property instead of the one-line summary.
VERBOSE = False


def classes_line(classes: dict[str, int], verbose: bool = False) -> str:
    from harness.commands import classes_line as line
    return line(classes, verbose)


def _show(res, log) -> None:
    from harness.terminal import paint, plural
    if res.not_driven and not res.findings:
        log(f"  {res.prop:<22} {paint('not driven')}: {res.not_driven}")
        return
    status = "FAILED" if res.findings else ("skipped" if res.skipped else "held")
    log(f"  {res.prop:<22} {paint(status, width=7)} {plural(res.examples, 'example'):>14} {res.seconds:6.1f}s")
    if res.classes:
        log("      " + classes_line(res.classes, VERBOSE))
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
    from harness.regressions import default_repro_root
    from harness.session import RunPlan

    profile = PROFILES[profile_name or args.profile]
    properties = getattr(args, "properties", None) or list(PROPERTIES)
    for name in properties:
        if name not in PROPERTIES:
            raise UsageError(f"vmfuzz: unknown property {name!r} (known: {', '.join(PROPERTIES)})")
    from harness.edges import check_run_options
    max_examples = getattr(args, "max_examples", None)
    budget = getattr(args, "time_budget", None)
    check_run_options(args, profile, properties)
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
    from harness.edges import check_places
    report_dir = check_places(args, profile)
    plan = RunPlan(target=args.target, profile=profile, seed=seed,
                   max_examples=max_examples or min(profile.max_examples, own_budget or profile.max_examples),
                   time_budget=budget if budget is not None else profile.time_budget,
                   report_dir=report_dir,
                   properties=properties, workers=args.workers, device=args.device, db_dir=Path(args.db),
                   isolate=_isolate(args.isolate, args.target),
                   # Production shapes in the Triton interpreter take tens of seconds a
                   # case: a slow target names its own limit per profile.
                   example_timeout=args.example_timeout
                   or getattr(target, "example_timeout", {}).get(profile.name) or 30.0,
                   deployment=deployment, command=command,
                   repro_root=Path(args.repro_root) if args.repro_root else default_repro_root(),
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
    bounds = dataclasses.replace(base, **changes)
    _check_bounds_limits(text, bounds)
    return bounds


def _check_bounds_limits(text: str, bounds) -> None:
    """The limits of harness/limits.py hold for searched cases too: a ceiling whose
    largest case would allocate past MAX_BUFFER_CELLS is refused before the search,
    never left to fail with a MemoryError that would read as the target's finding."""
    from harness import limits
    for field, cap, name in (("num_draft_tokens", limits.MAX_DRAFT_TOKENS, "MAX_DRAFT_TOKENS"),
                             ("topk", limits.MAX_TOPK, "MAX_TOPK"), ("spec_steps", limits.MAX_SPEC_STEPS, "MAX_SPEC_STEPS"),
                             ("max_bs", limits.MAX_SEARCH_REQUESTS, "MAX_SEARCH_REQUESTS")):
        if getattr(bounds, field) > cap:
            raise UsageError(f"vmfuzz: --bounds {text!r}: {field} {getattr(bounds, field)} is over {name} "
                             f"({cap}, harness/limits.py)")
    # the largest step a search draws: a FULL_MASK fallback for 2 * max_bs + overshoot
    # requests, every one at the context limit
    d = bounds.num_draft_tokens
    cells = (2 * bounds.max_bs + bounds.overshoot) * d * (bounds.max_context_len + d)
    if cells > limits.MAX_BUFFER_CELLS:
        raise UsageError(f"vmfuzz: --bounds {text!r}: its largest case needs a {cells}-cell buffer, over "
                         f"MAX_BUFFER_CELLS ({limits.MAX_BUFFER_CELLS}, harness/limits.py); lower max_bs, context or d")


def execute_and_report(plan, target, gate=None) -> int:
    """``gate(outcome) -> dict``: the gate's coverage, computed from what ran, for the reports."""
    from harness.report import write_reports
    from harness.session import execute

    from harness.terminal import paint, plural
    budget = f", budget {plan.time_budget:g}s" if plan.time_budget else ""
    print(f"vmfuzz {plan.command}: target {target.name}, seed {plan.seed}, profile {plan.profile.name}, "
          f"{plural(plan.max_examples, 'example')} per property{budget}, {plural(plan.workers, 'worker')}"
          f"{', isolated' if plan.isolate else ''}", flush=True)
    outcome = execute(plan, target, _show)
    if gate is not None:
        from harness.surface import gate_line
        outcome.gate = gate(outcome)
        print(gate_line(outcome.gate))
    from harness.edges import write_reports_somewhere
    summary, written = write_reports_somewhere(write_reports, outcome, plan.report_dir)
    if outcome.deployment:
        d = outcome.deployment
        print(f"deployment {d['label']}: {'CAN' if d['can_write_out_of_range'] else 'cannot'} "
              f"write out of range: {d['why']}")
        for part in ("routing", "allocation"):
            v = d.get(part)
            if v:
                state = {True: "held", False: "FAILED", None: "not checked"}[v["ok"]]
                print(f"  {part}: {state}: {v['why']}")
    print(f"reports: {written}/ (summary.json, summary.md, junit.xml, report.html)")
    if outcome.interrupted:
        from harness.signals import exit_code
        print("vmfuzz: interrupted (findings written so far are kept, reports cover what ran)", file=sys.stderr)
        return exit_code()
    if outcome.failed:
        where = plan.findings_dir if written == plan.report_dir else "the repro paths above"
        print(f"{paint(plural(summary['counts']['findings'], 'finding'), 'FAILED')} written under {where}; "
              "replay with: vmfuzz replay FILE")
        return EXIT_FINDING
    if written != plan.report_dir:
        return EXIT_USAGE  # the reports are not where CI looks for them: not a pass
    if outcome.deployment and any((outcome.deployment.get(p) or {}).get("ok") is False
                                  for p in ("routing", "allocation")):
        print(f"the deployment's routing or allocation fails (recorded in {written}/summary.json)")
        return EXIT_FINDING
    undriven = [r.prop for r in outcome.results if r.not_driven]
    if undriven:
        print(f"{plural(len(outcome.results) - len(undriven), 'property', 'properties')} "
              f"{paint('held')}; not driven on {target.name}: " + ", ".join(undriven))
    elif len(outcome.results) == 1:
        print(f"{outcome.results[0].prop} {paint('held')}")
    else:
        print(f"all {len(outcome.results)} properties {paint('held')}")
    return EXIT_OK


def cmd_run(args) -> int:
    plan, target = plan_run(args)
    return execute_and_report(plan, target)


def cmd_replay(args) -> int:
    from harness.commands import replay_command
    return replay_command(args)


def _write_command_report(summary, args) -> Path:
    from harness.commands import write_command_report
    return write_command_report(summary, args)


def cmd_gate(args) -> int:
    # Nothing here imports SGLang before the change is known to touch the mask:
    # a docs-only change is a skip that costs seconds.
    from harness.gate import (ChangeError, changed_from_file, changed_since, checkout_at, shown,
                              touches_verify_mask)
    try:
        if args.changed_files:
            changed, checkout = changed_from_file(args.changed_files), checkout_at(args.repo)
        elif args.base:
            changed, checkout = changed_since(args.base, args.repo)
        else:
            changed, checkout = None, None
    except ChangeError as exc:
        raise UsageError(f"vmfuzz gate: {exc}") from None
    if changed is not None:
        hits = touches_verify_mask(changed, checkout)
        if not hits:
            from harness.command_report import Check, CommandSummary
            why = f"none of the {len(changed)} changed file(s) touches verify-mask code"
            print(f"vmfuzz gate: skipped: {why}")
            _write_command_report(CommandSummary("gate", args.target, [Check("gate", "skipped", why)],
                                                 headline=f"skipped: {why}", extra={"changed": changed}), args)
            return EXIT_OK
        print(f"vmfuzz gate: {len(hits)} changed file(s) touch verify-mask code: {', '.join(map(shown, hits[:5]))}"
              + (" ..." if len(hits) > 5 else ""))
    args.seed, args.max_examples, args.time_budget, args.deployment = None, None, None, None
    plan, target = plan_run(args, command="gate", profile_name="pr")

    def coverage(outcome):
        from harness.surface import gate_coverage
        try:
            return gate_coverage(args.target, target, changed, hits, outcome.results)
        except (ValueError, ImportError, OSError) as exc:
            # The reports are still written; the gate claims no coverage it cannot show.
            why = f"surface unavailable: {type(exc).__name__}: {exc}"
            return {"changed": changed, "triggered": hits, "exercised": [], "not_driven": hits,
                    "why_not_driven": {p: why for p in hits}}
    return execute_and_report(plan, target, coverage if changed is not None else None)


def cmd_surface(args) -> int:
    import json
    from harness.surface import render, report
    target = _resolve_target(args.target)
    rep = report(args.target, target)
    rows = rep.pop("_rows")
    print(json.dumps(rep, indent=2) if args.json else render({**rep, "_rows": rows}))
    return EXIT_OK


def cmd_minimize(args) -> int:
    from harness.minimize import minimize_file
    return minimize_file(args)


def cmd_selftest(args) -> int:
    from harness.selftest import selftest
    from harness.edges import check_selftest_options
    check_selftest_options(args)
    _check_device(args.device)
    return selftest(args, _resolve_target)


def _findings_dir(args) -> Path:
    from harness.edges import usable
    from harness.session import default_report_dir
    if not args.report_dir:  # one folder for the findings and the reports that point at them
        args.report_dir = str(default_report_dir())
    return usable(Path(args.report_dir), "--report-dir") / "findings"


def cmd_verify_policy(args) -> int:
    from harness.commands import verify_policy_command
    return verify_policy_command(args)


def cmd_exhaustive(args) -> int:
    from harness.commands import exhaustive_command
    return exhaustive_command(args)


def cmd_bisect(args) -> int:
    from harness.commands import bisect_command
    return bisect_command(args)


COMMANDS = {"bisect": cmd_bisect, "run": cmd_run, "replay": cmd_replay, "targets": cmd_targets, "gate": cmd_gate,
            "minimize": cmd_minimize, "selftest": cmd_selftest,
            "verify-policy": cmd_verify_policy, "exhaustive": cmd_exhaustive, "surface": cmd_surface}


def main(argv: list[str] | None = None) -> int:
    from harness.edges import guarded
    return guarded(_main, argv)


def _main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    global VERBOSE
    VERBOSE = bool(getattr(args, "verbose", False))
    from harness.commands import quiet_dependency_warnings
    quiet_dependency_warnings()
    import torch
    # Cases are tiny tensors: intra-op threads only add scheduling latency
    # (a 2-thread reduction took milliseconds); parallelism is per worker.
    torch.set_num_threads(1)
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
