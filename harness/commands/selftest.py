"""``vmfuzz selftest``: every catalogued variant over a target, and which property caught it.

A property set that lets a known bug through proves nothing about unknown ones;
this is the kill matrix that shows it does not.
"""

from __future__ import annotations

import sys

from vmfuzz.harness.commands.common import check_device, resolve_target, write_command_report
from vmfuzz.harness.commands.request import SelftestRequest
from vmfuzz.harness.model.errors import EXIT_FINDING, EXIT_OK, UsageError


def _word(cell) -> str:
    from vmfuzz.harness.engine.regression.kill_matrix import KNOWN, NOT_DRIVEN, RAISED
    if cell is None:
        return "-"
    return {NOT_DRIVEN: "n/d", RAISED: "raised", KNOWN: "known"}.get(cell, f"{cell} ex")


def render(matrix: dict[str, dict]) -> str:
    from vmfuzz.harness.properties import PROPERTIES
    props = list(PROPERTIES)
    short = [p.replace("capacity-", "cap-").replace("-equivalence", "-eq") for p in props]
    width = max(len(v) for v in matrix) if matrix else 7
    lines = [f"{'variant':<{width}}  " + "  ".join(f"{s:>14}" for s in short)]
    for v, row in matrix.items():
        cells = [_word(row[p]) for p in props]
        lines.append(f"{v:<{width}}  " + "  ".join(f"{c:>14}" for c in cells))
    return "\n".join(lines)


def run(request: SelftestRequest) -> int:
    from vmfuzz.harness.engine.regression.kill_matrix import caught, kill_matrix, variant_driven
    from vmfuzz.harness.targets import CATALOGUE
    check_device(request.device)
    target = resolve_target(request.target)
    variants = request.variants or list(CATALOGUE)
    for v in variants:
        if v not in CATALOGUE:
            raise UsageError(f"vmfuzz: unknown variant {v!r} (known: {', '.join(CATALOGUE)})")
    print(f"vmfuzz selftest: {len(variants)} variant(s) over {target.name}, seed {request.seed}, "
          f"up to {request.max_examples} examples per property", flush=True)
    matrix: dict[str, dict] = {}
    try:
        kill_matrix(target, variants, seed=request.seed, max_examples=request.max_examples,
                    device=request.device, log=lambda s: print(s, flush=True), into=matrix)
    except KeyboardInterrupt:
        from vmfuzz.harness.engine.core.signals import exit_code, received
        if received() is None:
            raise  # the target raised it, no signal came: not an interrupt of the selftest
        print(render(matrix))
        _report(request, target.name, matrix, interrupted=[v for v in variants if v not in matrix])
        print("vmfuzz: interrupted (reports cover the variants judged)", file=sys.stderr)
        return exit_code()
    print("kill matrix (examples needed to catch; - = survived that property; n/d = not driven on this "
          "target; raised = the target raised, which catches nothing; known = upstream's known defect, "
          "which is not the variant's catch):")
    print(render(matrix))
    driven = {v: row for v, row in matrix.items() if variant_driven(row)}
    survivors = [v for v, row in driven.items() if not any(caught(n) for n in row.values())]
    undriven = [v for v in matrix if v not in driven]
    if undriven:
        print(f"{len(undriven)} variant(s) not driven on {target.name} (no property could judge them): "
              + ", ".join(undriven))
    if survivors:
        print(f"{len(survivors)} variant(s) survived every property: {', '.join(survivors)}")
    else:
        print(f"all {len(driven)} variants caught")
    _report(request, target.name, matrix)
    if not driven:
        raise UsageError(f"vmfuzz selftest: no variant could be driven on {target.name}")
    return EXIT_FINDING if survivors else EXIT_OK


def _report(request: SelftestRequest, target_name: str, matrix: dict[str, dict], interrupted: list[str] | None = None) -> None:
    """One testcase per variant: caught (passes), survived (fails) or not driven (skipped);
    ``interrupted``: the run was, and these variants are left unjudged (skipped)."""
    from vmfuzz.harness.engine.regression.kill_matrix import caught, variant_driven
    from vmfuzz.harness.properties import PROPERTIES
    from vmfuzz.harness.report.summary import Check, CommandSummary

    summary = CommandSummary("selftest", target_name, extra={"kill_matrix": matrix, "seed": request.seed,
                                                            "max_examples": request.max_examples,
                                                            "interrupted": interrupted is not None})
    for v, row in matrix.items():
        by = [f"{p} ({n} ex)" for p, n in row.items() if caught(n)]
        if by:
            summary.checks.append(Check(v, "caught", "caught by " + ", ".join(by)))
        elif variant_driven(row):
            summary.checks.append(Check(v, "failed", "survived every property", "variant-survived"))
        else:
            summary.checks.append(Check(v, "skipped", f"not driven on {target_name}"))
    unjudged = interrupted or []
    summary.checks += [Check(v, "skipped", "interrupted before it was judged") for v in unjudged]
    silent = [p for p in PROPERTIES if not any(caught(row[p]) for row in matrix.values())]
    summary.headline = (f"{sum(c.status == 'caught' for c in summary.checks)} of {len(matrix)} variants caught"
                        + (f"; no variant exercises {', '.join(silent)}" if silent else "")
                        + (f"; interrupted: {len(unjudged)} variant(s) not judged" if interrupted is not None else ""))
    write_command_report(summary, request.report_dir)
