"""The verdict of a run, decided once from its summary, before any report is written.

Every writer (summary.json's ``verdict`` and counts, summary.md's first line,
report.html's title, junit.xml's ``vmfuzz.verdict`` testcase, the closing line
on the terminal) and the exit code read the ``Verdict`` decided here
(``vmfuzz.harness.model.verdict``). It is decided from the summary, not from
the engine's outcome, so ``merge`` decides a sharded run's verdict from the
joined summary by the same rule, and a verdict read back from disk can be
checked against the summary it sits in.

The order is the exit code's: a signal, then a new finding, then each reason the
run could not check (exit 3), then a deployment that fails, then known
findings, then held.
"""

from __future__ import annotations

from vmfuzz.harness.model.verdict import Kind, Verdict
from vmfuzz.harness.report.replays import unreplayed
from vmfuzz.harness.report.terminal import plural
from vmfuzz.harness.report.unchecked import HELD_IN_PART, LANE_LOST, unchecked_line


def fails(s: dict) -> bool:
    """Does this summary fail (the exit code's rule): a new group, or a known one with --fail-on-known."""
    c = s["counts"]
    if "new_groups" not in c:  # a summary written before origins: every finding counted
        return bool(c["findings"] or c["replays_failed"])
    return bool(c["new_groups"] or (s.get("fail_on_known") and (c["known"] or c["groups"])))


def _more(items: list[str]) -> str:
    return items[0] + (f" (and {len(items) - 1} more)" if len(items) > 1 else "")


def out_of_step_lines(s: dict) -> list[str]:
    """The out-of-step checks that stop the run. The gate counts only those that drive a file the
    change touches (its ``out_of_step``; the rest are warnings in its summary); a run counts every one."""
    gate = s.get("gate") or {}
    if "out_of_step" in gate:
        return list(gate["out_of_step"])
    return ([p["out_of_step"] for p in s["properties"] if p["status"] == "out of step" and p.get("out_of_step")]
            + [r["detail"] or r["repro"] for r in s.get("replays", []) if r["status"] == "out of step"])


def held_in_part(s: dict) -> list[str]:
    """One line per property that held with a promised sub-check no case judged."""
    out = []
    for p in s["properties"]:
        if p["status"] == HELD_IN_PART:
            gaps = {k: v for k, v in (p.get("sub_checks") or {}).items() if v != "done"}
            out.append(f"{p['name']} held in part: " + "; ".join(f"sub-check {k}: {v}" for k, v in gaps.items()))
    return out


def decide(s: dict, *, signal_code: int | None = None) -> Verdict:
    """The verdict of the run summary ``s`` (``signal_code``: the exit code of the signal that
    interrupted it, when one did)."""
    props = s["properties"]
    if s.get("interrupted"):
        return Verdict.of(Kind.INTERRUPTED, "the reports cover what ran", signal_code=signal_code)
    if fails(s):
        c = s["counts"]
        return Verdict.of(Kind.NEW_FINDING, f"{c.get('new_groups', c['findings'])} new finding group(s)"
                          + (" (--fail-on-known: known ones count)" if s.get("fail_on_known") else ""))
    lost = [p for p in props if p["status"] == LANE_LOST]
    if lost:
        return Verdict.of(Kind.LANE_LOST, _more([f"{p['name']}: {p.get('out_of_step') or 'its search lane died'}"
                                                 for p in lost]))
    stuck = unreplayed(s.get("replays", []))
    if stuck:
        return Verdict.of(Kind.COULD_NOT_CHECK, f"saved repro {stuck[0]['repro']} could not be replayed: "
                                                f"{stuck[0]['detail']}")
    out = out_of_step_lines(s)
    if out:
        return Verdict.of(Kind.OUT_OF_STEP, "vmfuzz is out of step with this SGLang: " + _more(out))
    if s.get("unfinished"):  # work no property's result carries, stopped before it ended (a gate's cap)
        return Verdict.of(Kind.COULD_NOT_CHECK, _more(s["unfinished"]))
    gate = s.get("gate") or {}
    lines = list(gate.get("could_not_check") or [])
    if lines:
        device = set(gate.get("needs_gpu") or [])
        return Verdict.of(Kind.NEEDS_GPU if set(lines) <= device else Kind.COULD_NOT_CHECK, _more(lines))
    deployment = s.get("deployment") or {}
    if any((deployment.get(p) or {}).get("ok") is False for p in ("routing", "allocation")):
        return Verdict.of(Kind.NEW_FINDING, "the deployment's routing or allocation fails")
    if unchecked_line(s):
        return Verdict.of(Kind.COULD_NOT_CHECK, unchecked_line(s).removeprefix("could not check: "))
    partly = held_in_part(s)
    if partly:
        return Verdict.of(Kind.HELD_IN_PART, _more(partly))
    undriven = [p for p in props if p["status"] == "not driven"]
    if undriven and len(undriven) == len(props):
        return Verdict.of(Kind.COULD_NOT_CHECK, f"none of the {plural(len(props), 'selected property', 'selected properties')} "
                          f"could be driven on {s['target']} (" + "; ".join(f"{p['name']}: {p.get('not_driven')}" for p in props) + ")")
    known = [g for g in s.get("groups", []) if g.get("known")]
    if known or s["counts"].get("known"):
        return Verdict.of(Kind.KNOWN, f"no new finding group; {len(known)} known group(s), upstream's to fix")
    return Verdict.of(Kind.HELD)


def verdict_of(s: dict) -> Verdict:
    """The verdict a summary holds; decided from it when it holds none (a summary from an older vmfuzz,
    or one a test built by hand)."""
    return Verdict.from_dict(s["verdict"]) if s.get("verdict") else decide(s)


def with_verdict(s: dict, v: Verdict) -> dict:
    """``s`` with its ``verdict`` set (a new dict: the caller's is not changed)."""
    return {**s, "verdict": v.as_dict()}
