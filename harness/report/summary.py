"""The files a command leaves in its report directory, and where that directory is.

summary.json is the record (other tools read it); summary.md is for a PR
comment; junit.xml is for CI test tabs (same counts as summary.json);
report.html, for ``run`` and ``gate``, is for a person (see ``html``).

``run`` and ``gate`` summarize a search (``build_summary``). Every other
command (replay, minimize, selftest, verify-policy, exhaustive, bisect, a
skipped gate) builds a ``CommandSummary`` -- one ``Check`` per thing it
decided -- so a CI job that uploads the report folder and a JUnit tab works
for every command the same way.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vmfuzz.harness.model.summary_file import CommandSummary as CommandShape
from vmfuzz.harness.model.summary_file import RunSummary, SummaryError, conform
from vmfuzz.harness.model.known_file import REPRODUCES
from vmfuzz.harness.model.verdict import Kind, Verdict
from vmfuzz.harness.report.findings import finding_record, findings_and_known, new_groups
from vmfuzz.harness.report.junit import command_junit, run_junit
from vmfuzz.harness.report.decide import fails  # noqa: F401 - where callers have found it
from vmfuzz.harness.report.repro_paths import relative_to_folder
from vmfuzz.harness.properties import sub_checks
from vmfuzz.harness.report.summary_md import MD_HEADLINE, summary_md  # noqa: F401 - re-exported: merge, tests
from vmfuzz.harness.report.unchecked import HELD_IN_PART, LANE_LOST, UNCHECKED, status as _status, time_cap


def default_report_dir() -> Path:
    """reports/<UTC timestamp>-<pid>: two runs started in the same second never share one."""
    base = Path("reports") / (dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _checked(summary: dict, shape: type) -> str:
    """summary.json's text. A shape the schema does not declare is a harness bug: said on
    stderr, and the file is written all the same, since what the run found must not be lost."""
    try:
        conform(summary, shape)
    except SummaryError as exc:
        import sys
        print(f"vmfuzz: warning: {exc}", file=sys.stderr)
    return json.dumps(summary, indent=2) + "\n"


def write_files(report_dir: Path, files: dict[str, str]) -> None:
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        # UTF-8 whatever the locale; a lone surrogate from a hostile repro becomes U+FFFD
        write_whole(report_dir / name, text.encode("utf-8", errors="replace"))


def write_whole(path: Path, body: bytes) -> None:
    """``body`` at ``path``, whole or not at all: CI parsing a summary must never meet half
    of one (a full disk, a file-size limit). On failure neither the temporary nor
    ``path`` is left, and the OSError goes to the caller, who writes to the fallback."""
    import os
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        path.unlink(missing_ok=True)  # an older, other run's file here would read as this run's
        raise


MARGIN_BUCKETS = ("< -1000", "-1000..-101", "-100..-1", "0", "1..100", "> 100")
MARGIN_PATHS = ("reuse", "fallback", "arithmetic")


def margin_bucket(m: float) -> str | None:
    """Cells past the buffer's end a case needed (negative: room to spare)."""
    if math.isinf(m):
        return None
    if m < -1000:
        return MARGIN_BUCKETS[0]
    if m <= -101:
        return MARGIN_BUCKETS[1]
    if m < 0:
        return MARGIN_BUCKETS[2]
    if m == 0:
        return MARGIN_BUCKETS[3]
    return MARGIN_BUCKETS[4] if m <= 100 else MARGIN_BUCKETS[5]


def build_summary(outcome, *, signal_code: int | None = None) -> dict:
    """summary.json's record of ``outcome``, its ``verdict`` decided here, once, before any report is
    written (``signal_code``: the exit code of the signal that interrupted the run, if one did)."""
    from vmfuzz.harness.report.decide import decide, with_verdict
    s = _record(outcome)
    return with_verdict(s, decide(s, signal_code=signal_code))


