"""Where a finding came from, as typed fields: the one thing every reader of a finding reads.

A finding's detail is a sentence for a person. Grouping, ``compare``,
``merge``, known-finding matching, minimization, bisection, junit.xml and the
mutation table all need to know *which* failure it is, and a sentence is a poor
key for that: reword it and yesterday's cause reads as "fixed" plus "new".
So every failure is raised with an ``Origin`` (the way Hypothesis identifies a
failure by its ``InterestingOrigin`` and ClusterFuzz by its crash state), and
the message is only ever printed.

Fields, each filled by the check that saw the failure:

- ``property``: the property whose check failed.
- ``effect``: what kind of damage: ``overrun`` (a write left its buffer, or a
  buffer handed to a writer is too small for what it must hold), ``wrong`` (an
  output differs from what it must be), ``unsound`` (a decision: ``fits``, a
  router, an allocation site, a host-side check, decided what it must not),
  ``raise`` (the code under test raised), ``crash`` / ``hang`` (the target died
  or stopped answering).
- ``writer``: who wrote or decided it (the verify step, the chain writer, the
  cuda-graph replay copy, the pack kernel, a router, an allocation site, fits).
- ``buffer``: the buffer or output concerned (tree_mask, positions, mask_indptr,
  packed_mask, kv_indices, ...); ``side``: below / above for an overrun.
- ``cell``: the cell class: for a wrong mask cell which kind (prefix column, a
  tree cell that should be visible or hidden, padding); for an overrun whose
  request the stray write belongs to (one past the buffer's capacity, or one it
  was sized for).
- ``stage``: eager, replay or arithmetic; ``step`` / ``steps``: batch i of n
  (0-based) when a case has several.
- ``exc_type`` and ``frame``: for a raise, the exception's type and the
  innermost frame of the code under test (``file:function``).
- ``router``, ``role``, ``spec_mode``, ``resolved``: for routing and allocation
  decisions, the router chain, the child's role, the speculative attention
  mode and the class a policy resolved to: what a known finding matches on.
  They are part of the cause only for a decision (``unsound``, or a wrong
  output of a router or policy): a verify step through a router that writes
  wrong cells is the same cause as that step run directly.
- ``also``: the failure's other causes seen on the same case, each a ``Part``
  (another escaped cell class, another buffer overrun, another differing
  output). The fields above are the first cause; two sizing defects in one
  target show as one overrun whose first escaped cell is only one of them, and
  a known entry that names that one must not excuse the other. A failure with
  no ``also`` keeps the key and label it always had.

``step``/``steps`` and ``stage`` say where the failure was seen, not what it is:
they are left out of the group key, so the same cause seen at another step of
a longer case is the same group.
"""

from __future__ import annotations

import msgspec

from vmfuzz.harness.model.limits import MAX_STEPS

EFFECTS = ("overrun", "wrong", "unsound", "raise", "crash", "hang")
SIDES = ("", "below", "above")
#: writers whose wrong output is a decision, named by the router chain and roles it was made for
DECIDERS = ("router", "dflash policy", "call site")
#: an overrun's cell classes: whose cells the stray write were
#: SGLang's allocator, as the writer of a finding about the mask it chose to hand out:
#: every property that asks for the mask sees the same choice, one cause
ALLOCATOR = "maybe_create_verify_mask"
BEYOND_CAPACITY = "request past the buffer's capacity"
WITHIN_CAPACITY = "request the buffer was sized for"


