"""``vmfuzz merge``: the reports of a sharded run (``--shard K/N``) joined into one.

The folders are checked first: every shard K of one N, each once, all with the
same target, seed, profile, versions, examples per property, device, bounds and
property selection (each summary's ``selection``, the properties the run was asked
for before the split; a summary without one, from an older vmfuzz, is merged on its
property counts with a warning that the selection is unconfirmed), none interrupted and none with a status this code does not
know. Anything else is refused (one
line): a merge that silently dropped a shard, or joined two different runs,
would read as a night on which fewer things failed.

Each shard's findings are copied into the merged folder's ``findings/`` and the
summary's repro paths rewritten relative to the merged folder, so the folder
stands alone (CI uploads it; the shards' folders are gone by then). Then the
summaries are joined: properties side by side (a property two shards both ran
is failed if either failed, with their examples and seconds added), finding
groups by cause (counts added, members and properties joined), findings,
replays and known findings listed once, counts recomputed from the joined
lists, and every number by its meaning (``FIELDS`` names how each field
joins). The merged summary is written with the same writers as a single run's
(summary.md, junit.xml, report.html), so CI reads a sharded nightly as it reads
one run.
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from pathlib import Path

from vmfuzz.harness.report.repro_paths import rewrite
from vmfuzz.harness.model.known_file import DIFFERENT, KNOWN_STATUSES, REPRODUCES
from vmfuzz.harness.report.decide import decide, with_verdict
from vmfuzz.harness.report.summary import (MARGIN_BUCKETS, run_junit, status_counts, summary_md, write_files,
                                           write_whole)

#: worst first: the joined status of a property two shards both ran
STATUS_ORDER = ("failed", "lane lost", "out of step", "could not check", "held in part", "held", "not driven",
                "skipped")
#: the other statuses a run's summary holds (vmfuzz.harness.engine.regression.regressions, vmfuzz.harness.report.summary)
REPLAY_STATUSES = ("held", "failed", "error", "out of step")
SHARD = re.compile(r"^(\d+)/(\d+)$")


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
    if (not isinstance(s, dict) or s.get("command") not in ("run", "gate") or not isinstance(s.get("properties"), list)
            or not all(isinstance(p, dict) for p in s["properties"])):
        raise MergeError(f"{path}: not the summary of a run or gate (vmfuzz merge joins shards of one run)")
    return s


def _unknown_status(s: dict) -> str | None:
    for what, items, name, known in (("property", s["properties"], "name", STATUS_ORDER),
                                      ("replay", s.get("replays", []), "repro", REPLAY_STATUSES),
                                      ("known finding", s.get("known_findings", []), "name", KNOWN_STATUSES)):
        for it in items:
            if it.get("status") not in known:
                return (f"{what} {it.get(name)!r} has status {it.get('status')!r}, which this vmfuzz does not "
                        f"know ({', '.join(known)})")
    return None


#: what every shard of one run shares: (the words for it, how to read it from a summary)
SAME = (("target", lambda s: s.get("target")), ("seed (give every shard the same --seed)", lambda s: s.get("seed")),
        ("profile", lambda s: s.get("profile")),
        ("vmfuzz version", lambda s: (s.get("versions") or {}).get("vmfuzz")),
        ("SGLang version", lambda s: (s.get("versions") or {}).get("sglang")),
        # every version but where it was installed (each runner has its own paths)
        ("versions", lambda s: {k: v for k, v in (s.get("versions") or {}).items() if "path" not in k}),
        ("examples per property (--max-examples)", lambda s: s.get("max_examples")),
        ("device", lambda s: s.get("device")),
        ("bounds (--bounds)", lambda s: (s.get("bounds") or [None])[0]),
        ("--fail-on-known", lambda s: bool(s.get("fail_on_known"))))


def check_shards(shards: list[tuple[Path, dict]]) -> list[tuple[int, int]]:
    """Each folder's (K, N) when the folders are every shard of one finished run; MergeError
    (one line, naming what is missing or wrong) otherwise."""
    split = []
    for folder, s in shards:
        bad = _unknown_status(s)
        if bad:
            raise MergeError(f"{folder}: {bad}")
        m = SHARD.match(str(s.get("shard") or ""))
        if not m:
            raise MergeError(f"{folder}: not a shard (its run had no --shard K/N)")
        if s.get("interrupted"):
            raise MergeError(f"{folder}: shard {s['shard']} was interrupted: its reports cover only what ran; "
                             "run that shard again")
        split.append((int(m.group(1)), int(m.group(2))))
    if len({n for _, n in split}) > 1:
        raise MergeError("the folders split the run differently: "
                         + ", ".join(f"{k}/{n} ({f})" for (k, n), (f, _) in zip(split, shards)))
    for words, read in SAME:
        values = [read(s) for _, s in shards]
        if len(set(map(repr, values))) > 1:
            raise MergeError(f"the shards differ in {words}: "
                             + ", ".join(f"{v} ({f})" for v, (f, _) in zip(values, shards)))
    _same_whole_selection(shards)
    n = split[0][1]
    for k in range(1, n + 1):
        given = [str(f) for (kk, _), (f, _) in zip(split, shards) if kk == k]
        if len(given) > 1:
            raise MergeError(f"shard {k}/{n} is given more than once ({', '.join(given)})")
    missing = [f"{k}/{n}" for k in range(1, n + 1) if k not in {kk for kk, _ in split}]
    if missing:
        raise MergeError(f"shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                         f"{'are' if len(missing) > 1 else 'is'} missing (given: "
                         + ", ".join(f"{k}/{n}" for k, _ in sorted(split)) + ")")
    _same_selection(shards, split, n)
    return split


def relocate(shards: list[tuple[Path, dict]], split: list[tuple[int, int]], report_dir: Path) -> list[dict]:
    """Copies each shard's ``findings/`` into ``report_dir/findings``; returns the summaries with their
    repro paths rewritten to the copies, relative to ``report_dir`` (a name two shards share gets the
    shard's number)."""
    dest = Path(report_dir) / "findings"
    taken: set[str] = set()
    out = []
    for (folder, s), (k, n) in zip(shards, split):
        moved: dict[str, str] = {}
        src = Path(folder) / "findings"
        files = sorted(p for p in src.iterdir() if p.is_file()) if src.is_dir() else []
        for path in files:
            name = path.name if path.name not in taken else f"{path.stem}-shard-{k}-of-{n}{path.suffix}"
            taken.add(name)
            dest.mkdir(parents=True, exist_ok=True)
            write_whole(dest / name, path.read_bytes())
            moved[path.name] = f"findings/{name}"
        out.append(_rewritten(copy.deepcopy(s), moved))
    return out


def _rewritten(s: dict, moved: dict[str, str]) -> dict:
    """Every repro path of ``s`` that names a file of the shard's findings/, as its copy's path."""
    def new(path):
        p = Path(str(path)) if path else None
        return moved.get(p.name, path) if p is not None and p.parent.name == "findings" else path

    return rewrite(s, new)


def _join_property(a: dict, b: dict) -> dict:
    worst = min(a["status"], b["status"], key=STATUS_ORDER.index)
    out = {**a, "status": worst, "examples": a["examples"] + b["examples"],
           "planned": a.get("planned", 0) + b.get("planned", 0),
           "seconds": round(a["seconds"] + b["seconds"], 3), "findings": a["findings"] + b["findings"]}
    out["classes"] = dict(Counter(a.get("classes", {})) + Counter(b.get("classes", {})))
    return out


def group_id(g: dict) -> str:
    """A group's cause: its ``key`` (the origin's cause) where the summary has one, else its signature."""
    return g.get("key") or g["signature"]


def _same_whole_selection(shards: list[tuple[Path, dict]]) -> None:
    """Every shard records the property selection its run was asked for (``selection``): one that
    differs is refused, whatever the counts (shard K of a smaller selection can look like a part
    of a larger one). A summary from a vmfuzz that did not record it is left to ``_same_selection``
    (``selection_unconfirmed`` says so)."""
    known = [(f, s["selection"]) for f, s in shards if s.get("selection") is not None]
    if len({tuple(sel) for _, sel in known}) > 1:
        (fa, a), (fb, b) = known[0], next((f, sel) for f, sel in known if sel != known[0][1])
        only_a, only_b = [p for p in a if p not in b], [p for p in b if p not in a]
        what = "; ".join(part for part in (only_a and f"only {fa} asked for {', '.join(only_a)}",
                                           only_b and f"only {fb} asked for {', '.join(only_b)}") if part)
        raise MergeError("the shards ran different property selections: "
                         + (what or f"{fa} and {fb} list them in a different order")
                         + " (give every shard the same --property)")


def selection_unconfirmed(shards: list[tuple[Path, dict]]) -> str | None:
    """The warning when a shard's summary does not record its run's selection (an older vmfuzz):
    the merge then rests on the shards' property counts, which cannot prove one selection."""
    old = [str(f) for f, s in shards if s.get("selection") is None]
    if not old:
        return None
    return (f"cannot confirm the shards ran one property selection: {', '.join(old)} "
            f"{'does' if len(old) == 1 else 'do'} not record it (a summary from an older vmfuzz); "
            "merged on their property counts alone")


def _same_selection(shards: list[tuple[Path, dict]], split: list[tuple[int, int]], n: int) -> None:
    """Shard K runs every N-th property of the run's selection from the (K-1)-th (``engine.campaign.shard``):
    shards of one selection hold disjoint properties, in counts that interleave back into it.
    Shards run with different ``--property`` selections do not, and are refused."""
    names = {k: [p.get("name") for p in s["properties"]] for (k, _), (_, s) in zip(split, shards)}
    seen: dict[str, int] = {}
    for k, props in sorted(names.items()):
        for name in props:
            if name in seen:
                raise MergeError(f"the shards ran different property selections: {name} ran in shard "
                                 f"{seen[name]}/{n} and in shard {k}/{n} (give every shard the same --property)")
            seen[name] = k
    total = sum(len(v) for v in names.values())
    for k, props in names.items():
        if len(props) != len(range(k - 1, total, n)):
            raise MergeError("the shards ran different property selections: "
                             + ", ".join(f"shard {kk}/{n} ran {len(v)}" for kk, v in sorted(names.items()))
                             + f" of {total} properties, which no --shard split of one selection gives "
                             "(give every shard the same --property)")


def join_groups(summaries: list[dict]) -> list[dict]:
    """One group per cause across the shards: counts added, members and properties joined; the
    repro stays the first shard's unless only a later one's config is a server's."""
    out: dict[str, dict] = {}
    for s in summaries:
        for g in s.get("groups", []):
            have = out.get(group_id(g))
            if have is None:
                out[group_id(g)] = {**g, "properties": list(g["properties"]), "members": list(g["members"])}
                continue
            have["count"] += g["count"]
            # known only when every shard's members are that entry's cause (vmfuzz.harness.engine.campaign.session)
            if have.get("known") != g.get("known"):
                have["known"] = None
            have["properties"] = sorted(set(have["properties"]) | set(g["properties"]))
            have["members"] = list(dict.fromkeys(have["members"] + g["members"]))
            if g.get("server_valid") and not have.get("server_valid"):
                have.update({k: g[k] for k in ("repro", "repro_property", "detail", "server_valid") if k in g})
    return list(out.values())


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
    groups = join_groups(summaries)
    members = {m for g in groups for m in g["members"]}
    merged = {**first, "shard": None, "shards": [s.get("shard") for s in summaries],
              "selection": first.get("selection") if all(s.get("selection") for s in summaries) else None,
              "interrupted": any(s.get("interrupted") for s in summaries),
              "properties": list(props.values()), "replays": replays, "known_findings": known,
              "findings": findings, "groups": groups,
              "boundary_classes": dict(sum((Counter(s.get("boundary_classes", {})) for s in summaries), Counter())),
              "overflow_margin": {b: sum(s.get("overflow_margin", {}).get(b, 0) for s in summaries)
                                  for b in MARGIN_BUCKETS},
              "overflow_margin_by_path": _sum_nested([s.get("overflow_margin_by_path") or {} for s in summaries]),
              "deep_boundary_corpus": _join_corpus([s.get("deep_boundary_corpus") for s in summaries]),
              "reached": {k: max(s.get("reached", {}).get(k, 0) for s in summaries)
                          for k in dict.fromkeys(k for s in summaries for k in s.get("reached", {}))},
              "kernel": _join_kernel([s.get("kernel") for s in summaries]),
              "time_cap": _join_cap([s.get("time_cap") for s in summaries]),
              "started": min(s["started"] for s in summaries),
              "warnings": [w for s in summaries for w in s.get("warnings", [])],
              # what any shard's cap stopped is unfinished for the merged run too (exit 3)
              "unfinished": list(dict.fromkeys(u for s in summaries for u in s.get("unfinished") or [])),
              "timings": {"replay_seconds": sum(s["timings"]["replay_seconds"] for s in summaries),
                          "search_seconds": sum(s["timings"]["search_seconds"] for s in summaries),
                          # the shards ran side by side: the merged run took as long as the slowest
                          "total_seconds": max(s["timings"]["total_seconds"] for s in summaries)}}
    merged["counts"] = {
        **status_counts(list(props.values()), replays, first.get("gate")),
        "replays": len(replays), "replays_failed": sum(r["status"] == "failed" for r in replays),
        "findings": len(findings), "groups": len(groups), "known": sum(k["status"] == REPRODUCES for k in known),
        # what fails the merged run: the groups no known entry names (vmfuzz.harness.report.summary)
        "new_groups": sum(g.get("known") is None for g in groups)
        # a summary written before a known entry failing differently was a group of its own
        + sum(k["status"] == DIFFERENT and k["repro"] not in members for k in known)}
    # decided from the joined summary by the rule a single run's is (never copied from a shard)
    return with_verdict(merged, decide(merged))


def _sum_nested(parts: list[dict]) -> dict:
    out: dict = {}
    for part in parts:
        for path, buckets in part.items():
            into = out.setdefault(path, {})
            for bucket, count in buckets.items():
                into[bucket] = into.get(bucket, 0) + count
    return out


def _join_corpus(parts: list) -> dict | None:
    """Each shard ran the deep corpus for its own properties: cases joined, runs and seconds added."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    return {"cases": list(dict.fromkeys(c for p in parts for c in p["cases"])), "runs": sum(p["runs"] for p in parts),
            "seconds": round(sum(p["seconds"] for p in parts), 3), "sized_from": parts[0]["sized_from"]}


def _join_kernel(parts: list) -> dict | None:
    parts = [p for p in parts if p]
    if not parts:
        return None
    out = {k: sum(p.get(k, 0) for p in parts) for k in ("launches", "kernel_seconds", "search_seconds")}
    out["kernel_seconds"], out["search_seconds"] = round(out["kernel_seconds"], 3), round(out["search_seconds"], 3)
    out["kernel_share"] = round(out["kernel_seconds"] / out["search_seconds"], 4) if out["search_seconds"] else 0.0
    return out


def _join_cap(parts: list) -> dict | None:
    """The shards ran side by side under one cap: the merged run used what its slowest shard did."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    return {"cap_seconds": parts[0]["cap_seconds"], "used_seconds": max(p["used_seconds"] for p in parts),
            "reached": any(p["reached"] for p in parts)}


