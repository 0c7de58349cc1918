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
from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Phase, event, example, given, seed as hseed, settings, strategies as st
from hypothesis.database import ExampleDatabase
from hypothesis import target as hypothesis_target

from harness.config import CALL_SITES, Batch, Config, site_takes
from harness.isolation import TargetFault, TargetRaised
from harness.layouts import TreeMaskMode
from harness.progress import example_done
from harness.properties import PROPERTIES, Property, PropertyFailure, shared_group
from harness.properties.shared import group_members
from harness.repro_file import dump, from_case
from harness.signals import check as interrupt_check
from strategies import batches, chain_configs, configs, step_sequences, trivial_configs


@dataclass(frozen=True)
class Bounds:
    """Size ceiling of generated cases: keeps one example in the millisecond range."""

    max_bs: int = 8
    max_context_len: int = 64
    num_draft_tokens: int = 8
    topk: int = 4
    spec_steps: int = 4
    overshoot: int = 8
    #: the call sites cases are drawn through (a target without one of SGLang's narrows it)
    call_sites: tuple[str, ...] = CALL_SITES


def cases(prop: Property, bounds: Bounds) -> st.SearchStrategy[tuple[Config, list[Batch]]]:
    if prop.trivial:
        cfgs = trivial_configs(max_bs=(1, bounds.max_bs), max_context_len=(1, bounds.max_context_len),
                               call_sites=[c for c in bounds.call_sites if c not in ("chain", "frozen_kv_mtp")]
                               or ["eagle"])
    elif prop.chain:
        cfgs = chain_configs(max_bs=(1, bounds.max_bs), max_context_len=(1, bounds.max_context_len),
                             spec_steps=(1, max(1, min(bounds.spec_steps, bounds.num_draft_tokens - 1))),
                             call_sites=bounds.call_sites)
    else:
        cfgs = configs(layouts=prop.layouts, max_bs=(1, bounds.max_bs), max_context_len=(1, bounds.max_context_len),
                       num_draft_tokens=(2, bounds.num_draft_tokens), topk=(1, bounds.topk),
                       spec_steps=(1, bounds.spec_steps), call_sites=bounds.call_sites)

    # One case strategy per config, built once: flatmap calls this for every example.
    @lru_cache(maxsize=8192)
    def with_batches(config: Config):
        if prop.steps:
            steps = step_sequences(config, overshoot=bounds.overshoot)
        else:
            steps = batches(config, overshoot=bounds.overshoot).map(lambda b: [b])
        # partial, not a lambda: Hypothesis prints a lambda's source (``(config, bs)``),
        # which hides the config's fields in a failure report
        return steps.map(partial(_case, config))

    return cfgs.flatmap(with_batches)


def _case(config: Config, steps: list[Batch]) -> tuple[Config, list[Batch]]:
    return config, steps


def boundary_cases(prop: Property, bounds: Bounds) -> list[tuple[Config, list[Batch]]]:
    """A seed corpus run before the search: each layout at the capacity boundary.

    Hypothesis starts from minimal examples and then mutates their tails, so its
    first dozen cases share one config; the boundary classes of DESIGN.md
    section 2 (bs = max_bs, bs = max_bs + 1, every request at the context limit,
    both layouts) are too important to wait for. The cases are as small as the
    classes allow (max_bs 1, d 2, two prefix columns), because Hypothesis does
    not shrink an explicit example: a failure here is written as it stands.
    """
    c = min(2, bounds.max_context_len)  # two prefix columns: stale cells differ from a fill
    shape = (1, 1, 0) if prop.trivial else (2, 1, 1)
    out = []
    for mode in (TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY):
        if prop.chain and mode != TreeMaskMode.QLEN_ONLY:
            continue
        # Every call site meets the boundary: (2, 1, 1) in QLEN_ONLY is a chain,
        # so the chain branch does too. The default call site keeps its place first.
        for site in ("eagle", "pp", "chain", "frozen_kv_mtp"):
            config = Config(mode, 1, c, *shape, True, site)
            if (not site_takes(site, config) or site != "eagle" and prop.chain
                    or site not in bounds.call_sites):
                continue
            at, past = Batch((c,)), Batch((c, c))
            if prop.steps:
                out.append((config, [at, past]))  # a captured step leaves its cells, then an eager one
            else:
                out.extend([(config, [past]), (config, [at])])
    return out


@dataclass
class Finding:
    prop: str
    detail: str
    path: Path
    config: Config
    batches: list[Batch]
    kind: str = "property"  # or "target-crash" / "target-hang" (harness.isolation)


