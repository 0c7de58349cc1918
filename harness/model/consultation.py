"""Which of the harness's stand-ins the code under test consulted during one check.

A target stands in for server objects and rebinds module names so that the
code under test runs on a CPU host. What it computes from a stand-in it never
read is not its own doing: a check that failed while a stand-in it was handed
as load-bearing went unread says the harness no longer fits the code (out of
step), never that the code is wrong. Each stand-in and patch registers a
``Consultation`` in the check's ``Ledger``; ``engine.core.failures`` decides
from it. It sits at the bottom of the layers so every target can register and
the engine can ask without either importing the other.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


@dataclass(eq=False)
class Consultation:
    """One stand-in or patch: its seam, the file whose code should read it, and what was read.

    ``load_bearing`` names the parts the code under test must read for the check
    to say anything about it (empty: any read counts, and an unread one is only
    noted). ``reads`` holds each part read; a patch records ``"call"``.
    """

    seam: str
    file: str
    load_bearing: frozenset[str] = frozenset()
    reads: set[str] = field(default_factory=set)
    #: parts the code under test asked for that the stand-in does not provide
    lacking: set[str] = field(default_factory=set)
    #: parts of one of SGLang's own objects that SGLang read, which its own set-up (skipped: vmfuzz
    #: built that set-up's values instead) would have set and vmfuzz did not: still ``__init__``'s
    unset: set[str] = field(default_factory=set)

    @property
    def consulted(self) -> bool:
        return bool(self.reads)

    def unread(self) -> list[str]:
        """The load-bearing parts never read (empty: the stand-in did its job)."""
        return sorted(self.load_bearing - self.reads)


class Ledger:
    """The consultations of one check, in the order their stand-ins were installed."""

    def __init__(self):
        self.entries: list[Consultation] = []
        self._by_object: dict[int, Consultation] = {}
        self._held: list[object] = []  # keeps each registered object alive, so its id stays its own

    def add(self, entry: Consultation, obj: object = None) -> Consultation:
        self.entries.append(entry)
        if obj is not None:
            self._by_object[id(obj)] = entry
            self._held.append(obj)
        return entry

    def of(self, obj: object) -> Consultation | None:
        """The consultation of ``obj`` if it is a stand-in: this check's, or one built before it."""
        return self._by_object.get(id(obj)) or carried_by(obj)

    def never_consulted(self) -> list[Consultation]:
        """The stand-ins whose load-bearing parts the code under test never read."""
        return [e for e in self.entries if e.unread()]

    def read_unset(self) -> list[Consultation]:
        """The objects whose skipped set-up's parts SGLang read, though vmfuzz never built them."""
        return [e for e in self.entries if e.unset]

    def unconsulted(self) -> list[Consultation]:
        """Every stand-in or patch nothing read (load-bearing or not): what a driver may ask about."""
        return [e for e in self.entries if not e.consulted]


_OPEN: list[Ledger] = []


def carried_by(obj: object) -> Consultation | None:
    """The consultation a stand-in object carries (its ``_consultation`` slot), read without asking it."""
    try:
        entry = object.__getattribute__(obj, "_consultation")
    except (AttributeError, TypeError):
        return None
    return entry if isinstance(entry, Consultation) else None


def current() -> Ledger | None:
    """The ledger of the check running now (None outside a check)."""
    return _OPEN[-1] if _OPEN else None


def register(seam: str, file: str, load_bearing=(), obj: object = None) -> Consultation:
    """A consultation for a stand-in being installed, kept in the running check's ledger if any."""
    entry = Consultation(seam, file, frozenset(load_bearing))
    ledger = current()
    return ledger.add(entry, obj) if ledger is not None else entry


@contextlib.contextmanager
def ledger():
    """One check's ledger; a check run inside another (a shared group's member) keeps the outer one."""
    if _OPEN:
        yield _OPEN[-1]
        return
    _OPEN.append(Ledger())
    try:
        yield _OPEN[-1]
    finally:
        _OPEN.pop()
