"""``vmfuzz``: the command line (exit 0: all held; 1: a finding, on disk; 2: bad input)."""

from __future__ import annotations

import argparse
import datetime as dt
import random
import sys
from pathlib import Path

EXIT_OK, EXIT_FINDING, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input or an unavailable target: one line on stderr, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise UsageError(f"{self.prog}: {message}")


PROFILES = {
    # examples per property, size ceiling
    "dev": {"max_examples": 100},
    "pr": {"max_examples": 200},
    "nightly": {"max_examples": 2000},
}


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vmfuzz", description="Property-based harness for SGLang's target-verify tree mask.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="search every property for a counterexample")
    run.add_argument("--target", default="reference")
    run.add_argument("--seed", type=int, default=None, help="makes the run reproducible (default: random, printed)")
    run.add_argument("--max-examples", type=int, default=None, help="examples per property")
    run.add_argument("--time-budget", type=float, default=None, help="seconds for the whole run")
    run.add_argument("--profile", choices=sorted(PROFILES), default="dev")
    run.add_argument("--property", action="append", dest="properties", metavar="NAME",
                     help="run only this property (repeatable)")
    run.add_argument("--report-dir", default=None, help="default: reports/<UTC timestamp>/")
    run.add_argument("--device", choices=["cpu", "cuda"], default="cpu")

    rep = sub.add_parser("replay", help="re-run a repro file's property")
    rep.add_argument("file")
    rep.add_argument("--target", default=None, help="default: the target recorded in the file")
    rep.add_argument("--device", choices=["cpu", "cuda"], default="cpu")

    sub.add_parser("targets", help="list targets and known-bad variants")
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


def cmd_run(args) -> int:
    from harness.campaign import Bounds, run_campaign
    from harness.properties import PROPERTIES

    for name in args.properties or []:
        if name not in PROPERTIES:
            raise UsageError(f"vmfuzz: unknown property {name!r} (known: {', '.join(PROPERTIES)})")
    if args.max_examples is not None and args.max_examples < 1:
        raise UsageError("vmfuzz: --max-examples must be at least 1")
    _check_device(args.device)
    target = _resolve_target(args.target)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    # A slow target (sglang runs its kernel in the Triton interpreter) carries
    # its own example budget per profile and size ceiling.
    budget = getattr(target, "budget", {}).get(args.profile)
    max_examples = args.max_examples or min(PROFILES[args.profile]["max_examples"], budget or 1 << 30)
    bounds = getattr(target, "bounds", None) or Bounds()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    report_dir = Path(args.report_dir or Path("reports") / stamp)
    findings_dir = report_dir / "findings"
    print(f"vmfuzz run: target {target.name}, seed {seed}, profile {args.profile}, "
          f"{max_examples} examples per property")

    def show(res):
        status = "FAILED" if res.finding else "held"
        print(f"  {res.prop:<22} {status:<6} {res.examples:>5} examples {res.seconds:6.1f}s")
        if res.classes:
            print("      classes: " + ", ".join(f"{k} ({v})" for k, v in sorted(res.classes.items())))
        if res.finding:
            print(f"      finding: {res.finding.detail}")
            print(f"      repro:   {res.finding.path}")

    results = run_campaign(target, seed=seed, max_examples=max_examples, bounds=bounds,
                           findings_dir=findings_dir, properties=args.properties, device=args.device,
                           on_result=show)
    found = [r for r in results if r.finding]
    if found:
        print(f"{len(found)} finding(s) written under {findings_dir}; replay with: vmfuzz replay FILE")
        return EXIT_FINDING
    print(f"all {len(results)} properties held")
    return EXIT_OK


def cmd_replay(args) -> int:
    from harness.properties import PropertyFailure
    from harness.replay import replay
    from harness.repro_file import load

    repro = load(args.file)
    _check_device(args.device)
    target = _resolve_target(args.target or repro.target)
    try:
        replay(repro, target, args.device)
    except PropertyFailure as exc:
        print(f"FAILED {exc.prop} on {target.name}: {exc.detail}")
        return EXIT_FINDING
    print(f"held {repro.property} on {target.name}")
    return EXIT_OK


COMMANDS = {"run": cmd_run, "replay": cmd_replay, "targets": cmd_targets}


def main(argv: list[str] | None = None) -> int:
    from harness.repro_file import ReproError
    try:
        args = _parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except (UsageError, ReproError) as exc:
        print(str(exc) if str(exc).startswith("vmfuzz") else f"vmfuzz: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("vmfuzz: interrupted (findings written so far are kept)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
