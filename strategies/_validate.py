"""Argument checks shared by the public strategies, in the style of hypothesis.extra.numpy."""

from __future__ import annotations

from hypothesis.errors import InvalidArgument


def check_range(name: str, value, *, low: int) -> tuple[int, int]:
    """Accept ``n`` or ``(lo, hi)``; return ``(lo, hi)`` or raise InvalidArgument."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be an int or an (lo, hi) pair of ints, not a bool")
    if isinstance(value, int):
        lo = hi = value
    elif isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        lo, hi = value
    else:
        raise InvalidArgument(f"{name}={value!r} must be an int or an (lo, hi) pair of ints")
    if lo < low:
        raise InvalidArgument(f"{name}={value!r}: the lower bound must be at least {low}")
    if hi < lo:
        raise InvalidArgument(f"{name}={value!r}: the upper bound {hi} is below the lower bound {lo}")
    return lo, hi


def check_int(name: str, value, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name}={value!r} must be an int")
    if value < low:
        raise InvalidArgument(f"{name}={value!r} must be at least {low}")
    return value
