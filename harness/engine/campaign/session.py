"""One ``vmfuzz run`` (or gate) from plan to reports.

Order matters: saved repros are replayed before any search (a known regression
is reported within seconds, not after the budget), each finding is on disk
before it is printed, and the reports are written last, from what is on disk
and in memory, even when the search was cut short.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from vmfuzz.harness.engine.core import clock
from vmfuzz.harness.engine.search.database import database_for
from vmfuzz.harness.engine.search.results import PropertyResult
from vmfuzz.harness.engine.search.search import MIN_SHARE, run_campaign
from vmfuzz.harness.engine.campaign.steps import never_searched, step_share, summed
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.engine.campaign.profiles import Profile
from vmfuzz.harness.properties import PROPERTIES


@dataclass
class RunPlan:
    target: str
    profile: Profile
    seed: int
    max_examples: int
    time_budget: float | None
    report_dir: Path
    properties: list[str] = field(default_factory=lambda: list(PROPERTIES))
    workers: int = 1
    device: str = "cpu"
    db_dir: Path = Path(".vmfuzz-db")
    isolate: bool = False
    example_timeout: float = 30.0
    deployment: object = None  # vmfuzz.harness.model.deployment_file.DeploymentPlan: read, its configs built
    #: the saved repros to replay first (vmfuzz.harness.engine.regression.regressions.Saved) and the known
    #: findings that apply to the target's SGLang, (path, entry), as the plan read them: from the
    #: folders vmfuzz ships and those the command line names, never the working directory (the
    #: code under review)
    saved: tuple = ()
    known: tuple = ()
    #: what the plan could not do that is no finding (no saved repro to replay), said before any work
    warnings: tuple[str, ...] = ()
    command: str = "run"
    bounds: Bounds = field(default_factory=Bounds)
    #: widening bounds searched in turn, each with an equal share of what is left
    #: of the budget (a nightly on a slow target); empty: ``bounds`` alone
    bounds_steps: tuple = ()
    share: bool = True  # search the shared properties together (vmfuzz.harness.properties.shared)
    db_url: str | None = None  # a Redis server holding the example database (--db redis://...)
    shard: str | None = None  # "K/N": this run is shard K of N (vmfuzz.harness.engine.campaign.shard)
    #: the run's whole property selection, before a shard's split: vmfuzz merge joins only shards of one
    selection: tuple = ()
    #: a known finding (upstream's defect) fails the run too; by default every command lists
    #: them and exits on new groups only
    fail_on_known: bool = False
    #: a nightly's own part of the run (vmfuzz.harness.engine.campaign.nightly.Night): last night's
    #: failures replayed, this night's kept; None for every other profile
    night: object = None
    #: property -> why its deployment leaves it not driven (vmfuzz.harness.properties.not_driven_on):
    #: a buffer past the memory limit is never allocated; the arithmetic properties still run
    not_driven: dict = field(default_factory=dict)

    @property
    def findings_dir(self) -> Path:
        return self.report_dir / "findings"


@dataclass
class RunOutcome:
    plan: RunPlan
    target_name: str
    versions: dict
    started: str
    results: list[PropertyResult] = field(default_factory=list)
    replays: list = field(default_factory=list)
    #: known findings (vmfuzz.harness.engine.regression.known.KnownOutcome) that apply to the code under test
    known: list = field(default_factory=list)
    deployment: dict | None = None
    interrupted: bool = False  # Ctrl-C: reports still cover what ran
    replay_seconds: float = 0.0
    search_seconds: float = 0.0
    seconds: float = 0.0
    #: the gate's changed/triggered/exercised/not-driven files (vmfuzz.harness.engine.campaign.surface.gate_coverage); None for run
    gate: dict | None = None
    bounds_used: list = field(default_factory=list)  # the Bounds searched, in order
    #: kernel launches during the search and the seconds inside them (None: not measured)
    kernel: dict | None = None
    #: things the run could not do that are not findings (no saved repro to replay): in summary.json
    warnings: list[str] = field(default_factory=list)
    #: a nightly's last nights, this one last (vmfuzz.harness.engine.campaign.history); empty for other runs
    history: list = field(default_factory=list)
    #: could-not-check lines for work the run did not finish and that no property's result carries: what
    #: a gate's time cap stopped (``clock.cut``), a known entry whose replay no timeout let end
    unfinished: list[str] = field(default_factory=list)

    def known_name(self, origin) -> str | None:
        """The known entry (applying to the code under test) that names this origin, if any."""
        return next((o.entry.name for o in self.known if o.entry.matches(origin)), None)

    def is_known(self, origin) -> bool:
        return self.known_name(origin) is not None

    @property
    def all_findings(self) -> list:
        return [f for r in self.results for f in r.findings] + [o.finding for o in self.replays if o.finding]

    @property
    def failed(self) -> bool:
        """A new finding group (a known entry that now fails differently is one); a known finding
        fails the run only with ``--fail-on-known``: every command lists them and passes on them.
        Read from the groups, as summary.json's ``new_groups`` is, so the exit code and the
        summary never disagree."""
        groups = self.groups
        new = any(g["known"] is None for g in groups)
        return new or (self.plan.fail_on_known and (any(o.reproduces for o in self.known) or bool(groups)))

    @property
    def groups(self) -> list[dict]:
        """The findings grouped by cause (vmfuzz.harness.engine.campaign.groups), first found first; a group that is
        a known entry says which (``known``), and is listed, not counted as new. A known entry's repro
        that fails differently is a member too: its cause is new, so its group is never known."""
        from vmfuzz.harness.engine.campaign.groups import group_findings
        changed = [f for o in self.known if (f := getattr(o, "finding", None)) is not None]

        def known_name(f) -> str | None:
            return None if any(f is c for c in changed) else self.known_name(f.origin)
        out = []
        for g in group_findings(self.all_findings + changed):
            known = g.known_as(known_name)
            out.append({**g.as_dict(), "known": known, **({} if known else self._partly_known(g.origin))})
        return out

    def _partly_known(self, origin) -> dict:
        """A new group some known entry names in part: the entry, and the causes it leaves new."""
        if not origin.also:
            return {}  # one cause: known or new, never in part
        for o in self.known:
            uncovered = o.entry.uncovered(origin)
            if len(uncovered) < len(origin.parts()):
                return {"partly_known": o.entry.name, "not_known": [p.label() for p in uncovered]}
        return {}

    @property
    def out_of_step(self) -> list[tuple[str, str]]:
        """(property or saved repro, "<seam> in <file>: <why>") for each check vmfuzz could not make."""
        return ([(r.prop, r.out_of_step) for r in self.results if r.out_of_step and not r.findings]
                + [(str(o.path), o.detail) for o in self.replays if o.status == "out of step"])


def _replays(plan: RunPlan, target, ui, out: list) -> list:
    """Fills ``out`` (the outcome's list) as replays finish: an interrupt keeps what ran."""
    from vmfuzz.harness.engine.regression.regressions import replay_saved
    if plan.profile.replay_repros:
        replay_saved(list(plan.saved), target, source="saved",
                     findings_dir=plan.findings_dir, device=plan.device, isolate=plan.isolate,
                     timeout=plan.example_timeout, out=out)
    if plan.night is not None:
        plan.night.replay_last(target, plan, ui.log, out)
    for o in out:
        tail = "" if o.teeth is not False else f" (warning: no longer fails on {o.recorded_target})"
        ui.log(f"  replay {o.source} {o.path}: {o.status}{': ' + o.detail if o.detail else ''}{tail}")
    return out


def _warn(outcome: RunOutcome, warnings: list[str]) -> None:
    for w in warnings:
        if w not in outcome.warnings:
            outcome.warnings.append(w)
            print(f"vmfuzz: warning: {w}", file=sys.stderr, flush=True)


def _known(plan: RunPlan, target, ui, out: list) -> None:
    """Known findings that apply to this SGLang: replayed plainly first, then attached for the search."""
    from vmfuzz.harness.engine.regression.known import attach, replay_known
    found = [(p, k) for p, k in plan.known if k.repro.property in plan.properties]
    # attached before the replays, which put back what they found: the search then sees every entry
    attach(target, list(plan.known))
    out += replay_known(found, target, findings_dir=plan.findings_dir,
                        device=plan.device, isolate=plan.isolate, timeout=plan.example_timeout)
    from vmfuzz.harness.engine.regression.known import DIFFERENT, GONE
    for o in out:
        state = {GONE: "NO LONGER REPRODUCES (its replay held: retire it or narrow its range)",
                 DIFFERENT: "FAILS DIFFERENTLY (a finding: its repro no longer shows the known origin)"
                 }.get(o.status, o.status)
        ui.log(f"  known finding {o.entry.name} ({o.entry.repro.property}, sglang {o.entry.sglang}): {state}")


def execute(plan: RunPlan, target, show, ui) -> RunOutcome:
    """``show(result)`` prints one property's result, ``ui`` the progress (the caller's, closed here when the
    search ends); returns everything for the reports."""
    t0 = time.monotonic()
    from vmfuzz.harness import __version__
    from vmfuzz.harness.engine.search.database import lost_shared_database, note_lost, start_afresh
    start_afresh()
    # vmfuzz's own version on every target's record: vmfuzz merge refuses shards of two harnesses
    outcome = RunOutcome(plan, target.name, {**target.versions(), "vmfuzz": __version__},
                         dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    lanes = None
    try:
        _warn(outcome, list(plan.warnings))
        names, not_driven = _searchable(plan)
        # a target's one-off work that every forked lane and checker would otherwise repeat alone
        from vmfuzz.harness.engine.core import line_trace
        if not clock.reached():  # past a gate's cap nothing forks: its one-off work would serve nobody
            # the imports a check would make are recorded as the checks' imports, though they run here
            with line_trace.imports_for_checks():
                getattr(target, "before_forks", lambda names: None)(names)
        lanes = _lanes_started(plan, target, names, t0)
        _replays(plan, target, ui, outcome.replays)
        _known(plan, target, ui, outcome.known)
        outcome.unfinished += [o.unfinished for o in outcome.known if o.unfinished]
        outcome.replay_seconds = time.monotonic() - t0
        budget = None if plan.time_budget is None else max(0.0, plan.time_budget - outcome.replay_seconds)
        if clock.running():  # a gate's cap counts from its start: what came before the search is spent
            budget = clock.bounded(budget if budget is not None else clock.cap())
        t1 = time.monotonic()

        def done(res):
            if res.lost_database:
                note_lost(res.lost_database)  # a worker's, said here once for all of them
            show(res, ui.log)
            if res.findings:
                ui.failed()
            ui.advance(examples=res.examples)
            outcome.results.append(res)

        for res in not_driven:
            done(res)
        if lanes is not None:
            from vmfuzz.harness.engine.campaign.parallel import finish_lanes
            t1 = lanes.started  # their search began before the replays: its seconds count from there
            finish_lanes(plan, outcome, lanes, done, t1)
        elif names and plan.workers <= 1:
            _search_here(plan, target, outcome, budget, done, names, ui, t1)
        elif names:
            from vmfuzz.harness.engine.campaign.parallel import search_pool
            search_pool(plan, target, outcome, budget, done, names)
        outcome.search_seconds = time.monotonic() - t1
        if plan.deployment is not None:
            from vmfuzz.harness.engine.search.deployment import deployment_verdict
            found = [f for r in outcome.results for f in r.findings]
            outcome.deployment = deployment_verdict(plan.deployment.file, target, found)
    except KeyboardInterrupt:
        outcome.interrupted = True
    finally:
        if lanes is not None:
            lanes.close()  # ended early (an interrupt, an error): no lane searches on for nobody
        ui.close()
        # this process's own database said it when it happened; the summary keeps it
        outcome.warnings += [w for w in [lost_shared_database()] if w and w not in outcome.warnings]
    from vmfuzz.harness.engine.core.signals import received
    if received() is not None:
        outcome.interrupted = True  # even when a library swallowed the KeyboardInterrupt
    outcome.seconds = time.monotonic() - t0
    if plan.night is not None:
        outcome.history = plan.night.end(outcome, warn=lambda w: _warn(outcome, [w]))
    return outcome


def _searchable(plan: RunPlan) -> tuple[list[str], list[PropertyResult]]:
    """The properties this run searches, and those its deployment leaves not driven (the plan's
    ``not_driven``), reported so, never held."""
    names = list(plan.properties)
    return ([n for n in names if n not in plan.not_driven],
            [PropertyResult(n, not_driven=plan.not_driven[n]) for n in names if n in plan.not_driven])


def _lanes_started(plan: RunPlan, target, names: list[str], t0: float):
    """Lanes searching while this process replays, where this run searches in lanes; else None."""
    from vmfuzz.harness.engine.campaign.parallel import lane_slots, start_lanes
    slots = lane_slots(plan, target, names) if plan.workers <= 1 else None
    if not slots or clock.reached():  # past a gate's cap no lane is forked: nothing would be searched in it
        return None
    from vmfuzz.harness.engine.regression.known import attach
    attach(target, list(plan.known))  # forked with the entries the search sees, as _known attaches them
    end = None if plan.time_budget is None else t0 + plan.time_budget  # the cap counts from the run's start
    # a lane's search stops at the cap by itself; one example past it may still be checking, for at
    # most its timeout: past that too, the lane is killed and its slot could not be checked
    deadline = None if end is None else end + plan.example_timeout + LANE_GRACE
    if clock.running():
        # a gate's cap, from the gate's start: its checkers' waits end at the cap, so a lane hands back
        # what it searched within a part of the grace, or is killed
        end = clock.end()
        deadline = end + min(LANE_GRACE, clock.grace(clock.cap()) / 2)
    return start_lanes(slots, partial(_lane_search, plan, target, end), _lane_done, deadline)


#: seconds a lane is given past the cap and its last example's timeout to hand back what it searched
LANE_GRACE = 15.0


def _search_here(plan: RunPlan, target, outcome: RunOutcome, budget, done, names, ui, t1: float) -> None:
    """The search in this process; records the kernel's share of it."""
    from vmfuzz.harness.engine.campaign.parallel import kernel_share, searcher
    from vmfuzz.harness.guard.tree_write import LAUNCHES
    check, strategies = searcher(plan, target)
    before = LAUNCHES.snapshot()
    try:
        _staged(plan, target, outcome, budget, check, strategies, done, names, ui)
    finally:
        if check is not None:
            check.close()
        launches, secs = (a - b for a, b in zip(LAUNCHES.snapshot(), before))
        outcome.kernel = kernel_share(launches, secs, time.monotonic() - t1)


#: in a lane: its one watched checker (and case strategies), kept for every slot it searches
_lane_searcher: dict = {}


def _lane_search(plan: RunPlan, target, end: float | None, slot: list[str]) -> list[PropertyResult]:
    """One slot searched in a lane, through the plan's bound steps, with the lane's own watched
    checker, under what is left of the run's cap (``end``, every lane's); its results cross back to
    the parent, which shows them."""
    from vmfuzz.harness.engine.campaign.parallel import searcher
    if not _lane_searcher:
        _lane_searcher["lane"] = searcher(plan, target)
    check, strategies = _lane_searcher["lane"]
    kept = RunOutcome(plan, target.name, {}, "")  # the lane's own: only its results cross back
    budget = None if end is None else max(0.0, end - time.monotonic())
    _staged(plan, target, kept, budget, check, strategies, kept.results.append, slot)
    return kept.results


def _lane_done() -> None:
    """A lane's last act: its checker asked to end, so the lines it ran are on disk before the parent
    merges them."""
    check, _ = _lane_searcher.pop("lane", (None, None))
    if check is not None:
        check.close()


def _staged(plan: RunPlan, target, outcome: RunOutcome, budget, check, strategies, done, names,
            ui=None) -> None:
    """The campaign in this process, once per step of ``plan.bounds_steps`` (or once at ``plan.bounds``).

    Each step searches the properties that have not failed yet with an equal
    share of the budget left; a property's result is the sum over the steps.
    """
    steps = tuple(plan.bounds_steps) or (plan.bounds,)
    common = dict(seed=plan.seed, max_examples=plan.max_examples, findings_dir=plan.findings_dir,
                  device=plan.device, database=database_for(plan.profile.database, plan.db_dir, plan.db_url), check=check, strategies=strategies,
                  rounds=plan.profile.rounds, share=plan.share, on_example=ui and ui.example, on_slot=ui and ui.searching)
    if len(steps) == 1:
        outcome.bounds_used.append(dataclasses.asdict(steps[0]))
        run_campaign(target, bounds=steps[0], properties=names, time_budget=budget,
                     on_result=done, **common)
        return
    totals: dict[str, PropertyResult] = {}
    shown: set[str] = set()
    start = time.monotonic()

    def finish(name: str) -> None:
        # printed the moment it is final, not after the last step
        if name not in shown:
            shown.add(name)
            done(totals[name])

    for i, bounds in enumerate(steps):
        left = [n for n in names if n not in shown]
        if not left:
            break
        share = None
        if budget is not None:
            share = budget - (time.monotonic() - start)
            if share < MIN_SHARE:
                never_searched(totals, left, plan.profile.rounds)
                break
            # a fixed-count search's cap is the whole run's, never a step's share
            share *= step_share(i, len(steps)) if plan.profile.rounds else 1.0
        outcome.bounds_used.append(dataclasses.asdict(bounds))
        if ui is not None:
            ui.stepping(i + 1, len(steps))

        def stepped(res, i=i, last=i == len(steps) - 1):
            res.step_seconds = [0.0] * i + [res.seconds]  # steps it sat out (failed before) took none
            t = totals[res.prop] = summed(totals.get(res.prop), res)
            if last or t.findings or t.not_driven or t.out_of_step:
                finish(res.prop)  # no later step searches it

        run_campaign(target, bounds=bounds, properties=left, time_budget=share, on_result=stepped, **common)
    for name in names:
        if name in totals:
            finish(name)
    order = {n: i for i, n in enumerate(plan.properties)}
    outcome.results.sort(key=lambda r: order.get(r.prop, len(order)))  # the summary keeps the plan's order