def _record(outcome) -> dict:
    plan = outcome.plan
    props, classes, margins = [], Counter(), Counter()
    by_path = {p: Counter() for p in MARGIN_PATHS}
    for r in outcome.results:
        classes.update(r.classes)
        margins.update(b for b in map(margin_bucket, r.margins) if b)
        for path, m in r.path_margins:
            if margin_bucket(m):
                by_path[path][margin_bucket(m)] += 1
        props.append({
            "name": r.prop, "status": _status(r), "examples": r.examples, "planned": r.planned, "rounds": r.rounds,
            "seconds": round(r.seconds, 3),
            "max_margin": None if math.isinf(r.max_margin) else r.max_margin,
            "classes": dict(sorted(r.classes.items())), "bs_over_max_bs": dict(r.bs_ratio),
            "findings": [finding_record(f, outcome) for f in r.findings],
            "deep_cases": list(getattr(r, "corpus", [])),
            "deep_seconds": round(getattr(r, "corpus_seconds", 0.0), 3),
            # one entry per bound step searched (summary "bounds"); one step: all its time
            "seconds_by_bound_step": [round(x, 3) for x in getattr(r, "step_seconds", [])] or [round(r.seconds, 3)],
            **({"shared_run": r.shared_run} if getattr(r, "shared_run", None) else {}),
            **({"not_driven": r.not_driven} if r.not_driven else {}),
            **({"out_of_step": r.out_of_step} if getattr(r, "out_of_step", None) else {}),
            **({"sub_checks": checks} if (checks := sub_checks(r.prop, r.classes)) else {}),
        })
    replays = [{"repro": str(o.path), "property": o.property, "recorded_target": o.recorded_target,
                "source": o.source, "status": o.status, "detail": o.detail, "still_fails_on_recorded": o.teeth,
                "finding": str(o.finding.path) if o.finding else None} for o in outcome.replays]
    findings, known = findings_and_known(outcome)
    gate = getattr(outcome, "gate", None)
    return {
        "command": plan.command, "target": outcome.target_name, "profile": plan.profile.name,
        "interrupted": outcome.interrupted,
        "seed": plan.seed, "max_examples": plan.max_examples, "time_budget": plan.time_budget,
        "workers": plan.workers, "isolation": plan.isolate, "device": plan.device,
        "shard": getattr(plan, "shard", None),
        "selection": list(getattr(plan, "selection", ()) or plan.properties),
        "versions": outcome.versions, "started": outcome.started,
        "counts": {**status_counts(props, replays, gate),
                   "replays": len(replays),
                   "replays_failed": sum(o["status"] == "failed" for o in replays),
                   "findings": len(findings), "groups": len(getattr(outcome, "groups", [])),
                   "known": sum(k["status"] == REPRODUCES for k in known),
                   # what decides the exit: groups no known entry names, known entries failing differently
                   "new_groups": new_groups(outcome)},
        "fail_on_known": bool(getattr(plan, "fail_on_known", False)),
        # one per cause (vmfuzz.harness.engine.campaign.groups), first: what to read before the findings
        "groups": list(getattr(outcome, "groups", [])),
        "properties": props,
        "boundary_classes": dict(sorted(classes.items())),
        # production shapes run once per property before the search (vmfuzz.harness.engine.search.deep_corpus)
        "deep_boundary_corpus": {"cases": list(dict.fromkeys(c for p in props for c in p["deep_cases"])),
                                 "runs": sum(len(p["deep_cases"]) for p in props),
                                 # a shared group's time is split among its members: the sum is the whole
                                 "seconds": round(sum(p["deep_seconds"] for p in props), 3),
                                 "sized_from": getattr(outcome, "shape_constants", None)},
        "overflow_margin": {b: margins[b] for b in MARGIN_BUCKETS},
        # the same examples split by the path their batch took: > 0 overflows only on reuse
        "overflow_margin_by_path": {p: {b: by_path[p][b] for b in MARGIN_BUCKETS} for p in MARGIN_PATHS},
        "findings": findings,
        "replays": replays,
        # real defects of the code under test, upstream's to fix (known/): findings of run, listed by gate
        "known_findings": known,
        "deployment": outcome.deployment,
        "gate": gate,
        "timings": {"replay_seconds": round(outcome.replay_seconds, 3),
                    "search_seconds": round(outcome.search_seconds, 3),
                    "total_seconds": round(outcome.seconds, 3)},
        "time_cap": time_cap(outcome),  # the pr profile's hang guard and how close the run came to it
        # the bounds searched (in order, a nightly widens them), the largest
        # case shapes reached, and the kernel's share of the search
        "bounds": getattr(outcome, "bounds_used", []),
        "reached": _reached(outcome.results),
        "kernel": getattr(outcome, "kernel", None),
        "warnings": list(getattr(outcome, "warnings", [])),
        "history": list(getattr(outcome, "history", [])),  # a nightly's last nights, this one last
        "unfinished": list(getattr(outcome, "unfinished", [])),  # what it did not finish: exit 3
    }


