"""A --workers run walks the same bound steps as a one-process run (vmfuzz.harness.engine.campaign.steps)."""

from __future__ import annotations

from types import SimpleNamespace

from vmfuzz.harness.engine.campaign import steps
from vmfuzz.harness.model.origin import Origin
from vmfuzz.harness.engine.search.results import Finding, PropertyResult


def _plan(bounds_steps):
    return SimpleNamespace(bounds_steps=bounds_steps, bounds="only", seed=1, max_examples=5, findings_dir=None,
                           device="cpu", profile=SimpleNamespace(database="none", rounds=True), db_dir=None,
                           db_url=None)


def test_a_worker_searches_every_bound_step_widest_with_the_largest_share(monkeypatch, tmp_path):
    seen = []

    def search(target, prop, *, bounds, deadline, **_):
        seen.append((bounds, deadline))
        return PropertyResult(prop.name, examples=3, seconds=1.0)

    monkeypatch.setattr(steps, "search_property", search)
    res = steps.search_stepped(_plan(("narrow", "middle", "wide")), None, "packed-mask", None, None, {})
    assert [b for b, _ in seen] == ["narrow", "middle", "wide"]
    assert res.examples == 9 and res.step_seconds == [1.0, 1.0, 1.0]
    seen.clear()
    monkeypatch.setattr(steps.time, "monotonic", lambda: 0.0)
    steps.search_stepped(_plan(("narrow", "middle", "wide")), None, "packed-mask", 70.0, None, {})
    shares = [d for _, d in seen]
    assert shares[0] < shares[1] < shares[2] and abs(shares[0] - 10.0) < 1e-6, shares  # 1/7, then 2/6 and 4/4


def test_a_property_that_failed_is_not_searched_at_wider_bounds(monkeypatch, tmp_path):
    seen = []

    def search(target, prop, *, bounds, **_):
        seen.append(bounds)
        res = PropertyResult(prop.name, examples=1)
        res.finding = Finding(prop.name, "out-of-bounds write", tmp_path / "r.json", None, [], origin=Origin(prop.name, "overrun"))
        return res

    monkeypatch.setattr(steps, "search_property", search)
    res = steps.search_stepped(_plan(("narrow", "middle", "wide")), None, "no-oob-write", None, None, {})
    assert seen == ["narrow"] and res.findings


def test_without_steps_a_worker_searches_the_plan_s_bounds_once(monkeypatch):
    seen = []
    monkeypatch.setattr(steps, "search_property",
                        lambda target, prop, *, bounds, **_: seen.append(bounds) or PropertyResult(prop.name))
    res = steps.search_stepped(_plan(()), None, "packed-mask", None, None, {})
    assert seen == ["only"] and res.step_seconds == []
