"""What a run prints while it runs: a live bar on a terminal, plain lines under CI.

A CI log is read after the fact, by grep: one line per event, no cursor tricks.
A person at a terminal wants to know how long is left. Without a time budget
that is counted in what the run is made of: examples, not properties (one
property can take most of a run). With one, the run ends when the budget is
spent however many examples it gets through (a nightly searches round after
round), so the bar and the ETA follow the clock against the budget, and the
examples are a count, never a fraction of a guessed total.

Under CI a run can be silent for minutes (an example at a nightly's widest
bounds takes tens of seconds in the Triton interpreter), and a silent job is
what a runner's no-output watchdog kills. So CI output has a heartbeat: a line
whenever nothing was printed for ``HEARTBEAT_S`` seconds, with the bound step,
the property being searched, the examples done and the time elapsed.
"""

from __future__ import annotations

import threading
import time

from vmfuzz.harness.report.terminal import in_ci, interactive

HEARTBEAT_S = 15.0


def budget_left(budget: float, started: float, now: float | None = None) -> float:
    """Seconds of ``budget`` left at ``now`` (monotonic), never negative: the ETA of a budgeted run."""
    return max(0.0, budget - ((time.monotonic() if now is None else now) - started))


def _clock(seconds: float) -> str:
    m, sec = divmod(int(seconds), 60)
    return f"{m}m{sec:02d}s" if m else f"{sec}s"


class FixedCount:
    """Examples done of a fixed count (the pr profile), counted as the summary counts them.

    ``slots`` properties of ``per_slot`` examples each is the plan. A shared run's example is one
    example of each property it judges; a property's fixed boundary cases are examples too, so the
    bar ends where the summary's total is. The plan is corrected as each property finishes: its
    boundary cases come on top of its ``per_slot``, and one that ends early (a finding, not driven)
    ran fewer. ``clock`` is injectable for tests."""

    def __init__(self, slots: int, per_slot: int, clock=time.monotonic):
        self.planned, self.per_slot, self.clock = slots * per_slot, per_slot, clock
        self.finished, self.in_slot, self.weight = 0, 0, 1
        self.slot_began: float | None = None
        #: examples are said one by one (an in-process search); a pool's workers only report results
        self.live = False
        #: seconds per example of each finished search (a shared run is one), the ETA's measure
        self.rates: list[float] = []

    @property
    def done(self) -> int:
        return self.finished + self.in_slot

    @property
    def total(self) -> int:
        # a slot past its plan (its boundary cases) stretches the total rather than overfill the bar
        return self.planned + max(0, self.in_slot - self.weight * self.per_slot)

    def searching(self, names: list[str]) -> None:
        self.weight = len(names)
        self.slot_began = self.clock()

    def example(self) -> None:
        if self.slot_began is None:
            self.slot_began = self.clock()
        self.in_slot += self.weight
        self.live = True

    def advance(self, n: int = 1, examples: int = 0) -> None:
        """``n`` properties finished: the plan takes what they ran instead of what was planned.
        ``examples``: what they ran, taken only where no example was said live (a pool's results)."""
        if not self.live:
            self.in_slot += examples
        if self.in_slot and self.slot_began is not None:
            self.rates.append((self.clock() - self.slot_began) / self.in_slot)
        self.planned += self.in_slot - n * self.per_slot
        self.finished += self.in_slot
        self.in_slot, self.slot_began = 0, None

    def eta(self, now: float | None = None) -> float | None:
        """Seconds left, from measured rates: the running search's own rate for the rest of its slots,
        the finished searches' mean for the properties not begun. None until one rate is measured
        (a guess from the cap would be no measure at all)."""
        now = self.clock() if now is None else now
        current = None
        if self.in_slot and self.slot_began is not None:
            current = (now - self.slot_began) / self.in_slot
        known = self.rates or ([current] if current is not None else [])
        if not known:
            return None
        mean = sum(known) / len(known)
        in_slot_left = max(0, self.weight * self.per_slot - self.in_slot)
        later = max(0, self.planned - self.finished - max(self.in_slot, self.weight * self.per_slot))
        return in_slot_left * (current if current is not None else mean) + later * mean


