"""junit.xml: the one writer every command's report goes through.

CI test tabs read it, so it must always be valid XML: characters XML 1.0
cannot hold at all (a hostile repro's detail may carry them) are replaced,
never written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from xml.sax.saxutils import escape as _escape, quoteattr as _quoteattr

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
