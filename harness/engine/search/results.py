"""What a search found: one property's result (examples, classes, margins, findings) and each finding."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from vmfuzz.harness.engine.search.cases import bs_ratio_bucket, case_shape, note_reached
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.origin import Origin


@dataclass
class Finding:
    prop: str
    #: words for a person; nothing reads it back (``origin`` says which failure it is)
    detail: str
    path: Path
    config: Config
    batches: list[Batch]
    kind: str = "property"  # or "target-crash" / "target-hang" (vmfuzz.harness.engine.core.isolation)
    origin: Origin | None = None

    def __post_init__(self):
        if self.origin is None:  # a crash or hang recorded without one still has a cause
            if self.kind == "property":
                raise ValueError(f"a {self.prop} finding needs its origin")
            self.origin = Origin(self.prop, self.kind.removeprefix("target-"))


@dataclass
class Stuck:
    """The case a search was on when vmfuzz fell out of step: what a gate's base is asked to run.

    ``members``: the properties judged on it together (one, or a shared group's); ``raised``: the
    code under test's own raise behind a set-up's out of step (type, frame, message), else None."""
    members: tuple[str, ...]
    config: Config
    batches: list[Batch]
    raised: tuple[str, str, str] | None = None
    #: the seam it fell out of step at ("the target verify runner's set-up")
    seam: str = ""

    @classmethod
    def on(cls, name: str, config: Config, batches: list[Batch], exc) -> "Stuck":
        """``exc`` (an ``OutOfStep``) met by ``name``'s check of the case, its code's own raise read now."""
        from vmfuzz.harness.engine.core.failures import own_raise
        return cls((name,), config, list(batches), own_raise(exc), exc.seam)

    def of(self, members: tuple[str, ...]) -> "Stuck":
        """The same case, judged by a shared group's ``members`` together."""
        return Stuck(tuple(members), self.config, self.batches, self.raised, self.seam)


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
    skipped: bool = False  # the time budget ran out before this property's search started
    #: a fixed-count search (the pr profile) stopped by its time cap before its full count:
    #: could not check, never held (``planned``: the count it would have run)
    cut_short: bool = False
    planned: int = 0
    #: why the property was not driven at all (the target lacks a seam it needs); never "held"
    not_driven: str | None = None
    #: vmfuzz is out of step with the target's code ("<seam> in <file>: <why>"): could not check, never held
    out_of_step: str | None = None
    #: the case it fell out of step on (None: none, or the search lane was lost)
    stuck: Stuck | None = None
    #: its search lane was lost (killed, or past the run's cap): ``out_of_step`` says why; could not
    #: check whatever the change touched, since nothing of the property was searched
    lane_lost: bool = False
    #: the largest shape each case dimension reached (d, topk, spec_steps, max_bs, max_context_len, bs)
    reached: dict = field(default_factory=dict)
    #: a shared group's classes per member, from the batches each judged (``Observation.by_property``)
    member_classes: dict = field(default_factory=dict)
    #: the deep boundary cases it ran (vmfuzz.harness.engine.search.deep_corpus), by label
    corpus: list[str] = field(default_factory=list)
    corpus_seconds: float = 0.0
    #: seconds spent at each bound step, in order (a nightly widens its bounds in steps)
    step_seconds: list[float] = field(default_factory=list)
    #: in a worker: why its shared example database went local (its parent says it, once a run)
    lost_database: str | None = None
    #: the shared run it was judged on (``shared.group_name`` of its first round's members):
    #: its ``seconds`` are its share of that run, whose time the reports show once
    shared_run: str | None = None

    @property
    def findings(self) -> list[Finding]:
        return ([self.finding] if self.finding else []) + self.faults

    @property
    def unchecked(self) -> bool:
        """The time ran out before this property was checked (cut short, or never searched):
        could not check (exit 3), never held; a finding or an out-of-step seam says more."""
        return (self.cut_short or self.skipped) and not (self.findings or self.not_driven or self.out_of_step)

    def counted(self, seconds: float, explicit: int, max_examples: int) -> "PropertyResult":
        """One round's seconds and the count it would have run to its end: Hypothesis's max_examples
        after the explicit cases (fewer only when it exhausts the strategy, a function of the seed).
        Stopped before any example past its fixed cases, the search itself never ran: skipped."""
        self.seconds = seconds
        self.planned = explicit + max_examples
        self.skipped = self.cut_short and self.examples <= explicit
        return self

    def timed(self, searched: bool, rounds: bool) -> "PropertyResult":
        """What the clock did to a finished search. Skipped: no round got past its fixed cases.
        In rounds the budget is a search's legitimate end: only a fixed-count search (pr)
        stays cut short by its time cap."""
        self.skipped = not searched
        self.cut_short = self.cut_short and not rounds
        return self

    def note(self, obs, config: Config, steps: list[Batch], *, searched: bool = True) -> None:
        """One example that held: its classes, margins and shape (``reached``: the search's only,
        so a deep corpus case past the bounds does not read as the search reaching it)."""
        self.classes.update(obs.classes)
        for name, classes in getattr(obs, "by_property", {}).items():
            self.member_classes.setdefault(name, Counter()).update(classes)
        self.max_margin = max(self.max_margin, obs.margin)
        self.margins.append(obs.margin)
        self.path_margins += sorted(getattr(obs, "path_margins", {}).items())
        self.bs_ratio.update(bs_ratio_bucket(b.bs, config.max_bs) for b in steps)
        if searched:
            note_reached(self.reached, case_shape(config, steps))

    def note_corpus(self, label: str, seconds: float) -> None:
        """One deep boundary case that held, and the seconds it took."""
        self.corpus.append(label)
        self.corpus_seconds += seconds

    def merge(self, other: "PropertyResult") -> None:
        self.examples += other.examples
        self.classes.update(other.classes)
        for name, classes in other.member_classes.items():
            self.member_classes.setdefault(name, Counter()).update(classes)
        self.max_margin = max(self.max_margin, other.max_margin)
        self.seconds += other.seconds
        self.finding = self.finding or other.finding
        self.out_of_step = self.out_of_step or other.out_of_step
        self.stuck = self.stuck or other.stuck
        self.cut_short = self.cut_short or other.cut_short
        self.planned += other.planned
        self.faults += other.faults
        self.margins += other.margins
        self.path_margins += other.path_margins
        self.bs_ratio.update(other.bs_ratio)
        self.rounds += other.rounds
        note_reached(self.reached, other.reached)
        self.corpus += [c for c in other.corpus if c not in self.corpus]
        self.corpus_seconds += other.corpus_seconds
        self.shared_run = self.shared_run or other.shared_run
        n = max(len(self.step_seconds), len(other.step_seconds))
        mine, theirs = (self.step_seconds + [0.0] * n)[:n], (other.step_seconds + [0.0] * n)[:n]
        self.step_seconds = [a + b for a, b in zip(mine, theirs)]
