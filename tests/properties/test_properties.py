"""Every registered property as a plain pytest + Hypothesis test.

Nothing here is special to vmfuzz's own runner, so any engine that drives
Hypothesis tests drives these unchanged: ``pytest -n 2`` (pytest-xdist, also
across hosts), ``hypothesis fuzz`` (HypoFuzz). The target comes from
``VMFUZZ_TARGET`` (default ``reference``), so the same file checks a plug-in or
``sglang``. A layered known-bad target (``reference+pr33127``) is expected to fail.

Each test draws the capacity-boundary cases ``vmfuzz run`` seeds its search
with, or a generated one. The target's own search bounds and example budget apply, as under ``vmfuzz
run`` (``sglang`` runs its kernel in the Triton interpreter: small cases, few
of them), and a target other than the embedded ``reference`` runs in a watched
worker, so a crash is a failed test rather than a dead pytest. A failure shows
the case by field name and value, writes the same repro file as ``vmfuzz run``
(under ``$VMFUZZ_REPORT_DIR``, default ``reports/pytest/findings/``) and prints
the ``vmfuzz replay`` command that re-runs it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, note, settings, strategies as st

from vmfuzz.harness.engine.search.cases import boundary_cases, cases
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.engine.core.isolation import IsolatedChecker, TargetFault
from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
from vmfuzz.harness.model.repro_file import dump, from_case
from vmfuzz.harness.targets import resolve

TARGET_SPEC = os.environ.get("VMFUZZ_TARGET", "reference")
DEVICE = os.environ.get("VMFUZZ_DEVICE", "cpu")
TARGET = resolve(TARGET_SPEC)
BOUNDS = getattr(TARGET, "bounds", None) or Bounds()
#: the dev profile's budget for a slow target (sglang: 12), else 15
EXAMPLES = int(os.environ.get("VMFUZZ_MAX_EXAMPLES") or getattr(TARGET, "budget", {}).get("dev", 15))
ISOLATE = TARGET_SPEC.split("+")[0] != "reference"
FINDINGS = Path(os.environ.get("VMFUZZ_REPORT_DIR", "reports/pytest")) / "findings"


@pytest.fixture(scope="module")
def check():
    if not ISOLATE:
        yield lambda prop, config, batches: prop.check(TARGET, config, batches, DEVICE)
        return
    with IsolatedChecker(TARGET, float(os.environ.get("VMFUZZ_EXAMPLE_TIMEOUT", "30"))) as iso:
        yield lambda prop, config, batches: iso(prop, config, batches, DEVICE)


def described(config, batches) -> str:
    fields = ", ".join(f"{f}={getattr(config, f).name}" if f == 'mode' else f"{f}={getattr(config, f)!r}"
                       for f in config.__struct_fields__)
    steps = "; ".join(f"step {i}: seq_lens={list(b.seq_lens)}" + ("" if b.trees is None else " (drawn trees)")
                      for i, b in enumerate(batches))
    return f"config: {fields}\nbatches: {steps}"


@pytest.mark.parametrize("name", list(PROPERTIES))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_property(check, name, data):
    prop = PROPERTIES[name]
    if prop.missing(TARGET):  # said, never a pass: the target has no model of this part of the path
        pytest.skip(f"{name} is not driven on {TARGET_SPEC}: it lacks {', '.join(prop.missing(TARGET))}")
    # The capacity boundary first (as `vmfuzz run` seeds its search): a few examples
    # must not miss bs = max_bs + 1, and Hypothesis shrinks toward the first branch.
    config, batches = data.draw(st.sampled_from(boundary_cases(prop, BOUNDS)) | cases(prop, BOUNDS), label="case")
    try:
        check(prop, config, batches)
    except (PropertyFailure, TargetFault) as exc:
        # Hypothesis replays the shrunk case last, so the file left on disk is the minimal one.
        kind = exc.kind if isinstance(exc, TargetFault) else None
        detail = exc.detail if hasattr(exc, "detail") else str(exc)
        path = dump(from_case(TARGET.name, prop.name, config, batches, detail=detail, fault=kind),
                    FINDINGS / f"{prop.name}{'-' + kind if kind else ''}.json")
        note(described(config, batches))
        note(f"repro: {path}\nreplay: vmfuzz replay {path} --target {TARGET_SPEC}")
        raise
