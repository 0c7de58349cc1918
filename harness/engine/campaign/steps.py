"""Bound steps: a search walked through the plan's widening bounds, narrow to wide.

A nightly on ``sglang`` widens its case bounds in steps (the target's bounds
ladder); each wider step gets a larger share of the budget, and a property that
failed, or cannot be driven, is not searched again. ``session._staged`` walks
the steps for every property in one process; ``search_stepped`` walks them for one
property inside a ``--workers`` process, so both paths reach the same bounds.
"""

from __future__ import annotations

import time

from vmfuzz.harness.engine.search.database import database_for
from vmfuzz.harness.engine.search.results import PropertyResult
from vmfuzz.harness.engine.search.search import MIN_SHARE, search_property
from vmfuzz.harness.properties import PROPERTIES


def step_weight(i: int) -> int:
    """Step ``i``'s weight in the budget: each wider step twice the one before. An example at
    the widest bounds costs tens of times one at the first (README: "The `sglang` target"),
    so equal shares left the widest step, where the production shapes are, a handful each."""
    return 2 ** i


def step_share(i: int, n: int) -> float:
    """Step ``i``'s part of what is left of the budget when steps ``i .. n-1`` remain."""
    return step_weight(i) / sum(step_weight(j) for j in range(i, n))


def summed(total: PropertyResult | None, res: PropertyResult) -> PropertyResult:
    """One bound step's result added to the steps before it (``res`` itself for the first)."""
    if total is None:
        return res
    first_failure, skipped = total.seconds_to_failure, total.skipped
    total.merge(res)
    total.seconds_to_failure = first_failure or res.seconds_to_failure
    total.skipped = skipped and res.skipped
    return total


def never_searched(totals: dict[str, PropertyResult], names: list[str], rounds: bool) -> None:
    """The properties a spent budget leaves out of the bound steps left: reported as such, never
    left out ("all 0 held"); a fixed-count search (pr) that misses a step is cut short."""
    for n in names:
        totals[n] = summed(totals.get(n), PropertyResult(n, skipped=True, cut_short=not rounds))


def search_stepped(plan, target, name: str, deadline, check, strategies) -> PropertyResult:
    """One property in a worker, through every bound step of the plan, as ``_staged`` does
    in one process: each wider step gets its weighted share of what is left of ``deadline``,
    and a property that failed (or cannot be driven) is not searched again."""
    steps = tuple(plan.bounds_steps) or (plan.bounds,)
    database = database_for(plan.profile.database, plan.db_dir, plan.db_url)
    total = None
    for i, bounds in enumerate(steps):
        step_deadline = deadline
        if deadline is not None and len(steps) > 1:
            left = deadline - time.monotonic()
            if left < MIN_SHARE and total is not None:
                break
            if plan.profile.rounds:  # a fixed-count search's cap is the whole run's, never a step's share
                step_deadline = time.monotonic() + max(MIN_SHARE, left) * step_share(i, len(steps))
        res = search_property(target, PROPERTIES[name], seed=plan.seed, max_examples=plan.max_examples,
                              bounds=bounds, findings_dir=plan.findings_dir, device=plan.device,
                              database=database, deadline=step_deadline, check=check, strategy=strategies.get(name),
                              rounds=plan.profile.rounds)
        if len(steps) > 1:
            res.step_seconds = [0.0] * i + [res.seconds]
        total = summed(total, res)
        if total.findings or total.not_driven or total.out_of_step:
            break
    return total
