"""``--bounds K=V,...``: read and checked with the rest of the command line, laid over the target's bounds later.

The keys and values are checked when the command line is read; the limits hold
for the bounds the search will use, the target's own with the user's laid over
them, so they are checked where the target is known (``BoundsGiven.over``).
"""

from __future__ import annotations

import dataclasses

import msgspec

from vmfuzz.harness.model import limits
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.model.errors import UsageError


class BoundsGiven(msgspec.Struct, frozen=True):
    """What ``--bounds`` said: its text (for the error lines) and each field it sets."""
    text: str
    changes: tuple[tuple[str, int], ...]

    def over(self, base: Bounds) -> Bounds:
        """The search's bounds: ``base`` with the user's ceilings laid over it, within the limits."""
        bounds = dataclasses.replace(base, **dict(self.changes))
        _check_bounds_limits(self.text, bounds)
        return bounds


#: ``--bounds`` keys: Bounds fields, and the short names a person types
BOUND_KEYS = {"max_bs": "max_bs", "context": "max_context_len", "max_context_len": "max_context_len",
              "d": "num_draft_tokens", "num_draft_tokens": "num_draft_tokens", "topk": "topk",
              "spec_steps": "spec_steps", "overshoot": "overshoot"}
BOUND_FLOORS = {"num_draft_tokens": 2}


def bounds_given(text: str) -> BoundsGiven:
    """``k=v,...`` read; a bad key or value is one UsageError line."""
    changes = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        field = BOUND_KEYS.get(key.strip())
        if field is None or not eq:
            raise UsageError(f"vmfuzz: --bounds {text!r}: {part!r} is not KEY=VALUE with KEY one of "
                             f"{', '.join(sorted(BOUND_KEYS))}")
        try:
            n = int(value)
        except ValueError:
            raise UsageError(f"vmfuzz: --bounds {text!r}: {key.strip()} must be an integer, got {value!r}") from None
        if field in changes:  # last-one-wins would silently drop what the user wrote first
            raise UsageError(f"vmfuzz: --bounds {text!r}: {key.strip()} is given more than once")
        floor = BOUND_FLOORS.get(field, 1)
        if n < floor:
            raise UsageError(f"vmfuzz: --bounds {text!r}: {key.strip()} must be at least {floor}, got {n}")
        changes[field] = n
    if not changes:
        raise UsageError(f"vmfuzz: --bounds {text!r}: give at least one KEY=VALUE")
    return BoundsGiven(text, tuple(changes.items()))


def _check_bounds_limits(text: str, bounds: Bounds) -> None:
    """The limits of harness/model/limits.py hold for searched cases too: a ceiling whose
    largest case would allocate past MAX_BUFFER_CELLS is refused before the search,
    never left to fail with a MemoryError that would read as the target's finding."""
    for field, cap, name in (("num_draft_tokens", limits.MAX_DRAFT_TOKENS, "MAX_DRAFT_TOKENS"),
                             ("topk", limits.MAX_TOPK, "MAX_TOPK"), ("spec_steps", limits.MAX_SPEC_STEPS, "MAX_SPEC_STEPS"),
                             ("max_bs", limits.MAX_SEARCH_REQUESTS, "MAX_SEARCH_REQUESTS")):
        if getattr(bounds, field) > cap:
            raise UsageError(f"vmfuzz: --bounds {text!r}: {field} {getattr(bounds, field)} is over {name} "
                             f"({cap}, harness/model/limits.py)")
    # the largest step a search draws: a FULL_MASK fallback for 2 * max_bs + overshoot
    # requests, every one at the context limit
    d = bounds.num_draft_tokens
    cells = (2 * bounds.max_bs + bounds.overshoot) * d * (bounds.max_context_len + d)
    if cells > limits.MAX_BUFFER_CELLS:
        raise UsageError(f"vmfuzz: --bounds {text!r}: its largest case needs a {cells}-cell buffer, over "
                         f"MAX_BUFFER_CELLS ({limits.MAX_BUFFER_CELLS}, harness/model/limits.py); "
                         "lower max_bs, context or d")
