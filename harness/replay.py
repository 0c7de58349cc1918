"""Re-run one repro file's property on a target."""

from __future__ import annotations

from harness.properties import PROPERTIES, Observation
from harness.repro_file import Repro, ReproError, to_case


def replay(repro: Repro, target, device: str = "cpu") -> Observation:
    """Raise ``PropertyFailure`` if the property still fails, else return what was observed."""
    prop = PROPERTIES.get(repro.property)
    if prop is None:
        raise ReproError(f"unknown property {repro.property!r} (known: {', '.join(PROPERTIES)})")
    config, batches = to_case(repro)
    if prop.trivial != config.trivial:
        need = "num_draft_tokens 1" if prop.trivial else "num_draft_tokens >= 2"
        raise ReproError(f"property {prop.name} needs {need}")
    return prop.check(target, config, batches, device)
