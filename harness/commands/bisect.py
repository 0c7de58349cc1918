"""``vmfuzz bisect``: the first commit of an SGLang checkout on which a repro fails."""

from __future__ import annotations

from harness.commands.common import report_dir_of, sglang_checkout_at, write_command_report
from harness.model.errors import EXIT_FINDING, UsageError


def run(args) -> int:
    from harness.engine.regression.bisect import BisectError, bisect
    from harness.report.summary import Check, CommandSummary

    if args.timeout <= 0:
        raise UsageError("vmfuzz: --timeout must be positive")
    # each revision's own python/sglang is what is replayed: without one, the installed SGLang would be
    sglang_checkout_at(args.repo, "bisect")
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
                                    "candidates": res.candidates, "cleaned": res.cleaned})
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
    write_command_report(summary, report_dir_of(args))
    return EXIT_FINDING
