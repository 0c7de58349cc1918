import random
import sys
from pathlib import Path

import pytest

from vmfuzz.harness.engine.search.search import run_property
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
from vmfuzz.harness.targets import resolve

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench  # noqa: E402


# the sparse range's 200 draws take seconds: its draws are the slow loop's
@pytest.mark.parametrize("range_name", [pytest.param(r, marks=pytest.mark.slow) if r == "sparse" else r
                                        for r in sorted(bench.RANGES)])
def test_naive_cases_are_valid_and_uniform_over_the_bounds(range_name):
    bounds = bench.RANGES[range_name]
    rng = random.Random(0)
    seen_bs, seen_max_bs = set(), set()
    for _ in range(200):
        config, steps = bench.naive_case(rng, bounds)
        config.validate()
        assert config.max_bs <= bounds.max_bs and config.max_context_len <= bounds.max_context_len
        assert config.d <= bounds.num_draft_tokens
        seen_max_bs.add(config.max_bs)
        for batch in steps:
            batch.validate(config)
            assert batch.bs <= 2 * config.max_bs + bounds.overshoot
            seen_bs.add(batch.bs - config.max_bs)
    assert min(seen_bs) < 0 < max(seen_bs)
    assert max(seen_max_bs) > bounds.max_bs // 2  # the whole range is drawn, not only small sizes


def test_production_range_is_the_default_and_reaches_real_capture_sizes():
    assert bench.BENCH_BOUNDS == bench.RANGES["production"]
    assert bench.BENCH_BOUNDS.max_bs >= 256


def test_check_all_detects_a_broken_kernel_and_passes_the_reference():
    config, steps = bench.naive_case(random.Random(3), bench.BENCH_BOUNDS)
    bench.check_all(resolve("reference"), config, steps)
    if not config.trivial:
        with pytest.raises(PropertyFailure):
            bench.check_all(resolve("reference+row-offset"), config, steps)


def test_examples_count_includes_the_failing_one(tmp_path):
    # row-offset fails on every drafting case: the very first example detects it.
    r = run_property(resolve("reference+row-offset"), PROPERTIES["reference-agreement"], seed=0,
                     max_examples=50, bounds=Bounds(), findings_dir=tmp_path)
    assert r.finding is not None
    assert r.examples == 1
    assert r.seconds_to_failure is not None and r.seconds_to_failure <= r.seconds
