"""Binding SGLang's module attributes for one call, and putting them back."""

from __future__ import annotations

import contextlib

_MISSING = object()


@contextlib.contextmanager
def bound(*patches):
    """Bind (owner, attr, value) for the duration; put back exactly what was there."""
    saved = []
    try:
        for owner, attr, value in patches:
            saved.append((owner, attr, owner.__dict__.get(attr, _MISSING) if isinstance(owner, type)
                          else getattr(owner, attr, _MISSING)))
            setattr(owner, attr, value)
        yield
    finally:
        for owner, attr, old in reversed(saved):
            if old is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, old)