class Heartbeat:
    """The line CI gets when nothing else was said for ``every`` seconds. ``clock`` is injectable
    (a test drives ``tick`` with its own times); ``start`` runs the ticks on a daemon thread, so a
    single example longer than ``every`` still gets its lines."""

    def __init__(self, say, *, fixed: FixedCount | None = None, budget: float | None = None,
                 every: float = HEARTBEAT_S, clock=time.monotonic):
        self.say, self.fixed, self.budget, self.every, self.clock = say, fixed, budget, every, clock
        self.started = self.last = clock()
        self.examples, self.step, self.searching = 0, "", ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def heard(self) -> None:
        """A line was printed: the next heartbeat is due ``every`` seconds from now."""
        self.last = self.clock()

    def line(self, now: float) -> str:
        elapsed = now - self.started
        parts = [p for p in (self.step, self.searching) if p]
        done = f"{self.examples:,} examples"
        if self.fixed is not None and self.fixed.total:
            part, total = self.fixed.done, self.fixed.total
            done += f", {100 * part // total}% of the fixed count"
            left = self.fixed.eta(now)
            if left is not None and part < total:  # at the rates measured so far
                done += f", ETA {_clock(left)}"
        elif self.budget is not None:
            done += f", budget left {_clock(budget_left(self.budget, self.started, now))}"
        return f"  heartbeat: {', '.join(parts + [done])}, {_clock(elapsed)} elapsed"

    def tick(self, now: float | None = None) -> str | None:
        """Says the heartbeat when one is due; returns the line said, if any."""
        now = self.clock() if now is None else now
        if now - self.last < self.every:
            return None
        self.last = now
        text = self.line(now)
        self.say(text)
        return text

    def start(self) -> "Heartbeat":
        def beat():
            while not self._stop.wait(1.0):
                self.tick()
        self._thread = threading.Thread(target=beat, name="vmfuzz-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class LineProgress:
    """CI output: every line stands alone; under CI a heartbeat keeps a silent search heard."""

    def __init__(self, slots: int, label: str, per_slot: int = 1, budget: float | None = None,
                 heartbeat: bool = False):
        self.slots, self.done = slots, 0
        self.count = None if budget is not None else FixedCount(slots, per_slot)
        self._lock = threading.Lock()
        self.heart = Heartbeat(self._say, fixed=self.count, budget=budget).start() if heartbeat else None

    def _say(self, line: str) -> None:
        with self._lock:  # the heartbeat's thread and the run's never split a line
            print(line, flush=True)

    def log(self, line: str) -> None:
        self._say(line)
        if self.heart is not None:
            self.heart.heard()

    def stepping(self, i: int, n: int) -> None:
        """Bound step ``i`` (1-based) of ``n`` begins."""
        if self.heart is not None:
            self.heart.step = f"bound step {i}/{n}"

    def searching(self, names: list[str]) -> None:
        """The properties the search turns to now (a shared run judges several on each example)."""
        if self.heart is not None:
            self.heart.searching = names[0] if len(names) == 1 else f"shared run of {len(names)} properties"
        if self.count is not None:
            self.count.searching(names)

    def example(self) -> None:
        if self.heart is not None:
            self.heart.examples += 1
        if self.count is not None:
            self.count.example()

    def advance(self, n: int = 1, examples: int = 0) -> None:
        self.done += n
        if self.count is not None:
            self.count.advance(n, examples)

    def failed(self) -> None:
        pass

    def close(self) -> None:
        if self.heart is not None:
            self.heart.stop()


class BarProgress:
    """A rich progress bar with an ETA.

    Without a budget: over examples (properties x examples per property). Each
    property is a slot of ``per_slot`` examples: examples fill the slot, a
    property that ends early (a finding, a budget) fills the rest of it.
    With a budget: over the budget's seconds, the ETA being what is left of it.
    """

    def __init__(self, slots: int, label: str, per_slot: int = 1, budget: float | None = None):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
        self.console = Console()
        self.count = FixedCount(slots, per_slot)
        self.budget, self.started, self.examples = budget, time.monotonic(), 0
        self.bar_column = BarColumn(complete_style="green", finished_style="green")
        if budget is None:
            columns = (TextColumn("{task.completed:,.0f}/{task.total:,.0f} examples"), TimeElapsedColumn(),
                       _MeasuredLeft(self.count))
        else:
            columns = (TextColumn("{task.fields[examples]:,} examples"), TimeElapsedColumn(),
                       _BudgetLeft(self))
        self.bar = Progress(TextColumn("[bold]{task.description}"), self.bar_column, *columns,
                            console=self.console, transient=True)
        self.bar.start()
        self.task = self.bar.add_task(label, total=slots * per_slot if budget is None else max(budget, 1e-9),
                                      examples=0)

    def log(self, line: str) -> None:
        from rich.text import Text
        self.console.print(Text.from_ansi(line), highlight=False)

    def _tick(self) -> None:
        spent = min(time.monotonic() - self.started, self.budget)
        self.bar.update(self.task, completed=spent, examples=self.examples)

    def stepping(self, i: int, n: int) -> None:
        pass

    def searching(self, names: list[str]) -> None:
        self.count.searching(names)

    def example(self) -> None:
        self.examples += 1
        if self.budget is not None:
            self._tick()
        else:
            self.count.example()
            self.bar.update(self.task, completed=self.count.done, total=self.count.total)

    def advance(self, n: int = 1, examples: int = 0) -> None:
        """``n`` properties finished, having run ``examples`` (see ``FixedCount.advance``)."""
        if self.budget is not None:
            self._tick()
            return
        self.count.advance(n, examples)
        self.bar.update(self.task, completed=self.count.done, total=self.count.total)

    def failed(self) -> None:
        """A finding: the bar turns red for the rest of the run."""
        self.bar_column.complete_style = self.bar_column.finished_style = "red"

    def close(self) -> None:
        self.bar.stop()


def _BudgetLeft(owner: BarProgress):
    """The ETA column of a budgeted run: the budget left, recomputed at every refresh
    (not extrapolated from a rate). Built here so rich is imported only for a bar."""
    import datetime as dt

    from rich.progress import ProgressColumn
    from rich.text import Text

    class BudgetLeft(ProgressColumn):
        def render(self, task):
            left = budget_left(owner.budget, owner.started)
            return Text(f"ETA {dt.timedelta(seconds=round(left))} (budget)", style="progress.remaining")

    return BudgetLeft()


def _MeasuredLeft(count: FixedCount):
    """The ETA column of a fixed count: ``FixedCount.eta``, blank until a rate is measured."""
    import datetime as dt

    from rich.progress import ProgressColumn
    from rich.text import Text

    class MeasuredLeft(ProgressColumn):
        def render(self, task):
            left = count.eta()
            shown = "-:--:--" if left is None else str(dt.timedelta(seconds=round(left)))
            return Text(f"ETA {shown}", style="progress.remaining")

    return MeasuredLeft()


def progress(slots: int, label: str, per_slot: int = 1, budget: float | None = None):
    """A bar on a terminal, plain lines otherwise; the search calls its ``example()`` per example.
    ``budget``: the run's time budget in seconds (its ETA), None when it ends on examples."""
    if interactive():
        return BarProgress(slots, label, per_slot, budget)
    return LineProgress(slots, label, per_slot, budget, heartbeat=in_ci())