class Part(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """One more cause of a failure: the fields that differ from the origin's first cause."""

    effect: str
    buffer: str = ""
    side: str = ""
    cell: str = ""
    #: "" when the origin's own writer wrote it too
    writer: str = ""

    def __post_init__(self):
        if self.effect not in ("overrun", "wrong", "unsound"):
            raise ValueError(f"origin also: effect {self.effect!r} is not one of overrun, wrong, unsound")
        if self.side not in SIDES:
            raise ValueError(f"origin also: side {self.side!r} is not one of below, above")


class Origin(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    property: str
    effect: str
    writer: str = ""
    buffer: str = ""
    side: str = ""
    cell: str = ""
    stage: str = ""
    step: int | None = None
    steps: int | None = None
    exc_type: str = ""
    frame: str = ""
    router: str = ""
    role: str = ""
    spec_mode: str = ""
    resolved: str = ""
    also: tuple[Part, ...] = ()

    def __post_init__(self):
        if self.effect not in EFFECTS:
            raise ValueError(f"origin effect {self.effect!r} is not one of {', '.join(EFFECTS)}")
        if self.side not in SIDES:
            raise ValueError(f"origin side {self.side!r} is not one of below, above")
        for name in ("step", "steps"):  # where it was seen: within the case's steps, whatever file it came from
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_STEPS:
                raise ValueError(f"origin {name} {value} is outside 0..{MAX_STEPS} (MAX_STEPS)")

    def parts(self) -> tuple[Origin, ...]:
        """Each cause of this failure as an origin of one cause, the first one first."""
        first = msgspec.structs.replace(self, also=()) if self.also else self
        return (first,) + tuple(msgspec.structs.replace(
            first, effect=p.effect, buffer=p.buffer, side=p.side, cell=p.cell, writer=p.writer or self.writer)
            for p in self.also)

    def cause(self) -> tuple:
        """The facts that say which cause this is (everything but where it was seen); with several
        causes, each one's, in a fixed order, so the order they were met in does not split a group."""
        if not self.also:
            return self._one_cause()
        causes = sorted({p._one_cause() for p in self.parts()}, key=key_text)
        return tuple(v for i, c in enumerate(causes) for v in (("and",) if i else ()) + c)

    def _one_cause(self) -> tuple:
        if self.effect in ("crash", "hang"):
            return (self.effect,)  # the worker died: no frame, no buffer to name
        if self.effect == "raise":
            return ("raise", self.exc_type, self.frame)
        if self.effect == "overrun":
            return ("overrun", self.writer, self.buffer, self.side, self.cell)
        if self.effect == "wrong" and self.buffer and self.writer not in DECIDERS:
            return ("wrong", self.writer, self.buffer, self.cell)
        if self.effect == "unsound" and self.writer == ALLOCATOR:
            return ("unsound", self.writer, self.buffer, self.cell)
        return (self.property, self.effect, self.writer, self.buffer, self.cell, self.router, self.role,
                self.spec_mode, self.resolved)

    def label(self) -> str:
        """The cause in words (a group's title); derived from the fields, never parsed back."""
        return " and ".join(dict.fromkeys(p._one_label() for p in self.parts()))

    def _one_label(self) -> str:
        if self.effect in ("crash", "hang"):
            return f"target-{self.effect}"
        if self.effect == "raise":
            return f"raise {self.exc_type}" + (f" at {self.frame}" if self.frame else "")
        by = f" by the {self.writer}" if self.writer else ""
        if self.effect == "overrun":
            return f"overrun {self.buffer} {self.side}{by}" + (f" ({self.cell})" if self.cell else "")
        if self.effect == "wrong" and self.buffer and self.writer not in DECIDERS:
            return f"wrong {self.buffer}{by}" + (f": {self.cell}" if self.cell else "")
        if self.effect == "unsound" and self.writer == ALLOCATOR:
            return f"unsound {self.buffer}{by}: {self.cell}"
        parts = [p for p in (self.writer, self.buffer, self.cell) if p]
        who = ", ".join(f"{k} {v}" for k, v in (("router", self.router), ("role", self.role),
                                                ("mode", self.spec_mode), ("resolved", self.resolved)) if v)
        return f"{self.property}: {self.effect} " + " ".join(parts) + (f" [{who}]" if who else "")

    def kind(self) -> str:
        """The finding's kind: a property's own failure, or the target dying / hanging."""
        return f"target-{self.effect}" if self.effect in ("crash", "hang") else "property"


def key_text(cause: tuple) -> str:
    """A cause as one stable string (summary.json's group key): fields joined, empty ones kept."""
    return "|".join("" if v is None else str(v) for v in cause)


def encode(origin: Origin) -> dict:
    return msgspec.to_builtins(origin)
