"""The four files a run leaves in its report directory.

summary.json is the record (other tools read it); summary.md is for a PR
comment; junit.xml is for CI test tabs (one testcase per property, same counts
as summary.json); report.html is for a person (see ``report_html``).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
import re
from xml.sax.saxutils import escape as _escape, quoteattr as _quoteattr

#: characters XML 1.0 cannot hold at all, even escaped (a repro's detail may carry them)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(s) -> str:
    return _NOT_XML.sub("\ufffd", str(s))


def escape(s) -> str:
    return _escape(_xml_text(s))


def quoteattr(s) -> str:
    return _quoteattr(_xml_text(s))

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


def _finding(f) -> dict:
    return {"property": f.prop, "kind": f.kind, "detail": f.detail, "repro": str(f.path)}


def _status(res) -> str:
    if res.findings:
        return "failed"
    if res.not_driven:
        return "not driven"
    return "skipped" if res.skipped or res.examples == 0 else "held"


def build_summary(outcome) -> dict:
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
            "name": r.prop, "status": _status(r), "examples": r.examples, "rounds": r.rounds,
            "seconds": round(r.seconds, 3),
            "max_margin": None if math.isinf(r.max_margin) else r.max_margin,
            "classes": dict(sorted(r.classes.items())), "bs_over_max_bs": dict(r.bs_ratio),
            "findings": [_finding(f) for f in r.findings],
            **({"not_driven": r.not_driven} if r.not_driven else {}),
        })
    replays = [{"repro": str(o.path), "property": o.property, "recorded_target": o.recorded_target,
                "source": o.source, "status": o.status, "detail": o.detail, "still_fails_on_recorded": o.teeth,
                "finding": str(o.finding.path) if o.finding else None} for o in outcome.replays]
    findings = [_finding(f) for r in outcome.results for f in r.findings]
    findings += [_finding(o.finding) for o in outcome.replays if o.finding]
    status = Counter(p["status"] for p in props)
    return {
        "command": plan.command, "target": outcome.target_name, "profile": plan.profile.name,
        "interrupted": outcome.interrupted,
        "seed": plan.seed, "max_examples": plan.max_examples, "time_budget": plan.time_budget,
        "workers": plan.workers, "isolation": plan.isolate, "device": plan.device,
        "versions": outcome.versions, "started": outcome.started,
        "counts": {"properties": len(props), "held": status["held"], "failed": status["failed"],
                   "skipped": status["skipped"] + status["not driven"], "not_driven": status["not driven"],
                   "examples": sum(p["examples"] for p in props),
                   "replays": len(replays), "replays_failed": sum(o["status"] != "held" for o in replays),
                   "findings": len(findings)},
        "properties": props,
        "boundary_classes": dict(sorted(classes.items())),
        "overflow_margin": {b: margins[b] for b in MARGIN_BUCKETS},
        # the same examples split by the path their batch took: > 0 overflows only on reuse
        "overflow_margin_by_path": {p: {b: by_path[p][b] for b in MARGIN_BUCKETS} for p in MARGIN_PATHS},
        "findings": findings,
        "replays": replays,
        "deployment": outcome.deployment,
        "gate": getattr(outcome, "gate", None),
        "timings": {"replay_seconds": round(outcome.replay_seconds, 3),
                    "search_seconds": round(outcome.search_seconds, 3),
                    "total_seconds": round(outcome.seconds, 3)},
        # Issue 11: the bounds searched (in order, a nightly widens them), the
        # largest case shapes reached, and the kernel's share of the search.
        "bounds": getattr(outcome, "bounds_used", []),
        "reached": _reached(outcome.results),
        "kernel": getattr(outcome, "kernel", None),
    }


def _reached(results) -> dict:
    out: dict = {}
    for r in results:
        for k, v in getattr(r, "reached", {}).items():
            out[k] = max(out.get(k, v), v)
    return out


def summary_md(s: dict) -> str:
    c = s["counts"]
    dep_failed = any(((s.get("deployment") or {}).get(p) or {}).get("ok") is False for p in ("routing", "allocation"))
    verdict = "**FAILED**" if c["findings"] or c["replays_failed"] or dep_failed or s.get("interrupted") else "passed"
    if s.get("interrupted") and not c["findings"] and not c["replays_failed"]:
        verdict = "**INTERRUPTED**"
    lines = [f"### vmfuzz {s['command']}: {verdict} on `{s['target']}`", "",
             f"profile `{s['profile']}`, seed `{s['seed']}`, {c['examples']} examples, "
             f"{c['held']} held / {c['failed']} failed / {c['skipped']} skipped, "
             f"{s['timings']['total_seconds']:.0f}s", ""]
    if s.get("deployment"):
        d = s["deployment"]
        lines += [f"Deployment {d['label']}: **{'can' if d['can_write_out_of_range'] else 'cannot'} "
                  f"write out of range** ({d['why']})", ""]
        for part in ("routing", "allocation"):
            if d.get(part):
                state = {True: "held", False: "**FAILED**", None: "not checked"}[d[part]["ok"]]
                lines += [f"- {part}: {state}: {d[part]['why']}"]
        lines += [""] if any(d.get(p) for p in ("routing", "allocation")) else []
    if s.get("gate"):
        from harness.surface import gate_line
        line = gate_line(s["gate"], quote="`")
        lines += [f"G{line[1:]} (of {len(s['gate']['changed'])} changed)", ""]
    lines += ["| property | status | examples | seconds |", "|---|---|---:|---:|"]
    lines += [f"| {p['name']} | {p['status']} | {p['examples']} | {p['seconds']:.1f} |" for p in s["properties"]]
    if s["replays"]:
        lines += ["", f"Replayed {c['replays']} saved repro(s) first, {c['replays_failed']} did not hold."]
    if s["findings"]:
        lines += ["", "#### Findings", ""]
        lines += [f"- `{f['property']}` ({f['kind']}): {f['detail']}  \n  repro: `{f['repro']}` "
                  f"(`vmfuzz replay {f['repro']}`)" for f in s["findings"]]
    if s.get("bounds"):
        widest = s["bounds"][-1]
        lines += ["", f"Bounds ({len(s['bounds'])} step(s), widest): "
                  + ", ".join(f"{k} {v}" for k, v in widest.items())
                  + ("; reached " + ", ".join(f"{k} {v}" for k, v in s["reached"].items()) if s.get("reached") else "")]
    if s.get("kernel") and s["kernel"].get("kernel_share") is not None:
        k = s["kernel"]
        lines += ["", f"Kernel launches: {k['launches']}, {k['kernel_seconds']:.1f}s inside them = "
                  f"{100 * k['kernel_share']:.0f}% of the search ({100 * (1 - k['kernel_share']):.0f}% harness overhead)"]
    versions = ", ".join(f"{k} {v}" for k, v in s["versions"].items())
    lines += ["", f"<sub>{versions}</sub>", ""]
    return "\n".join(lines)


def junit_xml(s: dict) -> str:
    c = s["counts"]
    suite_time = sum(p["seconds"] for p in s["properties"])
    out = ['<?xml version="1.0" encoding="utf-8"?>',
           f'<testsuites name="vmfuzz" tests="{c["properties"] + c["replays"]}" '
           f'failures="{c["failed"] + c["replays_failed"]}">',
           f'  <testsuite name={quoteattr("vmfuzz." + s["target"])} tests="{c["properties"]}" '
           f'failures="{c["failed"]}" skipped="{c["skipped"]}" errors="0" time="{suite_time:.3f}">']
    for p in s["properties"]:
        out.append(f'    <testcase classname={quoteattr("vmfuzz." + s["target"])} name={quoteattr(p["name"])} '
                   f'time="{p["seconds"]:.3f}">')
        if p["status"] == "failed":
            f = p["findings"][0]
            text = "\n".join(f"{x['kind']}: {x['detail']}\nrepro: {x['repro']}" for x in p["findings"])
            out.append(f'      <failure type={quoteattr(f["kind"])} message={quoteattr(f["detail"])}>'
                       f'{escape(text)}</failure>')
        elif p["status"] == "skipped":
            out.append('      <skipped message="time budget spent before this property ran"/>')
        elif p["status"] == "not driven":
            out.append(f'      <skipped message={quoteattr("not driven: " + p["not_driven"])}/>')
        out.append("    </testcase>")
    out.append("  </testsuite>")
    if s["replays"]:
        out.append(f'  <testsuite name="vmfuzz.replays" tests="{c["replays"]}" failures="{c["replays_failed"]}">')
        for r in s["replays"]:
            out.append(f'    <testcase classname="vmfuzz.replays" name={quoteattr(r["repro"])}>')
            if r["status"] != "held":
                out.append(f'      <failure message={quoteattr(r["detail"])}/>')
            out.append("    </testcase>")
        out.append("  </testsuite>")
    out.append("</testsuites>")
    return "\n".join(out) + "\n"


def write_reports(outcome, report_dir: Path) -> dict:
    from harness.report_html import report_html

    report_dir.mkdir(parents=True, exist_ok=True)
    s = build_summary(outcome)
    for name, text in (("summary.json", json.dumps(s, indent=2) + "\n"), ("summary.md", summary_md(s)),
                       ("junit.xml", junit_xml(s)), ("report.html", report_html(s))):
        # UTF-8 whatever the locale; a lone surrogate from a hostile repro becomes U+FFFD
        (report_dir / name).write_text(text, encoding="utf-8", errors="replace")
    return s
