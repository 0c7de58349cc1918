"""Binding SGLang's module attributes for one call, and putting them back."""

from __future__ import annotations

import contextlib

from harness.model.errors import OutOfStep

_MISSING = object()


def _file(owner) -> str:
    from harness.targets.sglang.seams import where
    return where(owner)


@contextlib.contextmanager
def bound(*patches):
    """Bind (owner, attr, value[, may_add]) for the duration; put back exactly what was there.

    Binding a name the owner does not have would patch nothing SGLang's code
    goes through (the real code then runs unguarded): that is out of step,
    unless ``may_add`` says the code refers to the name although this host
    never defines it (a platform import that failed).
    """
    saved = []
    try:
        for owner, attr, value, *may_add in patches:
            old = (owner.__dict__.get(attr, _MISSING) if isinstance(owner, type)
                   else getattr(owner, attr, _MISSING))
            if old is _MISSING and not (may_add and may_add[0]) and not hasattr(owner, attr):
                raise OutOfStep(attr, _file(owner), f"{getattr(owner, '__name__', owner)} has no {attr} "
                                "for vmfuzz to bind")
            saved.append((owner, attr, old))
            setattr(owner, attr, value)
        yield
    finally:
        for owner, attr, old in reversed(saved):
            if old is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, old)
