"""How the reports and the exit code read the saved repros a run replayed first.

A saved repro that could not be replayed (a bad file, a property the target
cannot drive) is never a pass, and it is not "did not hold" either: the run
could not check it (exit 3), and summary.md and junit.xml say the same. Last
run's cases are the nightly's own: it keeps one it could not check and goes on
(vmfuzz.harness.engine.campaign.nightly.set_aside).
"""

from __future__ import annotations


def unreplayed(replays: list[dict]) -> list[dict]:
    """The saved repros (summary.json's ``replays``) that could not be replayed."""
    return [r for r in replays if r["status"] == "error" and r["source"] == "saved"]


def could_not_check(s: dict) -> str:
    """summary.md's and report.html's reason a run that found nothing is still no pass ("" when it is one)."""
    from vmfuzz.harness.report.unchecked import unchecked_line
    if unreplayed(s["replays"]):
        return "a saved repro could not be replayed"
    if s["counts"].get("out_of_step") or any(r["status"] == "out of step" for r in s["replays"]):
        return "vmfuzz is out of step with the target"
    if unchecked_line(s):
        return "the time ran out"
    return ""


def replay_lines(s: dict) -> list[str]:
    """summary.md's paragraph on the replays: how many did not hold, and each that could not be replayed."""
    errors = [r for r in s["replays"] if r["status"] == "error"]
    lines = ["", f"Replayed {s['counts']['replays']} saved repro(s) first, {s['counts']['replays_failed']} "
             f"did not hold" + (f", {len(errors)} could not be replayed" if errors else "") + "."]
    return lines + [f"- could not replay `{r['repro']}` ({r['source']}): {r['detail']}" for r in errors]


def replay_outcome(r: dict) -> str | None:
    """junit.xml's outcome for one replay, as the exit code reads it."""
    if r["status"] == "error":
        return "error" if r["source"] == "saved" else "skipped"
    return {"held": None, "out of step": "error"}.get(r["status"], "failure")
