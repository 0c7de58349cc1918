"""What a run prints while it runs: a live bar on a terminal, plain lines under CI.

A CI log is read after the fact, by grep: one line per event, no cursor tricks.
A person at a terminal wants to know how long is left. Without a time budget
that is counted in what the run is made of: examples, not properties (one
property can take most of a run). With one, the run ends when the budget is
spent however many examples it gets through (a nightly searches round after
round), so the bar and the ETA follow the clock against the budget, and the
examples are a count, never a fraction of a guessed total.
"""

from __future__ import annotations

import time

from harness.report.terminal import interactive


def budget_left(budget: float, started: float, now: float | None = None) -> float:
    """Seconds of ``budget`` left at ``now`` (monotonic), never negative: the ETA of a budgeted run."""
    return max(0.0, budget - ((time.monotonic() if now is None else now) - started))


class LineProgress:
    """CI output: every line stands alone."""

    def __init__(self, slots: int, label: str, per_slot: int = 1, budget: float | None = None):
        self.slots, self.done = slots, 0

    def log(self, line: str) -> None:
        print(line, flush=True)

    def example(self) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        self.done += n

    def failed(self) -> None:
        pass

    def close(self) -> None:
        pass


class BarProgress:
    """A rich progress bar with an ETA.

    Without a budget: over examples (properties x examples per property). Each
    property is a slot of ``per_slot`` examples: examples fill the slot, a
    property that ends early (a finding, a budget) fills the rest of it.
    With a budget: over the budget's seconds, the ETA being what is left of it.
    """

    def __init__(self, slots: int, label: str, per_slot: int = 1, budget: float | None = None):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        self.console = Console()
        self.per_slot, self.slot_start, self.in_slot = per_slot, 0, 0
        self.budget, self.started, self.examples = budget, time.monotonic(), 0
        self.bar_column = BarColumn(complete_style="green", finished_style="green")
        if budget is None:
            columns = (TextColumn("{task.completed:,.0f}/{task.total:,.0f} examples"), TimeElapsedColumn(),
                       TextColumn("ETA"), TimeRemainingColumn())
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

    def example(self) -> None:
        self.examples += 1
        if self.budget is not None:
            self._tick()
        elif self.in_slot < self.per_slot:
            self.in_slot += 1
            self.bar.update(self.task, completed=self.slot_start + self.in_slot)

    def advance(self, n: int = 1) -> None:
        """``n`` properties finished."""
        if self.budget is not None:
            self._tick()
            return
        self.slot_start += n * self.per_slot
        self.in_slot = 0
        self.bar.update(self.task, completed=self.slot_start)

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


def progress(slots: int, label: str, per_slot: int = 1, budget: float | None = None):
    """A bar on a terminal, plain lines otherwise; the search calls its ``example()`` per example.
    ``budget``: the run's time budget in seconds (its ETA), None when it ends on examples."""
    kind = BarProgress if interactive() else LineProgress
    return kind(slots, label, per_slot, budget)
