"""Targets by name: ``reference``, ``sglang``, a plug-in ``module:attr``, each optionally ``+VARIANT``."""

from __future__ import annotations

import copy
import importlib

from harness.targets.protocol import Target
from harness.targets.variants import CATALOGUE, Variant


class TargetUnavailable(Exception):
    """The target cannot be loaded here (bad name, missing package): exit 2."""


def _reference():
    from harness.targets.reference import ReferenceTarget
    return ReferenceTarget()


def _sglang():
    from harness.targets.sglang import load
    return load()


BUILTIN = {
    "reference": ("the embedded model of SGLang's fixed design (default; no SGLang needed)", _reference),
    "sglang": ("the installed SGLang package's real allocation, fits, wrapper, kernels and call sites", _sglang),
}


def _plugin(spec: str):
    module_name, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except Exception as exc:  # any import failure is the user's to fix, in one line
        raise TargetUnavailable(f"cannot import plug-in module {module_name!r}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TargetUnavailable(f"plug-in {spec!r}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    target = obj() if isinstance(obj, type) or (callable(obj) and not isinstance(obj, Target)) else obj
    if not isinstance(target, Target):
        raise TargetUnavailable(f"plug-in {spec!r} does not implement the target protocol "
                                "(numel, fits, fill_prefix, kernel, allocate, verify, versions, name)")
    # Named by its spec, so a repro file it wrote resolves back to it on replay.
    target = copy.copy(target)
    target.name = spec
    return target


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
