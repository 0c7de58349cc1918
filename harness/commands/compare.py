"""``vmfuzz compare A B``: what changed between two runs' report directories.

Groups are matched by their origin's key (one per cause, vmfuzz.harness.engine.campaign.groups),
never by their words: a group only in B is new, one only in A is fixed, one in
both is still failing; a group B lists as a known finding (known/) is not new.
An interrupted run, or a summary written before findings had typed origins, is
refused (exit 2): its groups cannot say what was fixed; so are runs of another
target or profile. Groups are compared on the properties both runs searched: a
group is fixed only where B searched its property with at least as many
examples as A (else "not rechecked"), and one whose property A never searched
is "not compared"; each side's other properties are named. Then the classes reached
(gained, lost), the examples and the bounds. Exit 1 when B has a new group: a
nightly compared with the last one fails only on what is new.
"""

from __future__ import annotations

import json
from pathlib import Path

from vmfuzz.harness.commands.common import write_command_report
from vmfuzz.harness.commands.request import CompareRequest
from vmfuzz.harness.model.errors import EXIT_FINDING, EXIT_OK, UsageError


def _summary(where: str) -> dict:
    """A run's or gate's summary.json in ``where``; one line and exit 2 for anything else."""
    path = Path(where)
    if not path.is_dir():
        raise UsageError(f"vmfuzz compare: {where} is not a directory")
    file = path / "summary.json"
    try:
        s = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UsageError(f"vmfuzz compare: {where} holds no reports (no readable summary.json)") from None
    if not isinstance(s, dict) or not isinstance(s.get("properties"), list):
        raise UsageError(f"vmfuzz compare: {where}/summary.json is not a run's or a gate's summary") from None
    # a group's repro is named relative to its report folder: printed here as a path one can open
    for g in s.get("groups") or []:
        if isinstance(g, dict) and isinstance(g.get("repro"), str) and not Path(g["repro"]).is_absolute():
            g["repro"] = str(path / g["repro"])
    return s


def _comparable(where: str, s: dict) -> None:
    """A summary whose groups are not the whole of what its run found cannot say what was fixed:
    refused (one line, exit 2) rather than reported as "fixed"."""
    if s.get("interrupted"):
        raise UsageError(f"vmfuzz compare: {where} is an interrupted run: its finding groups cover only what "
                         "ran, so nothing can be called fixed or new; compare a run that finished")
    if "groups" not in s and s.get("findings"):
        raise UsageError(f"vmfuzz compare: {where}/summary.json was written before finding groups existed: its "
                         "findings cannot be matched by cause; run it again with this vmfuzz")


def groups_of(s: dict, where: str = "") -> dict[str, dict]:
    """origin key -> group. A summary written before findings had origins cannot be matched
    on them: refused (exit 2), never guessed from its words (a reworded one would read as
    fixed plus new)."""
    groups = s.get("groups") or []
    if any(not g.get("key") for g in groups):
        raise UsageError(f"vmfuzz compare: {where or 'a'} summary.json was written before findings had typed "
                         "origins (its groups carry no key): rerun that run with this vmfuzz to compare")
    return {g["key"]: g for g in groups}


def _alike(a: dict, b: dict, names: tuple[str, str]) -> None:
    """Runs of another target or profile found other things by design: refused, one line. A
    variant of the target (``sglang+...``) stands for other code under test: it is comparable."""
    for what, read in (("target", lambda s: str(s.get("target")).split("+")[0]), ("profile", lambda s: s.get("profile"))):
        if read(a) != read(b):
            raise UsageError(f"vmfuzz compare: {names[0]} ran {what} {a.get(what)!r} and {names[1]} {what} "
                             f"{b.get(what)!r}: what one found and the other did not says nothing of a fix; "
                             f"compare two runs of one {what}")


def _ran(s: dict) -> dict[str, dict]:
    """property -> its entry, for the properties a run searched (held or failed)."""
    return {p["name"]: p for p in s.get("properties", []) if p.get("status") in ("held", "held in part", "failed")}


