"""The benchmark's sparse catalogue: each variant is caught where it fires and is the pristine target elsewhere."""

import random
import sys
from pathlib import Path

import pytest

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PropertyFailure
from vmfuzz.harness.targets import resolve
from vmfuzz.harness.model.trees import deepest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench  # noqa: E402
import sparse  # noqa: E402

FULL, QLEN = TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY
DEEP = deepest(4, 6, 8)

# (variant, a tiny case on its condition, a typical case just off it)
CASES = {
    "bucket-edge": ((Config(QLEN, 64, 2, 2, 1, 1), [Batch((1,) * 64), Batch((1,) * 65)]),
                    (Config(QLEN, 63, 2, 2, 1, 1), [Batch((1,) * 63), Batch((1,) * 64)])),
    "deep-walk": ((Config(QLEN, 1, 2, 8, 4, 6), [Batch((1,), (DEEP,)), Batch((2,))]),
                  (Config(QLEN, 1, 2, 8, 3, 6), [Batch((1,), (deepest(3, 6, 8),)), Batch((2,))])),
    "context-edge": ((Config(FULL, 2, 3, 3, 2, 2), [Batch((0, 3)), Batch((1,))]),
                     (Config(FULL, 2, 3, 3, 2, 2), [Batch((3, 2)), Batch((1,))])),
    "stale-after-full": ((Config(FULL, 2, 3, 3, 2, 2), [Batch((3, 1)), Batch((1,))]),
                         (Config(FULL, 2, 3, 3, 2, 2), [Batch((3, 1)), Batch((1, 1, 1)), Batch((1,))])),
    "pow2-tail": ((Config(FULL, 2, 3, 9, 2, 4), [Batch((2, 2)), Batch((1,))]),
                  (Config(FULL, 2, 3, 8, 2, 4), [Batch((2, 2)), Batch((1,))])),
}


def _lazy(steps):
    return [(b.seq_lens, b.trees) for b in steps]


@pytest.mark.parametrize("name", sorted(sparse.SPARSE))
def test_each_sparse_variant_is_caught_where_it_fires_and_only_there(name):
    v = sparse.SPARSE[name]
    (on, off) = CASES[name]
    target, pristine = v.layer(resolve("reference")), resolve("reference")
    assert v.fires(*_lazy_case(on)) and not v.fires(*_lazy_case(off))
    with pytest.raises(PropertyFailure):
        bench.check_all(target, *on)
    bench.check_all(v.layer(resolve("reference")), *off)  # a fresh layer: no history from the case above
    bench.check_all(pristine, *on)


def _lazy_case(case):
    config, steps = case
    return config, _lazy(steps)


@pytest.mark.slow
def test_off_its_condition_a_sparse_variant_is_the_pristine_target():
    # Why the naive search may skip the checks of cases no variant fires on.
    small = bench.Bounds(max_bs=4, max_context_len=4, num_draft_tokens=9, topk=4, spec_steps=6, overshoot=2)
    rng = random.Random(7)
    seen = 0
    for _ in range(40):
        case = sparse.naive_case(rng, small)
        config, steps = sparse.materialize(case)
        for name, v in sparse.SPARSE.items():
            if not v.fires(*case):
                bench.check_all(v.layer(resolve("reference")), config, steps)
                seen += 1
    assert seen > 100


def test_uniform_hit_rate_is_measured_per_variant():
    rates = sparse.hit_rates(2000, seed=1)
    assert set(rates) == set(sparse.SPARSE)
    assert all(0 <= r["rate"] <= 0.01 and r["cases"] == 2000 for r in rates.values())
