"""What a run prints while it runs: a live bar on a terminal, plain lines under CI.

A CI log is read after the fact, by grep: one line per event, no cursor tricks.
A person at a terminal wants to know how long is left.
"""

from __future__ import annotations

import os
import sys


def interactive(stream=None) -> bool:
    stream = stream or sys.stdout
    if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


class LineProgress:
    """CI output: every line stands alone."""

    def __init__(self, total: int, label: str):
        self.total, self.done = total, 0

    def log(self, line: str) -> None:
        print(line, flush=True)

    def advance(self, n: int = 1) -> None:
        self.done += n

    def close(self) -> None:
        pass


class BarProgress:
    """A rich progress bar with ETA; messages scroll above it."""

    def __init__(self, total: int, label: str):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn
        self.console = Console()
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                            console=self.console, transient=True)
        self.bar.start()
        self.task = self.bar.add_task(label, total=total)

    def log(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False)

    def advance(self, n: int = 1) -> None:
        self.bar.advance(self.task, n)

    def close(self) -> None:
        self.bar.stop()


def progress(total: int, label: str):
    return BarProgress(total, label) if interactive() else LineProgress(total, label)
