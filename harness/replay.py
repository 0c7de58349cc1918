"""Re-run one repro file's property on a target."""

from __future__ import annotations

from harness.properties import PROPERTIES, Observation
from harness.repro_file import Repro, ReproError, to_case

FAULTS = ("target-crash", "target-hang")


def replay(repro: Repro, target, device: str = "cpu", *, isolate: bool = False,
           timeout: float = 30.0) -> Observation:
    """Raise ``PropertyFailure`` if the property still fails, else return what was observed.

    A ``target-crash``/``target-hang`` repro (or ``isolate=True``) runs in a
    watched worker: a crash or hang raises ``isolation.TargetFault`` instead of
    taking this process down.
    """
    prop = PROPERTIES.get(repro.property)
    if prop is None:
        raise ReproError(f"unknown property {repro.property!r} (known: {', '.join(PROPERTIES)})")
    if repro.fault is not None and repro.fault not in FAULTS:
        raise ReproError(f"unknown fault {repro.fault!r} (known: {', '.join(FAULTS)})")
    config, batches = to_case(repro)
    if prop.trivial != config.trivial:
        need = "num_draft_tokens 1" if prop.trivial else "num_draft_tokens >= 2"
        raise ReproError(f"property {prop.name} needs {need}")
    if isolate or repro.fault:
        from harness.isolation import IsolatedChecker
        with IsolatedChecker(target, timeout) as check:
            return check(prop, config, batches, device)
    return prop.check(target, config, batches, device)
