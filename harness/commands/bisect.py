"""``vmfuzz bisect``: the first commit of an SGLang checkout on which a repro fails."""

from __future__ import annotations

from vmfuzz.harness.commands.common import sglang_checkout_at, write_command_report
from vmfuzz.harness.commands.request import BisectRequest
from vmfuzz.harness.model.errors import EXIT_FINDING, UsageError


def run(request: BisectRequest) -> int:
    from vmfuzz.harness.engine.regression.bisect import BisectError, bisect
    from vmfuzz.harness.report.summary import Check, CommandSummary

    # each revision's own python/sglang is what is replayed: without one, the installed SGLang would be
    sglang_checkout_at(request.repo, "bisect")
    print(f"vmfuzz bisect: {request.repro} on {request.target}, good {request.good}, bad {request.bad}, "
          f"in {request.repo}", flush=True)
    try:
        res = bisect(str(request.repro), str(request.repo), request.good, request.bad, target=request.target,
                     prop=request.property, timeout=request.timeout, echo=lambda s: print(s, flush=True))
    except BisectError as exc:
        raise UsageError(f"vmfuzz bisect: {exc}") from None
    summary = CommandSummary("bisect", request.target, seconds=res.seconds,
                             extra={"repro": str(request.repro), "repo": str(request.repo), "first_bad": res.first_bad,
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
    write_command_report(summary, request.report_dir)
    return EXIT_FINDING
