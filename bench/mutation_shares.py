"""The shares a maintainer can quote, and every false green with its reason, from the mutants' rows.

Exercised non-raising: a mutant whose mutated line ran under a property on the
mask's path and that did not raise: killed by a property's check, killed with no
origin printed, survived, suspected-equivalent or equivalent. Left out, each
counted apart: kills only by the mutant raising (nothing handed on to judge),
not-exercised (the gate exited 3 naming the line), off-path, stillborn,
out-of-step, error, timed-out.

Two shares of that set are caught by a property's check: over all of it, and
over the mutants not shown equivalent (only a wider search than the gate's shows
a mutant equivalent: bench/mutation_wide.py; a suspected-equivalent one stays in
the denominator).

A false green is a mutant the gate passed on the mask's path that is not shown
equivalent: a survivor (its outputs differ, on the gate's examples or in the
wider search) or a suspected-equivalent (identical on the gate's examples, not
shown beyond them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

EXERCISED_PASSES = ("survived", "suspected-equivalent", "equivalent")


def exercised_non_raising(row: dict) -> bool:
    if row["outcome"] == "killed":
        return row.get("killed_by") != "the mutant raising"
    return row["outcome"] in EXERCISED_PASSES


@dataclass
class Shares:
    exercised: int = 0  # exercised non-raising mutants
    caught: int = 0  # of them, killed by a property's check
    equivalent: int = 0  # of them, shown equivalent beyond the gate's examples
    false_greens: list[tuple[dict, str]] = field(default_factory=list)

    @property
    def non_equivalent(self) -> int:
        return self.exercised - self.equivalent

    @staticmethod
    def share(caught: int, of: int) -> str:
        return f"{caught / of:.0%} ({caught}/{of})" if of else f"- ({caught}/0)"

    def over_all(self) -> str:
        return self.share(self.caught, self.exercised)

    def over_non_equivalent(self) -> str:
        return self.share(self.caught, self.non_equivalent)


def reason(row: dict) -> str:
    """Why a mutant the gate passed is a false green, in the comparison's own words."""
    wide, gate = row.get("wide"), row.get("equiv")
    if row["outcome"] == "survived":
        if wide and not wide.startswith("not checked"):
            return f"identical on the gate's examples ({gate}); the wider search: {wide}"
        return f"outputs on the gate's examples: {gate or 'not compared'}"
    return (f"identical on the gate's examples ({gate}); not shown beyond them: "
            + (f"the wider search {wide}" if wide else "no wider search run"))


def shares(done: list[dict]) -> Shares:
    out = Shares()
    for r in done:
        if not exercised_non_raising(r):
            continue
        out.exercised += 1
        out.caught += r["outcome"] == "killed" and r.get("killed_by") == "a property's check"
        out.equivalent += r["outcome"] == "equivalent"
        if r["outcome"] in ("survived", "suspected-equivalent"):
            out.false_greens.append((r, reason(r)))
    return out