def changes(a: dict, b: dict, names: tuple[str, str] = ("A", "B")) -> dict:
    """Groups are compared on the properties both runs searched. A group only in A is fixed only
    where B searched one of its properties with at least as many examples; otherwise it is "not
    rechecked". A group whose properties the other run never searched is "not compared"."""
    ga, gb = groups_of(a, names[0]), groups_of(b, names[1])
    ra, rb = _ran(a), _ran(b)

    def ran_in(props, run) -> bool:
        return any(p in run for p in props)

    def rechecked(g) -> bool:
        return any(p in rb and rb[p].get("examples", 0) >= ra.get(p, {}).get("examples", 0) for p in g["properties"])
    only_a = [ga[k] for k in ga if k not in gb]
    only_b = [gb[k] for k in gb if k not in ga]
    ca = {k for k, v in a.get("boundary_classes", {}).items() if v}
    cb = {k for k, v in b.get("boundary_classes", {}).items() if v}
    return {"new": [g for g in only_b if ran_in(g["properties"], ra)],
            "fixed": [g for g in only_a if rechecked(g)],
            "not_rechecked": [g for g in only_a if not rechecked(g)],
            "not_compared": [g for g in only_b if not ran_in(g["properties"], ra)],
            "only_in": [sorted(set(ra) - set(rb)), sorted(set(rb) - set(ra))],
            "still_failing": [gb[k] for k in gb if k in ga],
            "classes_gained": sorted(cb - ca), "classes_lost": sorted(ca - cb),
            "examples": [a["counts"]["examples"], b["counts"]["examples"]],
            "bounds": [(a.get("bounds") or [None])[-1], (b.get("bounds") or [None])[-1]],
            "reached": [a.get("reached") or {}, b.get("reached") or {}]}


def _shape(d: dict | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (d or {}).items()) or "none recorded"


def _print(c: dict) -> None:
    for key, word in (("new", "NEW"), ("fixed", "fixed"), ("still_failing", "still failing"),
                      ("not_rechecked", "not rechecked"), ("not_compared", "not compared")):
        for g in c[key]:
            props = ", ".join(g.get("properties", []))
            print(f"  {word:<14} {g['signature']} ({g.get('count', 1)} finding(s), {props}): {g.get('repro', '')}")
    if not (c["new"] or c["fixed"] or c["still_failing"] or c["not_rechecked"] or c["not_compared"]):
        print("  no finding groups in either run")
    for side, props in zip("AB", c["only_in"]):
        if props:
            print(f"  only {side} searched {', '.join(props)}: compared on the properties both searched")
    print(f"  classes        {len(c['classes_gained'])} gained, {len(c['classes_lost'])} lost"
          + "".join(f"\n    + {k}" for k in c["classes_gained"]) + "".join(f"\n    - {k}" for k in c["classes_lost"]))
    ea, eb = c["examples"]
    print(f"  examples       {ea:,} -> {eb:,} ({eb - ea:+,})")
    print(f"  bounds         {_shape(c['bounds'][0])} -> {_shape(c['bounds'][1])}")
    print(f"  reached        {_shape(c['reached'][0])} -> {_shape(c['reached'][1])}")


def run(request: CompareRequest) -> int:
    from vmfuzz.harness.report.summary import Check, CommandSummary
    a_dir, b_dir = str(request.a), str(request.b)
    a, b = _summary(a_dir), _summary(b_dir)
    _comparable(a_dir, a)
    _comparable(b_dir, b)
    _alike(a, b, (a_dir, b_dir))
    c = changes(a, b, (a_dir, b_dir))
    print(f"vmfuzz compare: {a_dir} ({a.get('target')}) -> {b_dir} ({b.get('target')})")
    _print(c)
    summary = CommandSummary("compare", b.get("target", "?"), extra={"a": a_dir, "b": b_dir, "changes": c})
    summary.checks += [Check(g["signature"], "failed", "new in B", repro=g.get("repro")) for g in c["new"]]
    summary.checks += [Check(g["signature"], "held", "fixed: failed in A, not in B") for g in c["fixed"]]
    summary.checks += [Check(g["signature"], "held", "still failing (in A too: not new)", repro=g.get("repro"))
                       for g in c["still_failing"]]
    summary.checks += [Check(g["signature"], "skipped", "failed in A; B did not search its property with as many "
                             "examples: not called fixed") for g in c["not_rechecked"]]
    summary.checks += [Check(g["signature"], "skipped", "in B only, and A never searched its property: not "
                             "compared", repro=g.get("repro")) for g in c["not_compared"]]
    summary.headline = (f"{len(c['new'])} new, {len(c['fixed'])} fixed, {len(c['still_failing'])} still failing "
                        "finding group(s)")
    write_command_report(summary, request.report_dir)
    print(summary.headline)
    return EXIT_FINDING if any(not g.get("known") for g in c["new"]) else EXIT_OK
