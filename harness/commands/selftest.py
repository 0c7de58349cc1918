"""``vmfuzz selftest``: every catalogued variant over a target, and which property caught it.

A property set that lets a known bug through proves nothing about unknown ones;
this is the kill matrix that shows it does not.
"""

from __future__ import annotations

from harness.commands.common import (check_device, check_selftest_options, report_dir_of, resolve_target,
                                     write_command_report)
from harness.model.errors import EXIT_FINDING, EXIT_OK, UsageError


def render(matrix: dict[str, dict[str, int | None]]) -> str:
    from harness.properties import PROPERTIES
    props = list(PROPERTIES)
    short = [p.replace("capacity-", "cap-").replace("-equivalence", "-eq") for p in props]
    width = max(len(v) for v in matrix) if matrix else 7
    lines = [f"{'variant':<{width}}  " + "  ".join(f"{s:>14}" for s in short)]
    for v, row in matrix.items():
        cells = ["-" if row[p] is None else f"{row[p]} ex" for p in props]
        lines.append(f"{v:<{width}}  " + "  ".join(f"{c:>14}" for c in cells))
    return "\n".join(lines)


def run(args) -> int:
    from harness.engine.kill_matrix import kill_matrix
    from harness.targets import CATALOGUE
    check_selftest_options(args)
    check_device(args.device)
    target = resolve_target(args.target)
    variants = args.variants or list(CATALOGUE)
    for v in variants:
        if v not in CATALOGUE:
            raise UsageError(f"vmfuzz: unknown variant {v!r} (known: {', '.join(CATALOGUE)})")
    print(f"vmfuzz selftest: {len(variants)} variant(s) over {target.name}, seed {args.seed}, "
          f"up to {args.max_examples} examples per property", flush=True)
    matrix = kill_matrix(target, variants, seed=args.seed, max_examples=args.max_examples,
                         device=args.device, log=lambda s: print(s, flush=True))
    print("kill matrix (examples needed to catch; - = survived that property):")
    print(render(matrix))
    survivors = [v for v, row in matrix.items() if all(n is None for n in row.values())]
    if survivors:
        print(f"{len(survivors)} variant(s) survived every property: {', '.join(survivors)}")
    else:
        print(f"all {len(matrix)} variants caught")
    _report(args, target.name, matrix)
    return EXIT_FINDING if survivors else EXIT_OK


def _report(args, target_name: str, matrix: dict[str, dict[str, int | None]]) -> None:
    """One testcase per variant: caught (passes) or survived (fails); which properties caught it."""
    from harness.properties import PROPERTIES
    from harness.report.summary import Check, CommandSummary

    summary = CommandSummary("selftest", target_name, extra={"kill_matrix": matrix, "seed": args.seed,
                                                            "max_examples": args.max_examples})
    for v, row in matrix.items():
        caught = [f"{p} ({n} ex)" for p, n in row.items() if n is not None]
        summary.checks.append(Check(v, "caught", "caught by " + ", ".join(caught)) if caught else
                              Check(v, "failed", "survived every property", "variant-survived"))
    silent = [p for p in PROPERTIES if all(row[p] is None for row in matrix.values())]
    summary.headline = (f"{sum(c.status == 'caught' for c in summary.checks)} of {len(matrix)} variants caught"
                        + (f"; no variant exercises {', '.join(silent)}" if silent else ""))
    write_command_report(summary, report_dir_of(args))