def status_counts(props: list[dict], replays: list[dict], gate: dict | None) -> dict:
    """The counts read from the properties' statuses (a run's, or ``merge``'s joined ones). "held"
    is a plain held only; "could_not_check" counts every thing the run could not check: a property
    the clock stopped, a changed line of the gate's, a saved repro that could not be replayed."""
    from vmfuzz.harness.report.replays import unreplayed
    status = Counter(p["status"] for p in props)
    return {"properties": len(props), "held": status["held"], "held_in_part": status[HELD_IN_PART],
            "failed": status["failed"], "skipped": status["skipped"] + status["not driven"],
            "not_driven": status["not driven"], "out_of_step": status["out of step"],
            "lane_lost": status[LANE_LOST],
            "could_not_check": status[UNCHECKED] + len((gate or {}).get("could_not_check") or [])
            + len(unreplayed(replays)),
            "examples": sum(p["examples"] for p in props)}


def _reached(results) -> dict:
    out: dict = {}
    for r in results:
        for k, v in getattr(r, "reached", {}).items():
            out[k] = max(out.get(k, v), v)
    return out


def write_reports(outcome, report_dir: Path) -> dict:
    """The reports of ``outcome`` (its verdict decided first, ``build_summary``) written into ``report_dir``."""
    return write_summary(build_summary(outcome), report_dir)


def write_summary(s: dict, report_dir: Path) -> dict:
    """summary.json, summary.md, junit.xml and report.html of the run summary ``s``, every one reading
    the verdict ``s`` holds."""
    from vmfuzz.harness.report.html import report_html

    # on disk, the folder's own repros by their place in it; the caller prints the paths as they are
    here = relative_to_folder(s, report_dir)
    write_files(report_dir, {"summary.json": _checked(here, RunSummary), "summary.md": summary_md(here),
                             "junit.xml": run_junit(here), "report.html": report_html(here, report_dir)})
    return s


#: "caught" is selftest's pass: the known-bad variant was found.
#: "known": it failed, and the failure is a known entry's (known/): listed, never a finding
STATUSES = ("held", "caught", "failed", "known", "skipped", "error")


@dataclass
class Check:
    """One testcase: a property replayed, a variant caught, a configuration checked, ..."""

    name: str
    status: str  # one of STATUSES
    detail: str = ""
    kind: str = ""  # for a failure: property / target-crash / ...
    repro: str | None = None
    seconds: float = 0.0
    #: a failure's typed origin (vmfuzz.harness.model.origin), as summary.json carries it
    origin: dict | None = None

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
    #: the verdict of a ``run`` or ``gate`` that ended before its search (the code under test did not
    #: load): the same record a search's reports read (``vmfuzz.harness.model.verdict``)
    outcome: Verdict | None = None

    @property
    def failed(self) -> bool:
        return any(c.status == "failed" for c in self.checks)

    def as_dict(self) -> dict:
        n = Counter(c.status for c in self.checks)
        # a check that could not be made (an error) is never a pass
        verdict = ("failed" if self.failed else "could not check" if n["error"]
                   else "skipped" if self.checks and n["skipped"] == len(self.checks) else "passed")
        said = ({"verdict_kind": self.outcome.kind.value, "exit_code": self.outcome.exit_code}
                if self.outcome is not None else {})
        return {"command": self.command, "target": self.target, "started": self.started,
                "verdict": verdict, **said,
                "headline": self.headline,
                "counts": {"checks": len(self.checks), **{s: n[s] for s in STATUSES},
                           "findings": sum(1 for c in self.checks if c.status == "failed")},
                "checks": [asdict(c) for c in self.checks],
                "seconds": round(self.seconds, 3), **self.extra}


def command_md(s: dict) -> str:
    c = s["counts"]
    verdict = ({"failed": "**FAILED**", "passed": "passed", "skipped": "skipped",
                "could not check": "**COULD NOT CHECK**"}[s["verdict"]] if "verdict_kind" not in s
               else MD_HEADLINE[Kind(s["verdict_kind"])])
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


def write_command_summary(summary: CommandSummary, report_dir: Path) -> dict:
    s = summary.as_dict()
    # rendered before the shape is checked against the model: the check is the last step down
    md, junit = command_md(s), command_junit(s)
    files = {"summary.json": _checked(s, CommandShape), "summary.md": md, "junit.xml": junit}
    if s["command"] in ("run", "gate"):  # a person opens report.html of every run, whatever ended it
        from vmfuzz.harness.report.html import command_html
        files["report.html"] = command_html(s)
    write_files(report_dir, files)
    return s