@dataclass
class PropertyResult:
    prop: str
    examples: int = 0
    classes: Counter = field(default_factory=Counter)
    max_margin: float = float("-inf")
    seconds: float = 0.0
    finding: Finding | None = None
    #: seconds from the start of the search to the first failing example (before shrinking)
    seconds_to_failure: float | None = None
    #: crashes and hangs: the search went on past them, so there can be several
    faults: list[Finding] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)
    #: (path, margin) per example and path its steps took (reuse / fallback / arithmetic): a
    #: fallback batch needing more than the preallocated buffer is the design working, not an overflow
    path_margins: list[tuple[str, float]] = field(default_factory=list)
    bs_ratio: Counter = field(default_factory=Counter)
    rounds: int = 0
    skipped: bool = False  # the time budget ran out before this property started
    #: why the property was not driven at all (the target lacks a seam it needs); never "held"
    not_driven: str | None = None
    #: the largest shape each case dimension reached (d, topk, spec_steps, max_bs, max_context_len, bs)
    reached: dict = field(default_factory=dict)

    @property
    def findings(self) -> list[Finding]:
        return ([self.finding] if self.finding else []) + self.faults

    def merge(self, other: "PropertyResult") -> None:
        self.examples += other.examples
        self.classes.update(other.classes)
        self.max_margin = max(self.max_margin, other.max_margin)
        self.seconds += other.seconds
        self.finding = self.finding or other.finding
        self.faults += other.faults
        self.margins += other.margins
        self.path_margins += other.path_margins
        self.bs_ratio.update(other.bs_ratio)
        self.rounds += other.rounds
        note_reached(self.reached, other.reached)


def note_reached(into: dict, shape: dict) -> None:
    for k, v in shape.items():
        into[k] = max(into.get(k, v), v)


def case_shape(config: Config, steps: list[Batch]) -> dict:
    return {"d": config.d, "topk": config.topk, "spec_steps": config.spec_steps, "max_bs": config.max_bs,
            "max_context_len": config.max_context_len, "bs": max((b.bs for b in steps), default=0)}


def bs_ratio_bucket(bs: int, max_bs: int) -> str:
    """Where a batch sits against the captured max_bs: the axis the regression lives on."""
    r = bs / max_bs
    if bs == max_bs:
        return "= 1"
    if r < 0.5:
        return "< 0.5"
    if r < 1:
        return "0.5-1"
    if r <= 1.5:
        return "1-1.5"
    if r <= 2:
        return "1.5-2"
    return "> 2"


class KeyedDatabase(ExampleDatabase):
    """One property's slice of a shared example database.

    Every property's search is the same inner function, so Hypothesis would give
    them one database key; the prefix keeps their examples apart.
    """

    def __init__(self, inner: ExampleDatabase, prefix: str):
        super().__init__()
        self.inner, self.prefix = inner, prefix.encode() + b"/"

    def save(self, key, value):
        self.inner.save(self.prefix + key, value)

    def fetch(self, key):
        yield from self.inner.fetch(self.prefix + key)

    def delete(self, key, value):
        self.inner.delete(self.prefix + key, value)

    def move(self, src, dest, value):
        self.inner.move(self.prefix + src, self.prefix + dest, value)


class HarnessError(RuntimeError):
    """The harness failed, not the target: reported as such (exit 2), never as a finding."""


MIN_SHARE = 1.0  # seconds any property gets under a time budget


class _OutOfTime(BaseException):
    """Ends a search at its deadline. A BaseException, so Hypothesis stops at
    once instead of treating it as a failure to shrink."""


