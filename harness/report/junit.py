"""junit.xml: the one writer every command's report goes through, and the testcases of each summary.

A property (or a check) is one testcase; a finding fails it unless it is a known
one (upstream's defect, read from its origin), which is listed in a
``vmfuzz.known`` suite instead and fails only with ``--fail-on-known``.

CI test tabs read it, so it must always be valid XML: characters XML 1.0
cannot hold at all (a hostile repro's detail may carry them) are replaced,
never written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from xml.sax.saxutils import escape as _escape, quoteattr as _quoteattr

from vmfuzz.harness.model.verdict import Kind
from vmfuzz.harness.report.unchecked import how_far

#: characters XML 1.0 cannot hold at all, even escaped
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(s) -> str:
    return _NOT_XML.sub("\ufffd", str(s))


def escape(s) -> str:
    return _escape(xml_text(s))


def quoteattr(s) -> str:
    return _quoteattr(xml_text(s))


@dataclass
class Case:
    """One testcase. ``outcome`` is None (passed), "failure", "error" or "skipped"."""

    name: str
    seconds: float = 0.0
    outcome: str | None = None
    kind: str = ""
    message: str = ""
    text: str = ""


@dataclass
class Suite:
    name: str
    cases: list[Case] = field(default_factory=list)
    seconds: float | None = None

    def count(self, outcome: str) -> int:
        return sum(c.outcome == outcome for c in self.cases)


def _case(classname: str, c: Case) -> list[str]:
    out = [f'    <testcase classname={quoteattr(classname)} name={quoteattr(c.name)} time="{c.seconds:.3f}">']
    if c.outcome == "failure":
        kind = f" type={quoteattr(c.kind)}" if c.kind else ""
        out.append(f"      <failure{kind} message={quoteattr(c.message)}>{escape(c.text)}</failure>"
                   if c.text else f"      <failure{kind} message={quoteattr(c.message)}/>")
    elif c.outcome == "error":
        out.append(f"      <error message={quoteattr(c.message)}>{escape(c.text)}</error>")
    elif c.outcome == "skipped":
        out.append(f"      <skipped message={quoteattr(c.message)}/>")
    out.append("    </testcase>")
    return out


def junit_xml(suites: list[Suite]) -> str:
    total = sum(len(s.cases) for s in suites)
    failures = sum(s.count("failure") for s in suites)
    errors = sum(s.count("error") for s in suites)
    out = ['<?xml version="1.0" encoding="utf-8"?>',
           f'<testsuites name="vmfuzz" tests="{total}" failures="{failures}" errors="{errors}">']
    for s in suites:
        seconds = s.seconds if s.seconds is not None else sum(c.seconds for c in s.cases)
        out.append(f'  <testsuite name={quoteattr(s.name)} tests="{len(s.cases)}" failures="{s.count("failure")}" '
                   f'errors="{s.count("error")}" skipped="{s.count("skipped")}" time="{seconds:.3f}">')
        for c in s.cases:
            out += _case(s.name, c)
        out.append("  </testsuite>")
    out.append("</testsuites>")
    return "\n".join(out) + "\n"


def run_junit(s: dict) -> str:
    from vmfuzz.harness.model.known_file import DIFFERENT, REPRODUCES
    from vmfuzz.harness.report.replays import replay_outcome
    suite = Suite("vmfuzz." + s["target"])
    for p in s["properties"]:
        case = Case(p["name"], p["seconds"])
        new = [f for f in p["findings"] if not f.get("known") or s.get("fail_on_known")]
        met = _known_met(p)
        if (p["status"] == "failed" and not new) or (p["status"] == "held" and met):
            # only upstream's known defects (a finding, or examples the search passed over): not failed,
            # but never a plain pass either (a CI tab shows why)
            case.outcome = "skipped"
            case.message = "known finding(s): " + ", ".join(sorted({f["known"] for f in p["findings"]} | met))
        elif p["status"] == "failed":
            f = new[0]
            case.outcome, case.kind, case.message = "failure", f["kind"], f["detail"]
            case.text = "\n".join(f"{x['kind']}: {x['detail']}\nrepro: {x['repro']}" for x in p["findings"])
        elif p["status"] == "could not check":
            case.outcome, case.message = "error", f"could not check: the time ran out at {how_far(p)}"
        elif p["status"] == "skipped":
            case.outcome, case.message = "skipped", "no example ran"
        elif p["status"] == "not driven":
            case.outcome, case.message = "skipped", "not driven: " + p["not_driven"]
        elif p["status"] == "out of step":
            case.outcome, case.message = "error", "vmfuzz is out of step with the target: " + p["out_of_step"]
        elif p["status"] == "lane lost":
            case.outcome, case.message = "error", "could not check: " + (p.get("out_of_step") or "its search lane died")
        elif p["status"] == "held in part":
            # held on what ran, but a promise was not kept: never a plain pass
            gaps = {k: v for k, v in (p.get("sub_checks") or {}).items() if v != "done"}
            case.outcome = "error"
            case.message = "could not check: held in part: " + "; ".join(f"sub-check {k}: {v}" for k, v in gaps.items())
        suite.cases.append(case)
    suites = [suite]
    if s.get("known_findings"):
        suites.append(Suite("vmfuzz.known", [
            Case(k["name"], outcome="failure" if k["status"] == DIFFERENT or (
                k["status"] == REPRODUCES and s.get("fail_on_known")) else _known_outcome(k["status"]),
                 kind="known", message=f"{k['status']}: {k['reason']}", text=k["detail"])
            for k in s["known_findings"]]))
    if (s.get("gate") or {}).get("lines"):
        from vmfuzz.harness.report.terminal import changed_line_rows
        stuck = s["gate"].get("could_not_check") or []
        suites.append(Suite("vmfuzz.gate.changed-lines", [
            Case(path, outcome=None if verdict == "exercised" else
                 ("error" if any(line.startswith(path) for line in stuck) else "skipped"),
                 message=detail if verdict == "exercised" else f"{verdict}: {detail}")
            for path, verdict, detail in changed_line_rows(s["gate"])]))
    if s["replays"]:
        suites.append(Suite("vmfuzz.replays", [
            Case(r["repro"], outcome=replay_outcome(r), message=r["detail"] or "")
            for r in s["replays"]]))
    # last: the run's verdict, the one every report reads (a CI tab's pass/fail is its exit code)
    return junit_xml(suites + verdict_suite(s))


#: junit.xml's outcome of the run's verdict testcase, for each verdict: every kind. A CI tab that
#: reads only pass/fail reads the exit code: exit 0 passes, exit 1 fails, exit 3 (and a signal) is an error
JUNIT_OUTCOME = {
    Kind.HELD: None, Kind.KNOWN: None, Kind.NEW_FINDING: "failure",
    Kind.HELD_IN_PART: "error", Kind.COULD_NOT_CHECK: "error", Kind.NEEDS_GPU: "error", Kind.OUT_OF_STEP: "error",
    Kind.CANNOT_LOAD: "error", Kind.LANE_LOST: "error", Kind.INTERRUPTED: "error",
}


def verdict_case(v) -> Case:
    """The run's verdict (``vmfuzz.harness.model.verdict``) as one testcase, named by its headline."""
    return Case("verdict", outcome=JUNIT_OUTCOME[v.kind], kind=v.kind.value,
                message=f"{v.headline}: {v.why}" if v.why else v.headline)


