"""Runs the properties as Hypothesis searches and collects what they found.

Each property becomes one ``@given`` search over its case strategy. A failure
is shrunk by Hypothesis, then written to disk as a repro file *before* it is
reported, and the campaign moves on to the next property: nothing found is lost
because a later property crashed or the user pressed Ctrl-C.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Phase, event, example, given, seed as hseed, settings, target as hypothesis_target

from vmfuzz.harness.engine.core.line_trace import direct_check
from vmfuzz.harness.engine.search.database import KeyedDatabase
from vmfuzz.harness.engine.core.failures import (failure_of, judged_past_known, known_cause, passed_over_as_known,
                                                 raise_place)
from vmfuzz.harness.engine.search.results import Finding, PropertyResult, Stuck
from vmfuzz.harness.engine.search.cases import cases
from vmfuzz.harness.engine.search.deep_corpus import case_key, fixed_cases
from vmfuzz.harness.engine.core.isolation import TargetFault, TargetRaised
from vmfuzz.harness.engine.core import clock, signals
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.model.errors import CapReached, HarnessError, OutOfStep
from vmfuzz.harness.model.origin import Origin
from vmfuzz.harness.model.repro_file import dump, from_case
from vmfuzz.harness.properties import PROPERTIES, Property, PropertyFailure, shared_group
from vmfuzz.harness.properties.shared import group_members, group_name


MIN_SHARE = 1.0  # seconds any property gets under a time budget


class _OutOfTime(BaseException):
    """Ends a search at its deadline (a BaseException: Hypothesis stops, never shrinks it)."""


class _OutOfStep(BaseException):
    """Ends a search whose seam no longer fits the code under test: never shrunk, never recorded as
    a finding; its case is kept (``PropertyResult.stuck``) for a gate's base to run."""


def run_property(target, prop: Property, *, seed: int, max_examples: int, bounds: Bounds,
                 findings_dir: Path, device: str = "cpu", database=None, deadline: float | None = None,
                 check: Callable | None = None, strategy=None, faulted: set[str] | None = None,
                 on_example: Callable[[], None] | None = None) -> PropertyResult:
    """One Hypothesis search for ``prop``. ``deadline`` (time.monotonic) stops new examples; ``check`` replaces
    ``prop.check`` (an isolated worker); ``strategy`` the case strategy (a deployment-scoped search); ``faulted``:
    fault kinds already saved (one finding per kind); ``on_example()`` is called per example (a progress bar)."""
    result = PropertyResult(prop.name, rounds=1)
    state = {"case": None, "failed": False, "out_of_step": None, "cause": None}
    faulted = set() if faulted is None else faulted
    run_check = check or direct_check(target)
    db = KeyedDatabase(database, prop.name) if database is not None else None

    @_settings(max_examples, db)
    @hseed(seed)
    @given(strategy if strategy is not None else cases(prop, bounds))
    def search(case):
        config, steps = case
        key = case_key(config, steps) if fixed and not state["failed"] else None
        past = deadline is not None and time.monotonic() > deadline and (key not in fixed or clock.reached())
        if past and not state["failed"]:  # a shrink never stops; the corpus (a fixed cost) only at a gate's cap
            raise _OutOfTime
        signals.check()  # a Ctrl-C that Hypothesis or a gc callback swallowed ends the search here
        state["case"] = case
        began = time.perf_counter()
        # Counted before the check: "examples to first detection" includes the failing one.
        if not state["failed"]:
            result.examples += 1
            if on_example is not None:
                on_example()
        try:
            obs = run_check(prop, config, steps, device)
        except (OutOfStep, CapReached) as exc:
            if state["failed"]:
                return  # a shrink step the harness cannot drive (or the cap stopped) is not the failure shrunk
            if isinstance(exc, CapReached):
                raise _OutOfTime from None  # a gate's time cap, met in the check: the search ends here
            state["out_of_step"], result.stuck = exc, Stuck.on(prop.name, config, steps, exc)
            raise _OutOfStep from None
        except TargetFault as fault:
            # Shrinking a crash would re-crash (or re-hang for the full timeout)
            # dozens of times: save it as found and let the search go on.
            if fault.kind not in faulted:
                faulted.add(fault.kind)
                origin, detail = failure_of(_owner(prop), fault)
                result.faults.append(record(target, origin, fault.detail, case, seed, findings_dir))
            return
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            failure = _as_failure(exc)
            if failure is None:
                raise  # a real Ctrl-C
            if not state["failed"] and passed_over_as_known(target, _owner(prop, failure), failure, result):
                return
            if not _same_finding(prop, failure, state, result, start):
                return
            if failure is exc:
                raise
            raise failure from None
        if not state["failed"]:
            result.note(obs, config, steps, searched=not fixed.get(key))
            if fixed.get(key):  # a deep case: named in the summary, with its share of the time
                result.note_corpus(fixed[key], time.perf_counter() - began)
        for cls in sorted(obs.classes):
            event(cls)
        if math.isfinite(obs.margin):  # a case that wrote no step has no margin to report
            hypothesis_target(obs.margin, label="overflow margin (cells)")

    explicit, fixed = fixed_cases(target, prop, bounds, strategy)
    for case in reversed(explicit):
        search = example(case)(search)
    start = time.perf_counter()
    try:
        search()
    except _OutOfStep:
        result.out_of_step = str(state["out_of_step"])
    except (PropertyFailure, _OutOfTime, Exception) as exc:
        result.cut_short = isinstance(exc, _OutOfTime)
        result.finding = _ending(exc, prop, state, lambda origin, detail: record(
            target, origin, detail, state["case"], seed, findings_dir))
    return result.counted(time.perf_counter() - start, len(explicit), max_examples)


