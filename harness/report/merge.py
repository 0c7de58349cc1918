"""``vmfuzz merge``: the reports of a sharded run (``--shard K/N``) joined into one.

Each shard's summary.json is read back and joined: properties side by side (a
property two shards both ran is failed if either failed, with their examples
and seconds added), findings, replays and known findings listed once, counts
recomputed from the joined lists. The merged summary is written with the same
writers as a single run's (summary.md, junit.xml, report.html), so CI reads a
sharded nightly as it reads one run.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from harness.report.summary import MARGIN_BUCKETS, run_junit, summary_md, write_files

#: worst first: the joined status of a property two shards both ran
STATUS_ORDER = ("failed", "out of step", "could not check", "held", "not driven", "skipped")


class MergeError(Exception):
    pass


def read_summary(folder: Path) -> dict:
    path = Path(folder) / "summary.json"
    try:
        s = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MergeError(f"{folder}: no summary.json (not a vmfuzz report folder)") from None
    except (OSError, ValueError) as exc:
        raise MergeError(f"{path}: cannot be read: {exc}") from None
    if not isinstance(s, dict) or s.get("command") not in ("run", "gate") or "properties" not in s:
        raise MergeError(f"{path}: not the summary of a run or gate (vmfuzz merge joins shards of one run)")
    return s


def _join_property(a: dict, b: dict) -> dict:
    worst = min(a["status"], b["status"], key=STATUS_ORDER.index)
    out = {**a, "status": worst, "examples": a["examples"] + b["examples"],
           "planned": a.get("planned", 0) + b.get("planned", 0),
           "seconds": round(a["seconds"] + b["seconds"], 3), "findings": a["findings"] + b["findings"]}
    out["classes"] = dict(Counter(a.get("classes", {})) + Counter(b.get("classes", {})))
    return out


def _once(items: list[dict], key: str) -> list[dict]:
    seen, out = set(), []
    for it in items:
        if it.get(key) not in seen:
            seen.add(it.get(key))
            out.append(it)
    return out


def merge_summaries(summaries: list[dict]) -> dict:
    targets = {s["target"] for s in summaries}
    if len(targets) > 1:
        raise MergeError(f"the folders ran different targets ({', '.join(sorted(targets))}): not shards of one run")
    props: dict[str, dict] = {}
    for s in summaries:
        for p in s["properties"]:
            props[p["name"]] = _join_property(props[p["name"]], p) if p["name"] in props else p
    first = summaries[0]
    replays = _once([r for s in summaries for r in s.get("replays", [])], "repro")
    known = _once([k for s in summaries for k in s.get("known_findings", [])], "name")
    findings = _once([f for s in summaries for f in s.get("findings", [])], "repro")
    status = Counter(p["status"] for p in props.values())
    merged = {**first, "shard": None, "shards": [s.get("shard") for s in summaries],
              "interrupted": any(s.get("interrupted") for s in summaries),
              "properties": list(props.values()), "replays": replays, "known_findings": known,
              "findings": findings,
              "boundary_classes": dict(sum((Counter(s.get("boundary_classes", {})) for s in summaries), Counter())),
              "overflow_margin": {b: sum(s.get("overflow_margin", {}).get(b, 0) for s in summaries)
                                  for b in MARGIN_BUCKETS},
              "warnings": [w for s in summaries for w in s.get("warnings", [])],
              "timings": {"replay_seconds": sum(s["timings"]["replay_seconds"] for s in summaries),
                          "search_seconds": sum(s["timings"]["search_seconds"] for s in summaries),
                          # the shards ran side by side: the merged run took as long as the slowest
                          "total_seconds": max(s["timings"]["total_seconds"] for s in summaries)}}
    merged["counts"] = {
        "properties": len(props), "held": status["held"], "failed": status["failed"],
        "skipped": status["skipped"] + status["not driven"], "not_driven": status["not driven"],
        "out_of_step": status["out of step"], "could_not_check": status["could not check"],
        "examples": sum(p["examples"] for p in props.values()),
        "replays": len(replays), "replays_failed": sum(r["status"] == "failed" for r in replays),
        "findings": len(findings), "known": sum(k["status"] == "reproduces" for k in known)}
    return merged


def write_merged(merged: dict, report_dir: Path) -> None:
    from harness.report.html import report_html
    write_files(report_dir, {"summary.json": json.dumps(merged, indent=2) + "\n", "summary.md": summary_md(merged),
                             "junit.xml": run_junit(merged), "report.html": report_html(merged)})
