"""Where a run's search spreads over processes.

Two ways, for two kinds of run. ``--workers N`` spawns a pool: each worker
imports the target afresh and walks a property's bound steps itself, the way
a long nightly spreads over cores. A fixed-count search (the gate, the pr
profile), on a host with a core to spare, forks lanes from this process once
the target has loaded (vmfuzz.harness.engine.search.lanes): no second import,
which would cost more than a gate's share of the search.
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial
from typing import Callable

from vmfuzz.harness.engine.search.results import PropertyResult
from vmfuzz.harness.engine.search.search import MIN_SHARE, direct_check, slots_of
from vmfuzz.harness.engine.campaign.steps import search_stepped
from vmfuzz.harness.properties import PROPERTIES

# ``plan`` and ``outcome`` below are session's RunPlan and RunOutcome, unnamed here: session imports
# this module, never the other way round.


def kernel_share(launches: int, kernel_seconds: float, search_seconds: float) -> dict:
    """The summary's record of how much of the search was the target's kernels."""
    return {"launches": launches, "kernel_seconds": round(kernel_seconds, 3),
            "search_seconds": round(search_seconds, 3),
            "kernel_share": round(kernel_seconds / search_seconds, 4) if search_seconds > 0 else None}


def searcher(plan, target):
    """What one worker (or this process) needs to search any property."""
    from vmfuzz.harness.engine.core.isolation import IsolatedChecker
    check = IsolatedChecker(target, plan.example_timeout) if plan.isolate else None
    return check, searcher_strategies(plan)


def searcher_strategies(plan) -> dict:
    """A deployment-scoped run's case strategies, by property (none: the default cases)."""
    if plan.deployment is None:
        return {}
    from vmfuzz.harness.engine.search.deployment import case_strategy
    return {n: case_strategy(plan.deployment, trivial=p.trivial, steps=p.steps, allocates=not p.arithmetic)
            for n, p in PROPERTIES.items()}


def _pool_search(plan, name: str, share: float | None, end: float | None) -> PropertyResult:
    """Runs in a pool worker: resolve the target here, so plug-ins need not pickle."""
    from vmfuzz.harness.targets import resolve
    import torch
    torch.set_num_threads(1)  # N workers on N cores: one thread each
    from vmfuzz.harness.engine.campaign.workers import remembering
    target = resolve(plan.target)
    from vmfuzz.harness.engine.search.database import lost_shared_database, start_afresh
    start_afresh(quiet=True)
    from vmfuzz.harness.engine.regression.known import attach
    attach(target, list(plan.known))
    check, strategies = searcher(plan, target)
    own = check  # closed below; the noting wrapper only lets the parent name a dead worker's case
    check = remembering(check or direct_check(target))
    deadline = None
    if share is not None:
        # Wall-clock ``end`` is shared by every worker: the slot's share, but never past the run's end.
        deadline = time.monotonic() + max(MIN_SHARE, min(share, end - time.time()))
    try:
        res = search_stepped(plan, target, name, deadline, check, strategies)
        res.lost_database = lost_shared_database()  # said by the parent, once for all its workers
        return res
    finally:
        if own is not None:
            own.close()


def search_pool(plan, target, outcome, budget, done, names) -> None:
    """The properties spread over ``plan.workers`` processes, in ceil(n / workers) waves.

    A worker that dies (SIGKILL, a crash with --isolate off) makes its property a
    ``target-crash`` finding; the others go on in new workers.
    """
    from vmfuzz.harness.engine.campaign.workers import spread
    waves = -(-len(names) // plan.workers)
    share = None if budget is None else budget / waves
    if budget is not None and not plan.profile.rounds:
        share = budget
    end = None if budget is None else time.time() + budget
    # Each worker walks the plan's bound steps itself (``search_stepped``).
    outcome.bounds_used.extend(dataclasses.asdict(b) for b in (tuple(plan.bounds_steps) or (plan.bounds,)) if b)
    spread(_pool_search, [(n, (plan, n, share, end)) for n in names], plan.workers, done,
           partial(_worker_died, plan, target, done))
    order = {n: i for i, n in enumerate(plan.properties)}
    outcome.results.sort(key=lambda r: order[r.prop])


def _worker_died(plan, target, done, death) -> None:
    """A pool worker's death, as its property's ``target-crash`` finding (with the case it was
    checking, when it had one)."""
    from vmfuzz.harness.engine.search.search import record_death
    examples, case = (death.case[0], death.case[1:]) if death.case else (0, None)
    what = "while checking this case" if case else "outside any check"
    finding = record_death(target, death.name, f"worker process died: {death.reason} ({what})",
                           case, plan.seed, plan.findings_dir)
    done(PropertyResult(death.name, examples=examples, faults=[finding]))


def lane_slots(plan, target, names: list[str]) -> list[list[str]] | None:
    """The searches lanes take, heaviest first; None where this run searches in one process.

    Lanes only for a fixed-count search whose checks run in watched workers on the CPU (a forked
    CUDA context is unusable), with a second core and a second search to give it."""
    from vmfuzz.harness.engine.search.lanes import lanes_available
    if plan.profile.rounds or not plan.isolate or plan.device != "cpu" or lanes_available() < 2:
        return None
    # A deployment-scoped search keeps each property's own cases, so none shares (search.shareable):
    # said from the plan, not by building every case strategy here that each lane builds again.
    slots = slots_of(target, names, share=plan.share and plan.deployment is None)
    if len(slots) < 2:
        return None
    return sorted(slots, key=lambda slot: -max(PROPERTIES[n].cost for n in slot))


def start_lanes(slots: list[list[str]], search: Callable[[list[str]], list[PropertyResult]],
                finish: Callable[[], None], deadline: float | None = None):
    """Lanes forked and searching ``slots`` (the heaviest first) while this process goes on; one
    still searching at ``deadline`` is killed, its slot lost (could not check)."""
    from vmfuzz.harness.engine.search.lanes import Lanes, lanes_available
    lanes = Lanes(search, min(lanes_available(), len(slots)), finish, deadline=deadline)
    lanes.start(slots)
    return lanes


def finish_lanes(plan, outcome, lanes, done, t1: float) -> None:
    """Every lane's results ``done`` as its slots end; the summary keeps the plan's order. A slot whose
    lane died is not checked (exit 3), never held."""
    def shown(results: list[PropertyResult]) -> None:
        for res in results:
            done(res)

    def lost(slot: list[str], why: str) -> None:
        for name in slot:
            done(PropertyResult(name, out_of_step=f"search lane in vmfuzz: {why}; not checked", lane_lost=True))

    outcome.bounds_used.extend(dataclasses.asdict(b) for b in (tuple(plan.bounds_steps) or (plan.bounds,)) if b)
    try:
        lanes.finish(shown, lost)
    finally:
        searched = time.monotonic() - t1
        outcome.kernel = kernel_share(lanes.launches, lanes.kernel_seconds, lanes.busy_seconds or searched)
        outcome.kernel.update(search_seconds=round(searched, 3), lanes=lanes.count)
    order = {n: i for i, n in enumerate(plan.properties)}
    outcome.results.sort(key=lambda r: order.get(r.prop, len(order)))
