"""Binding SGLang's module attributes for one call, and putting them back."""

from __future__ import annotations

import contextlib
import types

from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang.stand_in import is_harness_file, recorded

_MISSING = object()


def _file(owner) -> str:
    from vmfuzz.harness.targets.sglang.seams import where
    return where(owner)


def _code_of(value):
    """The code object a bound callable runs (a function's, a method's, a Triton kernel's Python body)."""
    for candidate in (value, getattr(value, "__func__", None), getattr(value, "fn", None)):
        code = getattr(candidate, "__code__", None)
        if isinstance(code, types.CodeType):
            return code
    return None


def stand_in_bypassed(exc: Exception, saved) -> tuple[str, object] | None:
    """(attr, owner) of a binding the raise went around: SGLang's own code called the real function that
    vmfuzz stood in for, by a name or a holder vmfuzz did not bind, and the raise came from inside it.

    Decided from the traceback, never the message: a frame running the original's code whose caller is
    SGLang's (not a vmfuzz stand-in that hands on to the original on purpose) means the stand-in was
    never consulted on that path, so what the original did there (a CUDA dispatch on a CPU host, a
    lookup with nothing published) is vmfuzz out of step, not SGLang's finding.
    """
    originals, stand_ins = {}, set()
    for owner, attr, old in saved:
        code = _code_of(old) if old is not _MISSING else None
        if code is not None:
            originals.setdefault(code, (attr, owner))
        stand_in = _code_of(getattr(owner, attr, None))
        if stand_in is not None:
            stand_ins.add(stand_in)
    if isinstance(exc, OutOfStep) or not originals:
        return None
    frames, tb = [], exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    for i in range(1, len(frames)):
        # reached through a stand-in (it hands on to the real one on purpose) or from vmfuzz's own code
        consulted = is_harness_file(frames[i - 1].co_filename) or any(f in stand_ins for f in frames[:i])
        if frames[i] in originals and not consulted:
            return originals[frames[i]]
    return None


def _recorded(value, owner, attr: str):
    """The patch noting each call in the running check's ledger (``stand_in.recorded``), once."""
    if getattr(value, "consultation", None) is not None:
        return value
    return recorded(value, attr, getattr(owner, "__name__", None) or type(owner).__name__)


@contextlib.contextmanager
def bound(*patches):
    """Bind (owner, attr, value[, may_add]) for the duration; put back exactly what was there.

    Each function bound notes its calls in the running check's ledger, so a driver
    can ask which of a step's rebindings SGLang never went through.

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
            setattr(owner, attr, _recorded(value, owner, attr))
        try:
            yield
        except Exception as exc:  # an interrupt or an exit is never a seam's: it passes as itself
            bypassed = stand_in_bypassed(exc, saved)
            if bypassed is not None:
                attr, owner = bypassed
                raise OutOfStep(attr, _file(owner), f"SGLang's code reached the real {attr} by a way vmfuzz did "
                                f"not bind, so its stand-in was never consulted, and it raised "
                                f"{type(exc).__name__}: {str(exc)[:300]}") from exc
            raise
    finally:
        for owner, attr, old in reversed(saved):
            if old is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, old)