#: How every field of a run's summary.json (``vmfuzz.harness.model.summary_file.RunSummary``) is joined.
#: "same": every shard holds the same value (``SAME`` checks it, or it is one run's by nature);
#: "joined": ``merge_summaries`` computes it from every shard. A field this table lacks fails
#: tests/test_merge.py: a new field is never copied from shard 1 unseen.
FIELDS = {
    **dict.fromkeys(("command", "target", "profile", "seed", "max_examples", "time_budget", "workers", "isolation",
                     "device", "versions", "fail_on_known", "bounds", "deployment", "gate", "history", "selection"), "same"),
    **dict.fromkeys(("interrupted", "started", "counts", "properties", "boundary_classes", "overflow_margin",
                     "overflow_margin_by_path", "findings", "replays", "known_findings", "timings", "reached",
                     "kernel", "warnings", "groups", "deep_boundary_corpus", "shard", "shards", "time_cap",
                     "verdict", "unfinished"),
                    "joined"),
}


def write_merged(merged: dict, report_dir: Path) -> None:
    from vmfuzz.harness.report.html import report_html
    write_files(report_dir, {"summary.json": json.dumps(merged, indent=2) + "\n", "summary.md": summary_md(merged),
                             "junit.xml": run_junit(merged), "report.html": report_html(merged, report_dir)})
