"""What a run prints while it runs: a live bar on a terminal, plain lines under CI.

A CI log is read after the fact, by grep: one line per event, no cursor tricks.
A person at a terminal wants to know how long is left, counted in what the run
is made of: examples, not properties (one property can take most of a run).
"""

from __future__ import annotations

from harness.report.terminal import interactive

class LineProgress:
    """CI output: every line stands alone."""

    def __init__(self, slots: int, label: str, per_slot: int = 1):
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
    """A rich progress bar over examples (properties x examples per property), with ETA.

    Each property is a slot of ``per_slot`` examples: examples fill the slot, a
    property that ends early (a finding, a budget) fills the rest of it, and a
    time-budgeted search that runs further rounds never pushes the bar past its slot.
    """

    def __init__(self, slots: int, label: str, per_slot: int = 1):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        self.console = Console()
        self.per_slot, self.slot_start, self.in_slot = per_slot, 0, 0
        self.bar_column = BarColumn(complete_style="green", finished_style="green")
        self.bar = Progress(TextColumn("[bold]{task.description}"), self.bar_column,
                            TextColumn("{task.completed:,.0f}/{task.total:,.0f} examples"),
                            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                            console=self.console, transient=True)
        self.bar.start()
        self.task = self.bar.add_task(label, total=slots * per_slot)

    def log(self, line: str) -> None:
        from rich.text import Text
        self.console.print(Text.from_ansi(line), highlight=False)

    def example(self) -> None:
        if self.in_slot < self.per_slot:
            self.in_slot += 1
            self.bar.update(self.task, completed=self.slot_start + self.in_slot)

    def advance(self, n: int = 1) -> None:
        """``n`` properties finished."""
        self.slot_start += n * self.per_slot
        self.in_slot = 0
        self.bar.update(self.task, completed=self.slot_start)

    def failed(self) -> None:
        """A finding: the bar turns red for the rest of the run."""
        self.bar_column.complete_style = self.bar_column.finished_style = "red"

    def close(self) -> None:
        self.bar.stop()


def progress(slots: int, label: str, per_slot: int = 1):
    """A bar on a terminal, plain lines otherwise; the search calls its ``example()`` per example."""
    return BarProgress(slots, label, per_slot) if interactive() else LineProgress(slots, label, per_slot)
