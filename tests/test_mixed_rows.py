"""Batches of mixed rows, and the nightly's budget weighted toward its wide bound steps."""

from __future__ import annotations

from hypothesis import find, settings

from vmfuzz.harness.engine.search.results import PropertyResult
from vmfuzz.harness.engine.campaign.steps import step_weight
from vmfuzz.harness.model.config import Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.report.summary import summary_md
from vmfuzz.strategies.batches import batches

CONFIG = Config(TreeMaskMode.FULL_MASK, 4, 64, 4, 2, 2)


def _drawn(pred, bs=6):
    """A seq_lens tuple of ``bs`` rows matching ``pred`` within 500 draws, or None."""
    from hypothesis.errors import NoSuchExample
    from vmfuzz.strategies.batches import _seq_lens
    try:
        return find(_seq_lens(64, bs), pred, settings=settings(max_examples=500, database=None))
    except NoSuchExample:
        return None


def test_each_row_order_is_drawn():
    """Six distinct lengths in order are out of reach of rows drawn one by one (each weighted to
    0, 1 and the limit); the mixed rows draw each order routinely."""
    assert _drawn(lambda s: all(a > b for a, b in zip(s, s[1:])))  # long before short
    assert _drawn(lambda s: all(a < b for a, b in zip(s, s[1:])))  # short before long
    assert _drawn(lambda s: len(set(s) - {max(s)}) == 5 and 0 < s.index(max(s)) < 5 and max(s) == 64)  # one outlier


def test_a_long_row_at_the_limit_before_short_ones_is_common():
    """Not a needle: a long row at the context limit before shorter rows turns up in a few hundred draws."""
    found = find(batches(CONFIG), lambda b: b.bs >= 2 and b.seq_lens[0] == CONFIG.max_context_len > b.seq_lens[-1],
                 settings=settings(max_examples=300, database=None))
    assert found.seq_lens[0] == 64


def test_wider_steps_get_more_of_the_budget():
    weights = [step_weight(i) for i in range(3)]
    assert weights == sorted(weights) and weights[-1] / sum(weights) > 1 / 2


def test_time_per_bound_step_adds_up_and_is_reported():
    a = PropertyResult("packed-mask", seconds=3.0, step_seconds=[1.0, 2.0])
    b = PropertyResult("packed-mask", seconds=5.0, step_seconds=[0.0, 0.0, 5.0])
    a.merge(b)
    assert a.step_seconds == [1.0, 2.0, 5.0]
    s = {"counts": {"findings": 0, "replays_failed": 0, "examples": 1, "held": 1, "failed": 0, "skipped": 0},
         "command": "nightly", "target": "sglang", "profile": "nightly", "seed": 1, "timings": {"total_seconds": 8},
         "properties": [{"name": "packed-mask", "status": "held", "examples": 1, "seconds": 8.0,
                         "seconds_by_bound_step": a.step_seconds}],
         "replays": [], "findings": [], "versions": {}, "bounds": [{"max_bs": 4}, {"max_bs": 8}, {"max_bs": 16}],
         "reached": {}}
    md = summary_md(s)
    assert "| packed-mask | 1.0 | 2.0 | 5.0 |" in md, md
