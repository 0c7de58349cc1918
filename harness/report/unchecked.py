"""Could not check: a property the clock stopped before it was checked, and how close a run came to its cap.

The pr profile's verdict is a function of the code, the seed and the cached
example database: every property runs its fixed example count, and the time
cap is only a guard against a hang. Reaching it is "could not check" (exit 3),
never "held". Under a time budget (dev, nightly) a search legitimately ends
when its share is spent, but one that never got past its fixed boundary cases
was not searched: could not check too.
"""

from __future__ import annotations

UNCHECKED = "could not check"
#: a property that held on what ran, with a promised sub-check no case judged: exit 3, never "held"
HELD_IN_PART = "held in part"
#: a property whose search lane died before it was checked: exit 3 whatever the change touched
LANE_LOST = "lane lost"


def status(res) -> str:
    """A property's status in summary.json."""
    if res.findings:
        return "failed"
    if getattr(res, "lane_lost", False):
        return LANE_LOST
    if getattr(res, "out_of_step", None):
        return "out of step"
    if res.not_driven:
        return "not driven"
    if res.unchecked:
        return UNCHECKED
    if res.examples == 0:
        return "skipped"
    from vmfuzz.harness.properties import sub_checks_not_driven
    return HELD_IN_PART if sub_checks_not_driven(res.prop, res.classes) else "held"


def how_far(p: dict) -> str:
    """``routing 23/43 examples``: a property's examples of the count its search would have run."""
    if not p.get("planned"):
        return f"{p['name']} not started"
    return f"{p['name']} {p['examples']}/{p['planned']} examples"


def time_cap(outcome) -> dict | None:
    """summary.json's ``time_cap``: a fixed-count profile's cap (pr), the seconds the run used, and
    whether the cap was reached; None where the budget bounds the search itself (dev, nightly)."""
    plan = outcome.plan
    if plan.time_budget is None or plan.profile.rounds:
        return None
    # a gate's seconds are its whole wall, from its start to its reports (vmfuzz.harness.engine.core.clock)
    return {"cap_seconds": float(plan.time_budget), "used_seconds": round(outcome.seconds, 1),
            "reached": any(r.unchecked for r in outcome.results) or outcome.seconds >= plan.time_budget}


def cap_line(s: dict) -> str | None:
    """``used 38 s of a 300 s cap``: how close the run came to its hang guard."""
    cap = s.get("time_cap")
    if not cap:
        return None
    state = "reached" if cap["reached"] else f"{cap['used_seconds'] / cap['cap_seconds']:.0%} of it"
    return f"time: used {cap['used_seconds']:.1f} s of a {cap['cap_seconds']:g} s cap ({state})"


def unchecked_line(s: dict) -> str | None:
    """The one line of exit 3 when the clock, not the code, ended a check; None when none did."""
    stopped = [p for p in s["properties"] if p["status"] == UNCHECKED]
    if not stopped and s["properties"]:
        return None  # a run of no property at all checked nothing: never "all 0 held"
    budget = s.get("time_budget")
    if s.get("time_cap"):
        why = f"the time cap of {budget:g} s was reached (the pr verdict needs every property's full count)"
    elif budget is not None:
        why = f"the time budget of {budget:g} s ran out before their search"
    else:
        why = "the search was cut short"
    return f"could not check: {why}: " + (", ".join(map(how_far, stopped)) or "no property ran")
