"""The three graph-replay properties judged on one build and capture of a case's runners."""

from __future__ import annotations

import pytest

from tests.helpers import sglang_or_skip
from tests.test_graph_runner import BATCHES, CONFIG
from vmfuzz.harness.engine.search.search import shareable, slots_of
from vmfuzz.harness.properties import PROPERTIES, shared_group
from vmfuzz.harness.properties import graph_shared

GRAPH = ["graph-replay-equivalence", "padding-inert", "capture-replay-agreement"]


def _counting(target, monkeypatch) -> dict[str, int]:
    """How many times each kind of runner session is built."""
    built: dict[str, int] = {}
    for seam in ("graph_session", "draft_graph_session", "draft_extend_session"):
        make = getattr(target, seam)

        def counted(*args, _make=make, _seam=seam, **kwargs):
            built[_seam] = built.get(_seam, 0) + 1
            return _make(*args, **kwargs)
        monkeypatch.setattr(target, seam, counted)
    return built


def test_the_graph_properties_search_as_one_group_on_sglang(sglang_target):
    groups = shareable(sglang_target, list(PROPERTIES))
    assert sorted(GRAPH) in [sorted(g) for g in groups]
    slots = slots_of(sglang_target, list(PROPERTIES))
    assert sum(1 for s in slots if set(s) & set(GRAPH)) == 1  # none of them searched alone
    group = shared_group(GRAPH)
    assert group.layouts == ("FULL_MASK",) and group.cost == 3 * PROPERTIES[GRAPH[0]].cost


def test_a_case_builds_each_runner_once_for_the_three_and_each_member_is_judged(sglang_target, monkeypatch):
    built = _counting(sglang_target, monkeypatch)
    obs = shared_group(GRAPH).check(sglang_target, CONFIG, BATCHES)
    once = dict(built)
    assert once["graph_session"] == 1 and once["draft_extend_session"] >= 1, once
    assert set(obs.by_property) == set(GRAPH)
    assert "padded replay" in obs.by_property["padding-inert"]
    assert "capture-order read: attn_backend.forward_metadata" in obs.by_property["capture-replay-agreement"]
    built.clear()
    for name in GRAPH:  # each alone builds its own
        PROPERTIES[name].check(sglang_target, CONFIG, BATCHES)
    assert built == {k: 3 * v for k, v in once.items()}, (built, once)


def test_the_scope_hands_out_one_session_per_key_and_none_outside_it():
    made = []
    with graph_shared.one_build_per_case():
        a = graph_shared.built(("k", 1), lambda: made.append(1) or object())
        assert graph_shared.built(("k", 1), lambda: made.append(1) or object()) is a
        assert graph_shared.built(("k", 2), lambda: made.append(1) or object()) is not a
        with graph_shared.one_build_per_case():  # a nested case builds its own
            assert graph_shared.built(("k", 1), lambda: made.append(1) or object()) is not a
    assert len(made) == 3
    graph_shared.built(("k", 1), lambda: made.append(1) or object())
    assert len(made) == 4


def test_members_of_two_groups_or_unknown_members_are_refused():
    with pytest.raises(ValueError, match="not one shared group"):
        shared_group(["no-oob-write", "padding-inert"])
    with pytest.raises(ValueError, match="not judged on a shared graph build"):
        graph_shared.judge(None, CONFIG, BATCHES, checks={"no-oob-write": PROPERTIES["no-oob-write"].check})


def test_a_raise_while_a_runner_is_set_up_is_out_of_step_never_a_finding():
    from vmfuzz.harness.model.errors import OutOfStep
    from vmfuzz.harness.properties.kit import PropertyFailure, fail

    def wiring_mismatch():
        raise TypeError("create() got an unexpected keyword argument 'num_dp_ranks'")
    with pytest.raises(OutOfStep) as caught:
        graph_shared.built(("target verify", 1), wiring_mismatch)
    assert "target verify runner's set-up" in str(caught.value) and "num_dp_ranks" in str(caught.value)
    with graph_shared.one_build_per_case(), pytest.raises(OutOfStep):
        graph_shared.built(("draft extend", 1), wiring_mismatch)
    with pytest.raises(PropertyFailure):  # a property's own failure while it allocates stays one
        graph_shared.built(("target verify", 2), lambda: fail("padding-inert", "x", effect="wrong"))


def test_code_that_lacks_what_the_graph_drivers_bind_is_not_driven_and_says_which():
    sglang_or_skip()
    from vmfuzz.harness.targets.sglang import graph_support
    assert graph_support.not_driven() is None  # the installed SGLang has every piece
    runner = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
    assert "has no replay_everything" in graph_support.not_driven(
        ((runner, "DecodeCudaGraphRunner", ("execute", "replay_everything")),))
    assert "has no NoSuchRunner" in graph_support.not_driven(((runner, "NoSuchRunner", ()),))
    assert "no sglang.srt.no_such_module" in graph_support.not_driven((("sglang.srt.no_such_module", None, ()),))
    assert set(GRAPH) < graph_support.PROPERTIES and "kv-location-soundness" in graph_support.PROPERTIES