def verdict_suite(s: dict) -> list[Suite]:
    """The verdict's suite; none for a fragment of a summary (no verdict, and no counts to decide one from)."""
    from vmfuzz.harness.report.decide import verdict_of
    if not s.get("verdict") and "counts" not in s:
        return []
    return [Suite("vmfuzz.verdict", [verdict_case(verdict_of(s))])]


#: the class a search records where a property met a known entry (``known finding NAME``, or one part
#: of a case's ``PART: known finding NAME``)
_KNOWN_CLASS = re.compile(r"(?:^|: )known finding (\S+)$")


def _known_met(p: dict) -> set[str]:
    """The known entries a property's search met and passed over, read from its classes."""
    return {m.group(1) for c in p.get("classes") or {} for m in [_KNOWN_CLASS.search(c)] if m}


def _known_outcome(status: str) -> str | None:
    """A known defect that reproduces, or one not checked, is shown skipped with its entry's reason: it
    held nothing. One that no longer reproduces passes."""
    from vmfuzz.harness.model.known_file import REPRODUCES, UNCHECKED
    return "skipped" if status in (REPRODUCES, UNCHECKED) else None


def command_junit(s: dict) -> str:
    outcome = {"failed": "failure", "error": "error", "skipped": "skipped"}
    suite = Suite(f"vmfuzz.{s['command']}.{s['target']}", seconds=s["seconds"])
    for k in s["checks"]:
        text = k["detail"] + (f"\nrepro: {k['repro']}" if k["repro"] else "")
        suite.cases.append(Case(k["name"], k["seconds"], outcome.get(k["status"]),
                                (k["kind"] or "property") if k["status"] == "failed" else "", k["detail"], text))
    return junit_xml([suite])
