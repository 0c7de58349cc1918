"""A run's verdict: one record, decided once, that every report and the exit code read.

Before this record each writer (summary.json, summary.md, report.html,
junit.xml, the terminal's closing line) decided its own headline from its own
reading of the outcome, and they disagreed: a gate that exited 3 said "passed"
in summary.md, a property with a promised sub-check that never ran said "held"
everywhere but one terminal line. So the verdict is decided once, from the
outcome, before any report is written (``vmfuzz.harness.report.decide``), and
each writer maps its ``kind`` through a table that must name every kind
(tests/test_verdict.py checks that each table is total and agrees with the exit
code): a new kind cannot be added without every writer saying what it means.

It sits in the model layer, beside the exit codes, so that every layer may
carry it; it is frozen because nothing after the decision may change it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from vmfuzz.harness.model.errors import EXIT_COULD_NOT_CHECK, EXIT_FINDING, EXIT_OK


class Kind(enum.Enum):
    """What a run's end was, in the words summary.json's ``verdict.kind`` carries."""

    HELD = "held"
    #: every property held, and some known (upstream's) finding was listed: still exit 0
    KNOWN = "known"
    NEW_FINDING = "new finding"
    #: a property held on what ran, but a sub-check it promises was judged on no case
    HELD_IN_PART = "held in part"
    COULD_NOT_CHECK = "could not check"
    #: could not check: every line left unchecked needs a device this machine lacks
    NEEDS_GPU = "needs a GPU"
    OUT_OF_STEP = "out of step"
    #: the code under test did not load here (a pinned package missing or at another version, ...)
    CANNOT_LOAD = "cannot load"
    #: a search lane died (killed, out of memory) before its properties were checked
    LANE_LOST = "lane lost"
    #: a signal ended the run; the reports cover what ran
    INTERRUPTED = "interrupted"


#: each kind's exit code; INTERRUPTED's is the signal's (130, 143, ...), carried by the record
EXIT_CODE = {
    Kind.HELD: EXIT_OK, Kind.KNOWN: EXIT_OK, Kind.NEW_FINDING: EXIT_FINDING,
    Kind.HELD_IN_PART: EXIT_COULD_NOT_CHECK, Kind.COULD_NOT_CHECK: EXIT_COULD_NOT_CHECK,
    Kind.NEEDS_GPU: EXIT_COULD_NOT_CHECK, Kind.OUT_OF_STEP: EXIT_COULD_NOT_CHECK,
    Kind.CANNOT_LOAD: EXIT_COULD_NOT_CHECK, Kind.LANE_LOST: EXIT_COULD_NOT_CHECK,
    Kind.INTERRUPTED: None,
}

#: the words every writer opens with: exit 3 always reads "could not check", whatever the cause
HEADLINE = {
    Kind.HELD: "passed",
    Kind.KNOWN: "passed (known findings only)",
    Kind.NEW_FINDING: "FAILED",
    Kind.HELD_IN_PART: "could not check (held in part)",
    Kind.COULD_NOT_CHECK: "could not check",
    Kind.NEEDS_GPU: "could not check (needs a GPU)",
    Kind.OUT_OF_STEP: "could not check (vmfuzz out of step)",
    Kind.CANNOT_LOAD: "could not check (cannot load the code under test)",
    Kind.LANE_LOST: "could not check (a search lane was lost)",
    Kind.INTERRUPTED: "INTERRUPTED",
}


@dataclass(frozen=True)
class Verdict:
    """The run's one verdict: its kind, its exit code, and why (one line, "" for a plain pass)."""

    kind: Kind
    exit_code: int
    why: str = ""

    def __post_init__(self):
        expected = EXIT_CODE[self.kind]
        if expected is not None and self.exit_code != expected:
            raise ValueError(f"verdict {self.kind.value} exits {expected}, not {self.exit_code}")

    @classmethod
    def of(cls, kind: Kind, why: str = "", *, signal_code: int | None = None) -> "Verdict":
        code = EXIT_CODE[kind]
        return cls(kind, code if code is not None else (signal_code or 130), why)

    @property
    def headline(self) -> str:
        return HEADLINE[self.kind]

    def as_dict(self) -> dict:
        """summary.json's ``verdict``."""
        return {"kind": self.kind.value, "exit_code": self.exit_code, "headline": self.headline, "why": self.why}

    @classmethod
    def from_dict(cls, d: dict) -> "Verdict":
        return cls(Kind(d["kind"]), d["exit_code"], d.get("why", ""))
