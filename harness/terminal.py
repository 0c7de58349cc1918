"""Words a person reads in the terminal: verdicts coloured, counts with the right plural."""

from __future__ import annotations

import os
import sys

_COLOURS = {"held": "32", "FAILED": "1;31", "failed": "1;31", "skipped": "33", "error": "1;31",
            "not driven": "33", "SURVIVED": "1;31", "caught": "32"}


def colour_on(stream=None) -> bool:
    """Colour only on a terminal, never under CI or NO_COLOR (a log is read by grep)."""
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR") or os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def paint(word: str, key: str | None = None, *, width: int = 0) -> str:
    """``word`` padded to ``width`` and coloured by ``key`` (default: the word itself)."""
    padded = f"{word:<{width}}"
    code = _COLOURS.get(key or word)
    if not code or not colour_on():
        return padded
    return f"\033[{code}m{word}\033[0m" + padded[len(word):]


def status_word(status: str) -> str:
    """A check's status as the terminal shows it: FAILED shouts, the rest do not."""
    return paint("FAILED" if status == "failed" else status)


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 example``, ``2 examples``, ``1 property``, ``3 properties``."""
    return f"{n:,} {noun if n == 1 else (nouns or noun + 's')}"