def _same_finding(prop: Property, failure: BaseException, state: dict, result: PropertyResult,
                  start: float) -> bool:
    """Is ``failure`` the search's finding? The first one is; while shrinking, only one with the
    same cause is: a smaller case that fails another way is not a smaller case of this finding
    (shrinking keeps the finding's origin, as ClusterFuzz keeps a crash state)."""
    cause = failure_of(_owner(prop, failure), failure)[0].cause()
    if state["failed"]:
        return cause == state["cause"]
    result.seconds_to_failure = time.perf_counter() - start
    state["cause"], state["failed"] = cause, True
    return True


def _settings(max_examples: int, db):
    return settings(max_examples=max_examples, deadline=None, database=db, print_blob=False,
                    report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
                    # No Phase.target: hill-climbing the overflow margin held a search on
                    # one large config for hundreds of examples (measured on the sparse
                    # benchmark, PERFORMANCE.md); the margin is still recorded.
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])


def _as_failure(exc: BaseException) -> BaseException | None:
    """The failure a check's exception is; None for a real Ctrl-C. A target calling exit()
    (or raising KeyboardInterrupt) is a target that raised: shrunk like any failure."""
    from vmfuzz.harness.engine.core.signals import from_user
    if isinstance(exc, Exception):
        return exc
    if isinstance(exc, KeyboardInterrupt) and from_user(exc):
        return None
    return TargetRaised(type(exc).__name__, str(exc), raise_place(exc))


