"""``vmfuzz surface``: each part of SGLang's mask path, and which property drives it (or why none).

Like every command it writes summary.json, summary.md and junit.xml: one check
per row, held where a property drives the part, skipped (with why) where none does.
"""

from __future__ import annotations

import json
import sys
import time

from vmfuzz.harness.commands.common import claimed_report_dir, resolve_target
from vmfuzz.harness.commands.request import SurfaceRequest
from vmfuzz.harness.model.errors import EXIT_OK


def run(request: SurfaceRequest) -> int:
    from vmfuzz.harness.engine.campaign.surface import render, report
    report_dir = claimed_report_dir(request.report_dir)
    t0 = time.monotonic()
    target = resolve_target(request.target)
    rep = report(request.target, target)
    rows = rep.pop("_rows")
    text = render({**rep, "_rows": rows})
    print(json.dumps(rep, indent=2) if request.json else text)
    _write_summary(request, rep, text.splitlines()[0], time.monotonic() - t0, report_dir)
    return EXIT_OK


def _write_summary(request: SurfaceRequest, rep: dict, headline: str, seconds: float, report_dir) -> None:
    from vmfuzz.harness.report.summary import Check, CommandSummary, write_command_summary
    checks = [Check(f"{r['file']}: {r['function']}", "held" if r["driven"] else "skipped",
                    f"driven by {', '.join(r['driven_by'])}" if r["driven"] else (r["why"] or "not driven"))
              for r in rep["rows"]]
    extra = {k: v for k, v in rep.items() if k not in ("target", "rows")}
    write_command_summary(CommandSummary("surface", request.target, checks, headline=headline, extra=extra,
                                         seconds=seconds), report_dir)
    # stdout stays the JSON alone under --json
    print(f"reports: {report_dir}/ (summary.json, summary.md, junit.xml)",
          file=sys.stderr if request.json else sys.stdout)
