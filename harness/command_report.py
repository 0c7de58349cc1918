"""summary.json, summary.md and junit.xml for the commands that are not a campaign.

``run`` and ``gate`` have their own, richer summary (``harness.report``); every
other command (replay, minimize, selftest, verify-policy, exhaustive, bisect, a
skipped gate) builds a ``CommandSummary`` -- one ``Check`` per thing it decided
-- and ``write`` emits the three files CI collects, with the same counts in
each: a CI job that uploads the report folder and a JUnit tab works for every
command the same way.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

#: "caught" is selftest's pass: the known-bad variant was found.
STATUSES = ("held", "caught", "failed", "skipped", "error")


@dataclass
class Check:
    """One testcase: a property replayed, a variant caught, a configuration checked, ..."""

    name: str
    status: str  # one of STATUSES
    detail: str = ""
    kind: str = ""  # for a failure: property / target-crash / ...
    repro: str | None = None
    seconds: float = 0.0

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")


@dataclass
class CommandSummary:
    command: str
    target: str
    checks: list[Check] = field(default_factory=list)
    #: what the command found out, in its own words (first bad commit, the minimized case, ...)
    headline: str = ""
    extra: dict = field(default_factory=dict)
    started: str = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return any(c.status == "failed" for c in self.checks)

    def as_dict(self) -> dict:
        n = Counter(c.status for c in self.checks)
        return {"command": self.command, "target": self.target, "started": self.started,
                "verdict": "failed" if self.failed else ("skipped" if self.checks and n["skipped"] == len(self.checks)
                                                         else "passed"),
                "headline": self.headline,
                "counts": {"checks": len(self.checks), **{s: n[s] for s in STATUSES},
                           "findings": sum(1 for c in self.checks if c.status == "failed")},
                "checks": [asdict(c) for c in self.checks],
                "seconds": round(self.seconds, 3), **self.extra}


def summary_md(s: dict) -> str:
    c = s["counts"]
    verdict = {"failed": "**FAILED**", "passed": "passed", "skipped": "skipped"}[s["verdict"]]
    lines = [f"### vmfuzz {s['command']}: {verdict} on `{s['target']}`", ""]
    if s["headline"]:
        lines += [s["headline"], ""]
    parts = [f"{c[k]} {k}" for k in STATUSES if c[k] or k in ("held", "failed")]
    lines += [f"{c['checks']} check(s): " + ", ".join(parts), ""]
    if s["checks"]:
        lines += ["| check | status | detail |", "|---|---|---|"]
        for k in s["checks"]:
            detail = k["detail"].replace("|", "\\|").replace("\n", " ")
            repro = f" (repro: `{k['repro']}`)" if k["repro"] else ""
            lines.append(f"| {k['name']} | {k['status']} | {detail}{repro} |")
    return "\n".join(lines) + "\n"


def junit_xml(s: dict) -> str:
    c = s["counts"]
    suite = quoteattr(f"vmfuzz.{s['command']}.{s['target']}")
    out = ['<?xml version="1.0" encoding="utf-8"?>',
           f'<testsuites name="vmfuzz" tests="{c["checks"]}" failures="{c["failed"]}" errors="{c["error"]}">',
           f'  <testsuite name={suite} tests="{c["checks"]}" failures="{c["failed"]}" errors="{c["error"]}" '
           f'skipped="{c["skipped"]}" time="{s["seconds"]:.3f}">']
    for k in s["checks"]:
        out.append(f'    <testcase classname={suite} name={quoteattr(k["name"])} time="{k["seconds"]:.3f}">')
        text = k["detail"] + (f"\nrepro: {k['repro']}" if k["repro"] else "")
        if k["status"] == "failed":
            out.append(f'      <failure type={quoteattr(k["kind"] or "property")} message={quoteattr(k["detail"])}>'
                       f'{escape(text)}</failure>')
        elif k["status"] == "error":
            out.append(f'      <error message={quoteattr(k["detail"])}>{escape(text)}</error>')
        elif k["status"] == "skipped":
            out.append(f'      <skipped message={quoteattr(k["detail"])}/>')
        out.append("    </testcase>")
    out += ["  </testsuite>", "</testsuites>"]
    return "\n".join(out) + "\n"


def write(summary: CommandSummary, report_dir: Path) -> dict:
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    s = summary.as_dict()
    (report_dir / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    (report_dir / "summary.md").write_text(summary_md(s))
    (report_dir / "junit.xml").write_text(junit_xml(s))
    return s
