"""A known finding is uninteresting to the search, never a blind spot: past it, every other part of the
case (another router of routing, another member of a shared search) is still judged, and a new cause
there is a finding within the same example count."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
from vmfuzz.harness.targets import CATALOGUE, resolve

CASE = (Config(TreeMaskMode.FULL_MASK, 2, 4, 3, 2, 2, True), [Batch((4, 1))])
#: every router chain the hybrid's defect shows through: the hybrid, and each router over hybrids
HYBRID_CHAINS = ("hybrid", "hybrid>hybrid", "hybrid-linear>hybrid", "dots-swa>hybrid", "tbo>hybrid")


def _known(name: str, matches):
    return SimpleNamespace(name=name, matches=lambda o: o is not None and matches(o))


def _hybrid_hands_out_decode(o) -> bool:
    return (o.property == "routing" and o.writer == "router" and o.cell == "handed out"
            and o.router in HYBRID_CHAINS and o.spec_mode == "prefill")


def test_a_known_router_defect_leaves_the_other_routers_judged():
    """The hybrid router's known defect ends only the hybrid's checks: the TBO router's own defect in the
    same case is the finding. Before, the known failure ended the whole case, the TBO router unchecked."""
    hybrid = CATALOGUE["hybrid-decode-mask"].layer(resolve("reference"))
    hybrid.known_findings = (_known("hdm", _hybrid_hands_out_decode),)
    obs = PROPERTIES["routing"].check(hybrid, *CASE)
    assert "hybrid (prefill): known finding hdm" in obs.classes, sorted(obs.classes)
    assert "tbo (prefill) -> primary" in obs.classes  # judged past the known defect, and held
    both = CATALOGUE["tbo-child-mask"].layer(hybrid)
    with pytest.raises(PropertyFailure) as failure:
        PROPERTIES["routing"].check(both, *CASE)
    assert failure.value.origin.router == "tbo", failure.value.origin


def test_a_members_known_failure_leaves_the_other_members_of_a_shared_search_judged(tmp_path):
    """pr33127's overrun, known for no-oob-write, is passed over for that member alone: fallback-equivalence
    still finds its own failure on the same cases. Before, the whole case was passed over for every member."""
    from vmfuzz.harness.engine.search.search import search_shared
    target = CATALOGUE["pr33127"].layer(resolve("reference"))
    target.known_findings = (_known("oob", lambda o: o.property == "no-oob-write" and o.effect == "overrun"),)
    oob, equivalence = search_shared(
        target, [PROPERTIES["no-oob-write"], PROPERTIES["fallback-equivalence"]], seed=1, max_examples=40,
        bounds=Bounds(max_bs=4, max_context_len=16, num_draft_tokens=6, topk=2, spec_steps=2),
        findings_dir=tmp_path)
    assert equivalence.finding is not None and equivalence.finding.prop == "fallback-equivalence"
    assert oob.finding is None and oob.classes["known finding oob"] >= 1, oob.classes
    assert "known finding oob" not in equivalence.classes


def test_junit_never_shows_a_property_that_met_only_known_entries_as_a_plain_pass():
    import xml.etree.ElementTree as ET

    from vmfuzz.harness.report.junit import run_junit
    held = {"seconds": 1.0, "status": "held", "findings": []}
    summary = {"target": "sglang", "fail_on_known": False, "replays": [], "gate": None, "known_findings": [],
               "properties": [{**held, "name": "no-oob-write", "classes": {"known finding oob": 9, "bs < max_bs": 3}},
                              {**held, "name": "routing", "classes": {"hybrid (prefill): known finding hdm": 4}},
                              {**held, "name": "capacity-liveness", "classes": {"bs < max_bs": 3}}]}
    cases = {c.get("name"): c for c in ET.fromstring(run_junit(summary)).iter("testcase")}
    assert cases["no-oob-write"].find("skipped").get("message") == "known finding(s): oob"
    assert cases["routing"].find("skipped").get("message") == "known finding(s): hdm"
    assert list(cases["capacity-liveness"]) == []


def _allocation_sized_for_fewer_requests(o) -> bool:
    return o.property == "allocation-soundness" and o.cell == "sized for fewer requests"


def test_a_known_allocation_defect_leaves_the_sites_other_numbers_judged():
    """An allocation site that sizes the mask for max_bs - 1 (known) and for one draft row too few (new):
    the draft width is still judged past the known max_bs. Before, the known failure ended the case at
    the first number, so the second defect, on every site of every case, was never reached."""
    short = CATALOGUE["alloc-max-bs-short"].layer(resolve("reference"))
    short.known_findings = (_known("alloc", _allocation_sized_for_fewer_requests),)
    obs = PROPERTIES["allocation-soundness"].check(short, *CASE)
    assert any(c.endswith("max_bs: known finding alloc") for c in obs.classes), sorted(obs.classes)
    assert any(c.endswith("mask: not judged past a known defect of its numbers") for c in obs.classes)
    both = CATALOGUE["alloc-wrong-d"].layer(short)
    with pytest.raises(PropertyFailure) as failure:
        PROPERTIES["allocation-soundness"].check(both, *CASE)
    assert failure.value.origin.cell == "sized for fewer draft tokens", failure.value.origin


@pytest.mark.slow
def test_a_second_allocation_defect_is_found_past_a_known_one_by_the_search(tmp_path):
    """End to end, the same two defects under ``run``: the new one is the finding, within 100 examples."""
    from vmfuzz.harness.engine.search.search import run_property
    both = CATALOGUE["alloc-wrong-d"].layer(CATALOGUE["alloc-max-bs-short"].layer(resolve("reference")))
    both.known_findings = (_known("alloc", _allocation_sized_for_fewer_requests),)
    result = run_property(both, PROPERTIES["allocation-soundness"], seed=1, max_examples=100, bounds=Bounds(),
                          findings_dir=tmp_path)
    assert result.finding is not None and result.finding.origin.cell == "sized for fewer draft tokens"


def test_a_known_defect_of_one_reader_leaves_the_other_readers_of_the_step_judged():
    """The eager sliding-window read carries a known defect (its mask offsets shifted by one); the replay's
    window read a new one of its own. reader-agreement still judges the replay's past the known eager one.
    Before, the known failure ended the case at the eager window read."""
    import dataclasses

    from vmfuzz.harness.targets.reference.target import ReferenceTarget

    def shifted(view):
        return dataclasses.replace(view, indptr=view.indptr + 1)

    class EagerWindowShifted(ReferenceTarget):
        def read_window_eager(self, *args):
            return shifted(super().read_window_eager(*args))

    class BothWindowsShifted(EagerWindowShifted):
        def read_window_replay(self, *args):
            return shifted(super().read_window_replay(*args))

    def eager_window(o) -> bool:
        return o.property == "reader-agreement" and o.stage == "eager"

    one = EagerWindowShifted()
    one.known_findings = (_known("window", eager_window),)
    obs = PROPERTIES["reader-agreement"].check(one, *CASE)
    assert "sliding-window read eager: known finding window" in obs.classes, sorted(obs.classes)
    assert any(c.startswith("sliding-window read replay") for c in obs.classes)  # judged past it, and held
    both = BothWindowsShifted()
    both.known_findings = one.known_findings
    with pytest.raises(PropertyFailure) as failure:
        PROPERTIES["reader-agreement"].check(both, *CASE)
    assert failure.value.origin.stage == "replay", failure.value.origin