def run_property(target, prop: Property, *, seed: int, max_examples: int, bounds: Bounds,
                 findings_dir: Path, device: str = "cpu", database=None, deadline: float | None = None,
                 check: Callable | None = None, strategy=None, faulted: set[str] | None = None) -> PropertyResult:
    """One Hypothesis search for ``prop``.

    ``deadline`` (time.monotonic) stops generating new examples once passed;
    ``check`` replaces ``prop.check`` (an isolated worker); ``strategy``
    replaces the default case strategy (a deployment-scoped search);
    ``faulted`` holds the fault kinds already saved (one finding per kind).
    """
    result = PropertyResult(prop.name, rounds=1)
    state = {"case": None, "failed": False}
    faulted = set() if faulted is None else faulted
    run_check = check or (lambda p, c, b, dev: p.check(target, c, b, dev))
    db = KeyedDatabase(database, prop.name) if database is not None else None

    @settings(max_examples=max_examples, deadline=None, database=db, print_blob=False,
              report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
              # No Phase.target: hill-climbing the overflow margin held a search on
              # one large config for hundreds of examples (measured on the sparse
              # benchmark, PERFORMANCE.md); the margin is still recorded.
              phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
    @hseed(seed)
    @given(strategy if strategy is not None else cases(prop, bounds))
    def search(case):
        # Past the deadline, skip new examples; never while shrinking a failure,
        # or Hypothesis would see the failing example stop failing.
        if not state["failed"] and deadline is not None and time.monotonic() > deadline:
            raise _OutOfTime
        interrupt_check()  # a Ctrl-C that Hypothesis or a gc callback swallowed ends the search here
        state["case"] = case
        config, steps = case
        # Counted before the check: "examples to first detection" includes the failing one.
        if not state["failed"]:
            result.examples += 1
            example_done()
        try:
            obs = run_check(prop, config, steps, device)
        except TargetFault as fault:
            # Shrinking a crash would re-crash (or re-hang for the full timeout)
            # dozens of times: save it as found and let the search go on.
            if fault.kind not in faulted:
                faulted.add(fault.kind)
                result.faults.append(_record(target, _owner(prop), fault.detail, case, seed, findings_dir,
                                             kind=fault.kind))
            return
        except Exception:
            if not state["failed"]:
                result.seconds_to_failure = time.perf_counter() - start
            state["failed"] = True
            raise
        except (SystemExit, KeyboardInterrupt) as exc:
            # A target that calls exit() (or raises KeyboardInterrupt itself) is a
            # target that raised: as a plain exception Hypothesis shrinks it like
            # any failure, instead of the run ending with the target's exit code.
            from harness.signals import from_user
            if isinstance(exc, KeyboardInterrupt) and from_user(exc):
                raise
            if not state["failed"]:
                result.seconds_to_failure = time.perf_counter() - start
            state["failed"] = True
            raise TargetRaised(f"{type(exc).__name__}({exc})") from None
        if not state["failed"]:
            result.classes.update(obs.classes)
            result.max_margin = max(result.max_margin, obs.margin)
            result.margins.append(obs.margin)
            result.path_margins += sorted(getattr(obs, "path_margins", {}).items())
            result.bs_ratio.update(bs_ratio_bucket(b.bs, config.max_bs) for b in steps)
            note_reached(result.reached, case_shape(config, steps))
        for cls in sorted(obs.classes):
            event(cls)
        if math.isfinite(obs.margin):  # a case that wrote no step has no margin to report
            hypothesis_target(obs.margin, label="overflow margin (cells)")

    # A deployment-scoped search keeps to its deployment: no corpus outside it.
    for case in reversed(boundary_cases(prop, bounds) if strategy is None else []):
        search = example(case)(search)
    start = time.perf_counter()
    try:
        search()
    except PropertyFailure as exc:
        result.finding = _record(target, _owner(prop, exc), exc.detail, state["case"], seed, findings_dir)
    except _OutOfTime:
        pass  # the budget is spent: what ran so far stands
    except Exception as exc:  # the target itself broke on this case: that is a finding too
        if not state["failed"] or state["case"] is None:
            # Raised while generating, not by the target: the harness's own error, never a finding.
            raise HarnessError(f"property {prop.name}: the search itself failed: {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
        what = str(exc) if isinstance(exc, TargetRaised) else f"{type(exc).__name__}: {exc}"
        result.finding = _record(target, _owner(prop), f"target raised {what}", state["case"], seed, findings_dir)
    result.seconds = time.perf_counter() - start
    return result


def _owner(prop: Property, exc: Exception | None = None) -> str:
    """The property a finding is filed under: a shared group's failure names its failing member."""
    members = group_members(prop.name)
    if members is None:
        return prop.name
    return exc.prop if isinstance(exc, PropertyFailure) and exc.prop in members else members[0]


def _record(target, prop: str, detail: str, case, seed: int, findings_dir: Path,
            kind: str = "property") -> Finding:
    config, steps = case
    # A target's message may carry anything: keep what JSON, XML and a terminal can hold.
    detail = detail.encode("utf-8", "backslashreplace").decode("utf-8")
    fault = None if kind == "property" else kind
    repro = from_case(target.name, prop, config, steps, detail=detail, seed=seed, fault=fault)
    stem = prop if fault is None else f"{prop}-{fault}"
    path = findings_dir / f"{stem}.json"
    n = 1
    while path.exists():
        n += 1
        path = findings_dir / f"{stem}-{n}.json"
    path = dump(repro, path)  # a broken findings_dir sends it to a fallback place
    return Finding(prop, detail, path, config, steps, kind)


def search_property(target, prop: Property, *, seed: int, max_examples: int, bounds: Bounds,
                    findings_dir: Path, device: str = "cpu", database=None, deadline: float | None = None,
                    check: Callable | None = None, strategy=None, rounds: bool = True) -> PropertyResult:
    """``run_property`` in rounds until ``deadline``: a time-budgeted search.

    Without a deadline this is one round of ``max_examples``. With one, each
    further round draws a new seed (derived from ``seed``, so the run stays
    reproducible) until the deadline, a property failure, or a round that
    found nothing new to try.
    """
    total = PropertyResult(prop.name)
    missing = prop.missing(target)
    if missing:
        total.not_driven = f"target {target.name} has no {', '.join(missing)}"
        return total
    if deadline is not None and time.monotonic() >= deadline:
        total.skipped = True
        return total
    rnd, faulted = 0, set()
    while True:
        res = run_property(target, prop, seed=seed + rnd * 1_000_003, max_examples=max_examples,
                           bounds=bounds, findings_dir=findings_dir, device=device, database=database,
                           deadline=deadline, check=check, strategy=strategy, faulted=faulted)
        total.merge(res)
        rnd += 1
        if not rounds or deadline is None or total.finding or time.monotonic() >= deadline or res.examples == 0:
            return total


def run_campaign(target, *, seed: int, max_examples: int, bounds: Bounds, findings_dir: Path,
                 properties: list[str] | None = None, device: str = "cpu", database=None,
                 time_budget: float | None = None, check: Callable | None = None,
                 strategies: dict | None = None, rounds: bool = True,
                 on_result: Callable[[PropertyResult], None] = lambda r: None,
                 share: bool = True) -> list[PropertyResult]:
    """Every property in turn, in this process.

    With ``rounds``, ``time_budget`` is shared out evenly (each property searches
    its share); without, it is only a cap on the whole run. With ``share``, the
    properties that opted in are searched together (``search_shared``).
    """
    names = list(properties or PROPERTIES)
    results = []
    start = time.monotonic()
    group = shareable(target, names, strategies) if share else []
    slots = [group] if group else []
    slots += [[n] for n in names if n not in group]
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
        if len(slot) > 1:
            out = search_shared(target, [PROPERTIES[n] for n in slot], seed=seed, max_examples=max_examples,
                                bounds=bounds, findings_dir=findings_dir, device=device, database=database,
                                deadline=deadline, check=check, rounds=rounds)
        else:
            out = [search_property(target, PROPERTIES[slot[0]], seed=seed, max_examples=max_examples,
                                   bounds=bounds, findings_dir=findings_dir, device=device, database=database,
                                   deadline=deadline, check=check, strategy=(strategies or {}).get(slot[0]),
                                   rounds=rounds)]
        for res in out:
            on_result(res)
            results.append(res)
    order = {n: i for i, n in enumerate(names)}
    results.sort(key=lambda r: order[r.prop])
    return results


def shareable(target, names: list[str], strategies: dict | None = None) -> list[str]:
    """The properties among ``names`` that one shared search can judge together on this target.

    Only those that opted in (``Property.shared``), have every seam they need,
    and keep to the default case strategy (a deployment-scoped search keeps its
    own); fewer than two share nothing.
    """
    group = [n for n in names if PROPERTIES[n].shared and not PROPERTIES[n].missing(target)
             and (strategies or {}).get(n) is None]
    return group if len(group) > 1 else []


def search_shared(target, props: list[Property], *, seed: int, max_examples: int, bounds: Bounds,
                  findings_dir: Path, device: str = "cpu", database=None, deadline: float | None = None,
                  check: Callable | None = None, rounds: bool = True) -> list[PropertyResult]:
    """One search for several shared properties: each case run once, every member judged on it.

    A failure is shrunk for the member that failed (once a member fails, the
    search judges only it), recorded under its name, and the search goes on
    for the members left, each round a fresh seed, until all failed or the
    budget (with ``rounds``) or one round of ``max_examples`` (without) is spent.
    Each member's result counts every case judged for it as one example.
    """
    totals = {p.name: PropertyResult(p.name) for p in props}
    active = [p.name for p in props]
    run_check = check or (lambda p, c, b, dev: p.check(target, c, b, dev))
    rnd, faulted = 0, set()
    while active:
        if deadline is not None and time.monotonic() >= deadline:
            for n in active:
                totals[n].skipped = totals[n].examples == 0
            break
        state = {"failed": None}
        members = tuple(active)

        def judged(group, config, steps, dev, members=members, state=state):
            names = (state["failed"],) if state["failed"] else members
            try:
                return run_check(shared_group(names), config, steps, dev)
            except PropertyFailure as exc:
                state["failed"] = state["failed"] or exc.prop
                raise

        res = run_property(target, shared_group(members), seed=seed + rnd * 1_000_003, max_examples=max_examples,
                           bounds=bounds, findings_dir=findings_dir, device=device, database=database,
                           deadline=deadline, check=judged, faulted=faulted)
        rnd += 1
        for n in members:
            part = PropertyResult(n, examples=res.examples, classes=res.classes.copy(), max_margin=res.max_margin,
                                  seconds=res.seconds / len(members), margins=list(res.margins),
                                  path_margins=list(res.path_margins), bs_ratio=res.bs_ratio.copy(), rounds=1,
                                  reached=dict(res.reached))
            totals[n].merge(part)
        if res.faults:
            totals[members[0]].faults += res.faults
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
    return [totals[p.name] for p in props]
