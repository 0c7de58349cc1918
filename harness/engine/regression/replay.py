"""Re-run a repro file's property (or, when it names none, every property that applies) on a target."""

from __future__ import annotations

from vmfuzz.harness.model.config import Config
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.properties import PROPERTIES, Observation, Property, named
from vmfuzz.harness.model.repro_file import Repro, ReproError, to_case

FAULTS = ("target-crash", "target-hang")

#: A repro written by hand from a crash report names no target: the fixed design.
DEFAULT_TARGET = "reference"


class NotDriven(ReproError):
    """A sound repro this target cannot judge (it lacks the property's seam): no fault of the file,
    which a target that drives the property replays."""


def properties_for(repro: Repro, only: str | None = None) -> list[Property]:
    """``only`` (the command line), else the file's ``property``, else every property
    whose configs the repro's config is (d = 1 ones for a trivial config, the rest otherwise)."""
    config, _ = to_case(repro)
    return _judging(only or repro.property, config)


def _judging(name: str | None, config: Config) -> list[Property]:
    """The property ``name`` (every one that applies, when none is named) that can judge ``config``."""
    if name:
        try:
            prop = named(name)
        except ValueError as exc:
            raise ReproError(str(exc)) from None
        if not prop.applies(config):
            # Its check would judge nothing here and come back "held".
            raise ReproError(f"property {prop.name} does not apply to this config: it needs {_shape_of(prop)}")
        return [prop]
    return [p for p in PROPERTIES.values() if p.applies(config)]


def replayable(repro: Repro, config: Config) -> None:
    """A ``ReproError`` for a saved repro no replay could judge: an unknown fault, no property
    (a saved repro names the one it guards), or one that does not apply to its config (``config``,
    the case's own, built when the file was read)."""
    if repro.fault is not None and repro.fault not in FAULTS:
        raise ReproError(f"unknown fault {repro.fault!r}")
    if not repro.property:  # _judging would take every property that applies
        raise ReproError("it names no property (a saved repro names the one it guards)")
    _judging(repro.property, config)  # an unknown one, or one that does not apply and would judge nothing


def _shape_of(prop: Property) -> str:
    """The configs ``prop`` judges, in a person's words."""
    need = ["num_draft_tokens 1" if prop.trivial else "num_draft_tokens >= 2"]
    if prop.layouts is not None:
        need.append("mode " + " or ".join(prop.layouts))
    if prop.chain:
        need.append("a chain (mode QLEN_ONLY, topk 1, num_draft_tokens = spec_steps + 1)")
    return ", ".join(need)


def replay(repro: Repro, target, device: str = "cpu", *, isolate: bool = False,
           timeout: float = 30.0, prop: str | None = None) -> list[Observation]:
    """Raise ``PropertyFailure`` for the first property that still fails, else return what was observed.

    A ``target-crash``/``target-hang`` repro (or ``isolate=True``) runs in a
    watched worker: a crash or hang raises ``isolation.TargetFault`` instead of
    taking this process down. A property the target cannot drive (it lacks a
    seam) is left out, never counted as held; none left is ``NotDriven``.
    """
    if repro.fault is not None and repro.fault not in FAULTS:
        raise ReproError(f"unknown fault {repro.fault!r} (known: {', '.join(FAULTS)})")
    props = properties_for(repro, prop)
    from vmfuzz.harness.engine.search.search import not_driven_here
    driven = [p for p in props if not not_driven_here(target, p)]
    if not driven:
        raise NotDriven(f"target {target.name} cannot drive {', '.join(p.name for p in props)} "
                         f"({not_driven_here(target, props[0])})")
    # the case is built only for a property that can be driven (properties_for proved it builds)
    config, batches = to_case(repro)
    try:
        if isolate or repro.fault:
            from vmfuzz.harness.engine.core.isolation import IsolatedChecker
            with IsolatedChecker(target, timeout) as check:
                return [check(p, config, batches, device) for p in driven]
        from vmfuzz.harness.engine.core.line_trace import direct_check
        check = direct_check(target)
        return [check(p, config, batches, device) for p in driven]
    except OutOfStep as exc:  # a set-up raise the repro's origin names is that raise (failures.vouched)
        from vmfuzz.harness.engine.core.failures import vouched
        raised = vouched(exc, repro.origin)
        if raised is None:
            raise
        raise raised from None
