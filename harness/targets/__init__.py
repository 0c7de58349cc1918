"""Targets by name: ``reference``, ``sglang``, a plug-in ``module:attr``, each optionally ``+VARIANT``."""

from __future__ import annotations

import copy
import importlib

from vmfuzz.harness.model.errors import CapReached
from vmfuzz.harness.targets.protocol import Target, TargetUnavailable
from vmfuzz.harness.targets.variants import CATALOGUE, Variant


def _reference():
    from vmfuzz.harness.targets.reference import ReferenceTarget
    return ReferenceTarget()


def _sglang():
    from vmfuzz.harness.targets.sglang import load
    return load()


BUILTIN = {
    "reference": ("the embedded model of SGLang's fixed design (default; no SGLang needed)", _reference),
    "sglang": ("the installed SGLang package's real allocation, fits, wrapper, kernels and call sites", _sglang),
}


def _plugin(spec: str):
    module_name, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # any import failure (even a module that exits) is the user's to fix, in one line
        raise TargetUnavailable(f"cannot import plug-in module {module_name!r}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TargetUnavailable(f"plug-in {spec!r}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    target = _checked_plugin(spec, obj)
    # Named by its spec, so a repro file it wrote resolves back to it on replay.
    target = copy.copy(target)
    target.name = spec
    return target


#: the Protocol's methods: a plug-in must have every one before anything of it is called
PROTOCOL_METHODS = ("numel", "fits", "fill_prefix", "kernel", "allocate", "verify", "versions")


def _checked_plugin(spec: str, obj):
    """A class or an instance that has the Protocol's methods, checked before any call.

    Loading never calls an arbitrary callable (``sys:exit``, ``os:abort``,
    ``time:sleep``...): only a class whose methods satisfy the Protocol is
    instantiated, and whatever its constructor or ``versions()`` then does
    (exits, raises, recurses, returns junk) refuses the plug-in.
    """
    what = "class" if isinstance(obj, type) else type(obj).__name__
    missing = [m for m in PROTOCOL_METHODS if not callable(getattr(obj, m, None))]
    if missing:
        raise TargetUnavailable(f"plug-in {spec!r} ({what}) does not implement the target protocol: "
                                f"no {', '.join(missing)} (needs {', '.join(PROTOCOL_METHODS)})")
    target = obj
    if isinstance(obj, type):
        try:
            target = obj()
        except (KeyboardInterrupt, CapReached):
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit included: the plug-in's fault, exit 2
            raise TargetUnavailable(f"plug-in {spec!r}: constructing it raised {type(exc).__name__}: {exc}") from None
    try:
        versions = target.versions()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        raise TargetUnavailable(f"plug-in {spec!r}: versions() raised {type(exc).__name__}: {exc}") from None
    if not isinstance(versions, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in versions.items()):
        raise TargetUnavailable(f"plug-in {spec!r}: versions() must return a dict of str to str, "
                                f"got {type(versions).__name__}")
    return target


def resolve_or_refuse(spec: str) -> Target:
    """``resolve`` for a command: an unavailable target is one line (exit 2), never a traceback."""
    import sys
    from vmfuzz.harness.model.errors import UsageError
    if sys.stdout.isatty() and spec.split("+", 1)[0] == "sglang":
        # importing SGLang is most of a short command's time: a person at a terminal sees why it waits
        # (a CI log has the timed lines after it; its stdout is not a terminal)
        print("vmfuzz: importing SGLang (the code under test; about 10-30 s) ...", flush=True)
    try:
        return resolve(spec)
    except TargetUnavailable as exc:
        raise UsageError(f"vmfuzz: target {spec!r} unavailable: {exc}") from None


def resolve(spec: str) -> Target:
    """``base[+variant...]`` -> a target instance with the variants layered in order."""
    base, *layers = spec.split("+")
    if not base:
        raise TargetUnavailable(f"empty target name in {spec!r}")
    if ":" in base:
        target = _plugin(base)
    elif base in BUILTIN:
        target = BUILTIN[base][1]()
    else:
        known = ", ".join(BUILTIN)
        raise TargetUnavailable(f"unknown target {base!r} (known: {known}, or module:attr for a plug-in)")
    for name in layers:
        variant = CATALOGUE.get(name)
        if variant is None:
            raise TargetUnavailable(f"unknown variant {name!r} (known: {', '.join(CATALOGUE)})")
        target = variant.layer(target)
    return target


__all__ = ["BUILTIN", "CATALOGUE", "Target", "TargetUnavailable", "Variant", "resolve"]
