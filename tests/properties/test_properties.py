"""Every registered property as a plain pytest + Hypothesis test.

Nothing here is special to vmfuzz's own runner, so any engine that drives
Hypothesis tests drives these unchanged: ``pytest -n 4`` (pytest-xdist, also
across hosts), ``hypothesis fuzz`` (HypoFuzz). The target comes from
``VMFUZZ_TARGET`` (default ``reference``), so the same file checks a plug-in or
``sglang``. A layered known-bad target (``reference+pr33127``) is expected to fail.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from harness.campaign import Bounds, cases
from harness.properties import PROPERTIES
from harness.targets import resolve

TARGET_SPEC = os.environ.get("VMFUZZ_TARGET", "reference")
DEVICE = os.environ.get("VMFUZZ_DEVICE", "cpu")
EXAMPLES = int(os.environ.get("VMFUZZ_MAX_EXAMPLES", "15"))


@pytest.fixture(scope="module")
def target():
    return resolve(TARGET_SPEC)


@pytest.mark.parametrize("name", list(PROPERTIES))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_property(target, name, data):
    prop = PROPERTIES[name]
    config, batches = data.draw(cases(prop, Bounds()), label="case")
    prop.check(target, config, batches, DEVICE)
