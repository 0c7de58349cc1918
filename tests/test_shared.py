"""Shared runs: one launch per path and step, every opted-in property judged, findings named for the one that failed."""

import sys
from pathlib import Path

import pytest

from vmfuzz.harness.engine.search.search import run_campaign, shareable
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.guard.tree_write import LAUNCHES
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES, PropertyFailure, lookup, shared_group
from vmfuzz.harness.properties.shared import ORDER, judge
from vmfuzz.harness.engine.regression.replay import replay
from vmfuzz.harness.model.repro_file import load
from vmfuzz.harness.targets import resolve

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import sparse  # noqa: E402

FULL = TreeMaskMode.FULL_MASK
CASE = (Config(FULL, 2, 3, 3, 2, 2), [Batch((3, 1)), Batch((1, 2, 3)), Batch((2,))])


def _launches(fn) -> int:
    before = LAUNCHES.launches
    fn()
    return LAUNCHES.launches - before


def test_a_shared_run_launches_once_per_path_and_step_where_separate_checks_repeat_them():
    target = resolve("reference")
    shared = _launches(lambda: judge(target, *CASE))
    separate = _launches(lambda: [PROPERTIES[n].check(target, *CASE) for n in ORDER])
    # the carried buffer and the fallback each step; a step past max_bs falls back once, and that is both
    assert shared == sum(1 if b.bs > CASE[0].max_bs else 2 for b in CASE[1])
    assert separate > 3 * shared


def test_every_property_judged_alone_still_holds_on_the_pristine_target():
    target = resolve("reference")
    for name in ORDER:
        lookup(name).check(target, *CASE)
    shared_group(ORDER).check(target, *CASE)


def test_a_stale_state_failure_is_named_multi_step_reuse_not_the_reuse_path():
    # The sparse stale-after-full variant: a single request after a full batch is
    # built from stale metadata; the fresh allocation agrees with the fallback.
    target = sparse.SPARSE["stale-after-full"].layer(resolve("reference"))
    case = (Config(FULL, 2, 3, 3, 2, 2), [Batch((3, 1)), Batch((1,))])
    with pytest.raises(PropertyFailure) as exc:
        judge(target, *case)
    assert exc.value.prop == "multi-step-reuse"


def test_a_wrong_reuse_path_is_named_for_its_own_property():
    target = resolve("reference+unfilled-prefix")
    with pytest.raises(PropertyFailure) as exc:
        judge(target, Config(FULL, 2, 3, 3, 2, 2), [Batch((3, 1))])
    assert exc.value.prop == "fallback-equivalence"


def test_shared_search_files_each_finding_under_its_property_and_it_replays(tmp_path):
    target = resolve("reference+unfilled-prefix")
    results = run_campaign(target, seed=1, max_examples=30, bounds=Bounds(max_bs=4, max_context_len=8),
                           findings_dir=tmp_path)
    by = {r.prop: r for r in results}
    assert list(by) == list(PROPERTIES)
    found = [r for r in results if r.finding]
    assert found and all(r.finding.path.name.startswith(r.prop) for r in found)
    for r in found:
        repro = load(r.finding.path)
        assert repro.property == r.prop
        with pytest.raises(PropertyFailure) as exc:  # replay: the property's own check, as found
            replay(repro, target)
        assert exc.value.prop == r.prop
    assert by["capacity-liveness"].finding is None and by["capacity-liveness"].examples > 0


def _shared(target, names) -> list[str]:
    groups = shareable(target, names)
    assert groups, "nothing shared at all"
    return [n for g in groups for n in g]


def test_only_opted_in_properties_share_and_one_property_searches_alone(tmp_path):
    target = resolve("reference")
    assert "trivial-path" not in _shared(target, list(PROPERTIES))
    assert shareable(target, ["fallback-equivalence"]) == []
    [res] = run_campaign(target, seed=0, max_examples=5, bounds=Bounds(max_bs=2), findings_dir=tmp_path,
                         properties=["fallback-equivalence"])
    assert res.prop == "fallback-equivalence" and res.examples >= 5


def test_a_property_without_the_flag_is_left_to_its_own_search(tmp_path, monkeypatch):
    import dataclasses
    monkeypatch.setitem(PROPERTIES, "reference-agreement",
                        dataclasses.replace(PROPERTIES["reference-agreement"], shared=False))
    assert "reference-agreement" not in _shared(resolve("reference"), list(PROPERTIES))