def _ending(exc: BaseException, prop: Property, state: dict, record) -> Finding | None:
    """What ended a search: a property failure or the target raising is a finding (recorded);
    the deadline is none; anything raised while generating is the harness's own error."""
    if isinstance(exc, PropertyFailure):
        return record(*failure_of(_owner(prop, exc), exc))
    if isinstance(exc, _OutOfTime):
        return None  # the budget is spent: what ran so far stands
    if not state["failed"] or state["case"] is None:
        # Raised while generating, not by the target: the harness's own error, never a finding.
        raise HarnessError(f"property {prop.name}: the search itself failed: {type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
    return record(*failure_of(_owner(prop), exc))


def _owner(prop: Property, exc: Exception | None = None) -> str:
    """The property a finding is filed under: a shared group's failure names its failing member."""
    members = group_members(prop.name)
    if members is None:
        return prop.name
    return exc.prop if isinstance(exc, PropertyFailure) and exc.prop in members else members[0]


def record(target, origin: Origin, detail: str, case, seed: int, findings_dir: Path) -> Finding:
    config, steps = case
    prop, kind = origin.property, origin.kind()
    # A target's message may carry anything: keep what JSON, XML and a terminal can hold.
    detail = detail.encode("utf-8", "backslashreplace").decode("utf-8")
    fault = None if kind == "property" else kind
    repro = from_case(target.name, prop, config, steps, detail=detail, seed=seed, fault=fault, origin=origin)
    stem = prop if fault is None else f"{prop}-{fault}"
    path = findings_dir / f"{stem}.json"
    n = 1
    while path.exists():
        n += 1
        path = findings_dir / f"{stem}-{n}.json"
    path = dump(repro, path)  # a broken findings_dir sends it to a fallback place
    return Finding(prop, detail, path, config, steps, kind, origin=origin)


def record_death(target, prop: str, detail: str, case, seed: int, findings_dir: Path) -> Finding:
    """A worker that died while searching ``prop``: a ``target-crash`` finding with the case it
    was checking, or, when it died outside any check, a note naming the property and seed."""
    if case is not None:
        return record(target, Origin(prop, "crash"), detail, case, seed, findings_dir)
    note = (f"vmfuzz: the worker searching {prop} on {target.name} (seed {seed}) died outside any check: "
            f"{detail}\nRerun that property with --seed {seed} --workers 1 --isolate on to find its case.\n")
    path = findings_dir / f"{prop}-target-crash.txt"
    n = 1
    while path.exists():
        n += 1
        path = findings_dir / f"{prop}-target-crash-{n}.txt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(note)
    except OSError:
        pass  # the finding is still reported; the note is only its explanation
    return Finding(prop, detail, path, None, [], "target-crash", origin=Origin(prop, "crash"))


def search_property(target, prop: Property, *, seed: int, max_examples: int, bounds: Bounds,
                    findings_dir: Path, device: str = "cpu", database=None, deadline: float | None = None,
                    check: Callable | None = None, strategy=None, rounds: bool = True,
                    on_example: Callable[[], None] | None = None) -> PropertyResult:
    """``run_property`` in rounds until ``deadline``: a time-budgeted search.

    Without a deadline this is one round of ``max_examples``. With one, each
    further round draws a new seed (derived from ``seed``, so the run stays
    reproducible) until the deadline, a property failure, or a round that
    found nothing new to try.
    """
    total = PropertyResult(prop.name)
    total.not_driven = not_driven_here(target, prop)
    if total.not_driven:
        return total
    # Past the deadline one round still runs: the corpus (a fixed cost), then no search.
    late = deadline is not None and time.monotonic() >= deadline
    rnd, faulted, searched = 0, set(), False
    while True:
        res = run_property(target, prop, seed=seed + rnd * 1_000_003, max_examples=max_examples,
                           bounds=bounds, findings_dir=findings_dir, device=device, database=database,
                           deadline=deadline, check=check, strategy=strategy, faulted=faulted,
                           on_example=on_example)
        total.merge(res)
        searched = searched or not res.skipped
        rnd += 1
        if (late or not rounds or deadline is None or total.finding or total.out_of_step
                or time.monotonic() >= deadline or res.examples == 0):
            return total.timed(searched, rounds)


def run_campaign(target, *, seed: int, max_examples: int, bounds: Bounds, findings_dir: Path,
                 properties: list[str] | None = None, device: str = "cpu", database=None,
                 time_budget: float | None = None, check: Callable | None = None,
                 strategies: dict | None = None, rounds: bool = True,
                 on_result: Callable[[PropertyResult], None] = lambda r: None,
                 share: bool = True, on_example: Callable[[], None] | None = None,
                 on_slot: Callable[[list[str]], None] | None = None) -> list[PropertyResult]:
    """Every property in turn, in this process; ``on_slot(names)`` as each search begins.

    With ``rounds``, ``time_budget`` is shared out evenly (each property searches
    its share); without, it is only a cap on the whole run. With ``share``, the
    properties that opted in are searched together (``search_shared``).
    """
    names = list(properties or PROPERTIES)
    results = []
    start = time.monotonic()
    slots = slots_of(target, names, strategies, share)
    done = 0
    for slot in slots:
        deadline = None
        if time_budget is not None and not rounds:
            deadline = start + time_budget
        elif time_budget is not None:
            left = start + time_budget - time.monotonic()
            # A shrink can overrun a share; the properties after it still get a
            # second each rather than a silent skip. A shared group gets its
            # members' shares together.
            deadline = time.monotonic() + max(MIN_SHARE, left * len(slot) / (len(names) - done))
        done += len(slot)
        if on_slot is not None:
            on_slot(slot)
        if len(slot) > 1:
            out = search_shared(target, [PROPERTIES[n] for n in slot], seed=seed, max_examples=max_examples,
                                bounds=bounds, findings_dir=findings_dir, device=device, database=database,
                                deadline=deadline, check=check, rounds=rounds, on_example=on_example)
        else:
            out = [search_property(target, PROPERTIES[slot[0]], seed=seed, max_examples=max_examples,
                                   bounds=bounds, findings_dir=findings_dir, device=device, database=database,
                                   deadline=deadline, check=check, strategy=(strategies or {}).get(slot[0]),
                                   rounds=rounds, on_example=on_example)]
        for res in out:
            on_result(res)
            results.append(res)
    order = {n: i for i, n in enumerate(names)}
    results.sort(key=lambda r: order[r.prop])
    return results


def slots_of(target, names: list[str], strategies: dict | None = None, share: bool = True) -> list[list[str]]:
    """The searches ``names`` make: each shared group's one run (when it shares), then the rest alone."""
    groups = shareable(target, names, strategies) if share else []
    grouped = {n for g in groups for n in g}
    return groups + [[n] for n in names if n not in grouped]


def not_driven_here(target, prop: Property) -> str | None:
    """Why ``target`` cannot drive ``prop``: a seam it lacks, or what its code lacks (never "held")."""
    missing = prop.missing(target)
    if missing:
        return f"target {target.name} has no {', '.join(missing)}"
    probe = getattr(target, "not_driven_here", None)
    return probe(prop.name) if callable(probe) else None


def shareable(target, names: list[str], strategies: dict | None = None) -> list[list[str]]:
    """The groups among ``names`` one shared search each judges together here: those that opted in
    (``Property.shared``), with every seam they need, on the default case strategy (a deployment
    keeps its own); a group of fewer than two shares nothing."""
    groups: dict[str, list[str]] = {}
    for n in names:
        p = PROPERTIES[n]
        if p.shared and not not_driven_here(target, p) and (strategies or {}).get(n) is None:
            groups.setdefault(p.group, []).append(n)
    return [g for g in groups.values() if len(g) > 1]


def search_shared(target, props: list[Property], *, seed: int, max_examples: int, bounds: Bounds,
                  findings_dir: Path, device: str = "cpu", database=None, deadline: float | None = None,
                  check: Callable | None = None, rounds: bool = True,
                  on_example: Callable[[], None] | None = None) -> list[PropertyResult]:
    """One search for several shared properties: each case run once, every member judged on it.

    A failure is shrunk for the member that failed (once a member fails, the
    search judges only it), recorded under its name, and the search goes on
    for the members left, each round a fresh seed, until all failed or the
    budget (with ``rounds``) or one round of ``max_examples`` (without) is spent.
    Each member's result counts every case judged for it as one example.
    """
    totals = {p.name: PropertyResult(p.name) for p in props}
    active = [p.name for p in props]
    run_check = check or direct_check(target)
    rnd, faulted, searched = 0, set(), set()
    while active:
        if rnd and deadline is not None and time.monotonic() >= deadline:
            for n in active:
                # the fresh search after a member's finding is part of the fixed count
                totals[n].cut_short = True
            break
        state = {"failed": None, "known": {}}
        members = tuple(active)

        def judged(group, config, steps, dev, members=members, state=state):
            if state["failed"]:
                return run_check(shared_group((state["failed"],)), config, steps, dev)
            try:  # a member's known failure passes the case over for it alone: the others are still judged
                return judged_past_known(target, members, lambda names: run_check(
                    shared_group(names), config, steps, dev), state["known"])
            except PropertyFailure as exc:
                if known_cause(target, exc.prop, exc) is None:
                    state["failed"] = exc.prop  # new: the search narrows to its member
                raise  # every member's failure known: uninteresting to the search (run_property)

        res = run_property(target, shared_group(members), seed=seed + rnd * 1_000_003, max_examples=max_examples,
                           bounds=bounds, findings_dir=findings_dir, device=device, database=database,
                           deadline=deadline, check=judged, faulted=faulted, on_example=on_example)
        rnd += 1
        for n in members:
            # each member's classes are those of the batches it judged, never the group's union
            part = PropertyResult(n, examples=res.examples, classes=res.member_classes.get(n, Counter()).copy(),
                                  max_margin=res.max_margin,
                                  seconds=res.seconds / len(members), margins=list(res.margins),
                                  path_margins=list(res.path_margins), bs_ratio=res.bs_ratio.copy(), rounds=1,
                                  reached=dict(res.reached), corpus=list(res.corpus),
                                  corpus_seconds=res.corpus_seconds / len(members),
                                  cut_short=res.cut_short, planned=res.planned, shared_run=group_name(members))
            part.classes.update(state["known"].get(n, Counter()))
            totals[n].merge(part)
            if not res.skipped:
                searched.add(n)
        if res.faults:
            totals[members[0]].faults += res.faults
        if res.out_of_step is not None:
            # One run judges every member: a seam out of step leaves none of them checked.
            for n in members:
                totals[n].out_of_step, totals[n].stuck = res.out_of_step, res.stuck and res.stuck.of(members)
            break
        if res.finding is not None:
            # "target raised" names no member: it is the first one's, as when each searched alone.
            owner = res.finding.prop if res.finding.prop in totals else members[0]
            res.finding.prop = owner
            totals[owner].finding = res.finding
            totals[owner].seconds_to_failure = res.seconds_to_failure
            active.remove(owner)
            continue
        if not rounds or deadline is None or res.examples == 0:
            break
    return [totals[p.name].timed(p.name in searched, rounds) for p in props]
