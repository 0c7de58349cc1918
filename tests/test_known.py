"""Known findings (``known/``): real defects of SGLang, listed by the gate, reported by run,
recognised during the search so the rest of a property stays driven."""

from __future__ import annotations

import json

import msgspec
import pytest

from vmfuzz.harness.engine.regression.known import applicable, attach, default_known_root, entries
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.known_file import Known, decode
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.origin import Origin
from vmfuzz.harness.model.repro_file import ReproError
from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
from vmfuzz.harness.targets import CATALOGUE, resolve

CASE = (Config(TreeMaskMode.FULL_MASK, 2, 4, 3, 2, 2, True), [Batch((4, 1))])
POLICY = {"property": "routing", "effect": "unsound", "writer": "dflash policy"}
ENTRY = {"sglang": ">=0.5.17,<=0.5.22", "reason": "why it is upstream's",
         "origins": [{**POLICY, "router": "hybrid", "resolved": "HybridAttnBackend"}],
         "repro": {"property": "routing", "config": {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 4,
                                                    "num_draft_tokens": 3, "topk": 2, "spec_steps": 2},
                   "batches": [{"seq_lens": [4, 1]}]}}


def _known(**changes) -> Known:
    return decode(json.dumps({**ENTRY, **changes}).encode(), "x.json")


def _policy(**fields) -> Origin:
    return Origin(**{**POLICY, "spec_mode": "decode", "role": "decode", **fields})


def test_the_repository_entries_load_and_apply_by_release():
    found = {k.name: k for _, k in entries(default_known_root())}
    assert {"dflash-policy-behind-router", "dflash-policy-behind-dots-wrapper"} <= set(found)
    router = found["dflash-policy-behind-router"]
    assert [v for v in ("0.5.16", "0.5.17", "0.5.21", "0.5.22", "0.5.23") if router.applies_to(v)] == \
        ["0.5.17", "0.5.21", "0.5.22"]
    dots = found["dflash-policy-behind-dots-wrapper"]
    # closed at the newest release it was seen on: the next release is judged afresh
    assert dots.applies_to("0.5.23") and not dots.applies_to("0.5.24")
    # no SGLang under test (the reference model): nothing applies
    assert applicable(entries(default_known_root()), {"reference": "0.1.0"}) == []


@pytest.mark.parametrize("changes,why", [({"sglang": "0.5.17 to 0.5.22"}, "version range"),
                                         ({"sglang": ">=0.5.19"}, "open above"),
                                         ({"reason": "two\nlines"}, "one line"),
                                         ({"origins": []}, "origins is empty"),
                                         ({"origins": [{**POLICY, "effect": "odd"}]}, "is not one of"),
                                         ({"origins": [{**POLICY, "property": "no-oob-write"}]}, "not the repro"),
                                         ({"origins": [{**POLICY, "router": {"x": 1}}]}, "known-finding file"),
                                         ({"match": "resolves the router to"}, "unknown field"),
                                         ({"repro": {**ENTRY["repro"], "property": ""}}, "name its property"),
                                         ({"repro": {**ENTRY["repro"], "batches": []}}, "at least one step")])
def test_a_bad_entry_is_refused_with_one_line(changes, why):
    with pytest.raises(ReproError, match=why) as err:
        _known(**changes)
    assert "\n" not in str(err.value)


def test_a_known_defect_is_recorded_and_the_rest_of_the_property_still_checked():
    target = CATALOGUE["dflash-policy-prefill"].layer(resolve("reference"))
    with pytest.raises(PropertyFailure, match="DFlash"):
        PROPERTIES["routing"].check(target, *CASE)
    entry = _known(origins=[{**POLICY, "router": ["hybrid", "hybrid>hybrid"], "resolved": "prefill"}])
    attach(target, [(None, msgspec.structs.replace(entry, name="policy"))])
    obs = PROPERTIES["routing"].check(target, *CASE)
    assert "hybrid: known finding policy" in obs.classes
    # a new router defect in the same case is still a finding
    worse = CATALOGUE["tbo-child-mask"].layer(target)
    with pytest.raises(PropertyFailure, match="tbo router"):
        PROPERTIES["routing"].check(worse, *CASE)


def test_a_known_entry_names_only_its_own_defect():
    """Anchored fields: another router, a resolved class that is not the router's own, a class whose
    name merely contains it, another property or effect: none is this entry's."""
    k = _known()
    assert k.matches(_policy(router="hybrid", resolved="HybridAttnBackend"))
    assert not k.matches(_policy(router="hybrid", resolved="TboAttnBackend"))
    assert not k.matches(_policy(router="hybrid", resolved="HybridAttnBackendV2"))
    assert not k.matches(_policy(router="tbo>hybrid", resolved="HybridAttnBackend"))
    assert not k.matches(Origin("routing", "wrong", writer="dflash policy", router="hybrid",
                                resolved="HybridAttnBackend"))
    assert not k.matches(None)
    listed = _known(origins=[{**POLICY, "router": ["hybrid", "hybrid>hybrid"], "resolved": "HybridAttnBackend"}])
    assert listed.matches(_policy(router="hybrid>hybrid", resolved="HybridAttnBackend"))
    assert not listed.matches(_policy(router="hybrid-linear", resolved="HybridAttnBackend"))


def test_the_shipped_entries_do_not_swallow_a_new_router_defect():
    found = {k.name: k for _, k in entries(default_known_root())}
    old = found["dflash-policy-behind-router"]
    assert old.matches(_policy(router="tbo", resolved="TboAttnBackend"))
    assert not old.matches(_policy(router="hybrid", resolved="TboAttnBackend"))
    assert not old.matches(_policy(router="hybrid", resolved="HybridAttnBackendV2"))
    dots = found["dflash-policy-behind-dots-wrapper"]
    assert dots.matches(_policy(router="tbo>dots-swa", resolved="DotsSWAMLAAttnBackend"))
    assert not dots.matches(_policy(router="hybrid", resolved="DotsSWAMLAAttnBackend"))


@pytest.mark.slow
def test_known_findings_never_redden_a_command(sglang_target, tmp_path):
    """On released SGLang, the Dots entry is listed by gate, run and replay, which exit 0 on it;
    --fail-on-known opts in to failing."""
    from tests.helpers import vmfuzz as run_cli
    changed = tmp_path / "changed.txt"
    changed.write_text("python/sglang/srt/speculative/dflash_utils.py\n")
    gate = run_cli("gate", "--target", "sglang", "--changed-files", str(changed), "--property", "routing",
                   "--report-dir", str(tmp_path / "gate"))
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "known finding (upstream's to fix, not a new cause): dflash-policy-behind-dots-wrapper" in gate.stdout
    s = json.loads((tmp_path / "gate" / "summary.json").read_text())
    assert s["counts"]["known"] == 1 and s["counts"]["new_groups"] == 0
    args = ("run", "--target", "sglang", "--property", "routing", "--seed", "1", "--max-examples", "3")
    run = run_cli(*args, "--report-dir", str(tmp_path / "run"))
    assert run.returncode == 0, run.stdout + run.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["counts"]["known"] == 1 and s["counts"]["new_groups"] == 0
    strict = run_cli(*args, "--fail-on-known", "--report-dir", str(tmp_path / "strict"))
    assert strict.returncode == 1, strict.stdout + strict.stderr
    repro = tmp_path / "run" / "findings" / "known-dflash-policy-behind-dots-wrapper.json"
    assert json.loads(repro.read_text())["origin"]["resolved"] == "DotsSWAMLAAttnBackend"
    rep = run_cli("replay", str(repro), "--target", "sglang", "--report-dir", str(tmp_path / "replay"))
    assert rep.returncode == 0 and rep.stdout.startswith("known routing"), rep.stdout + rep.stderr
    assert run_cli("replay", str(repro), "--target", "sglang", "--fail-on-known",
                   "--report-dir", str(tmp_path / "replay2")).returncode == 1


def test_a_known_cause_is_uninteresting_and_the_search_finds_the_next_cause_of_the_property(tmp_path):
    """Two defects in one property: one a known entry names, one new. The search goes on past
    the known one (noted among the classes) and ends on the new one, in the same example count.
    Before, the first failure of any cause ended every property's search but routing's."""
    import dataclasses
    from types import SimpleNamespace

    from vmfuzz.harness.engine.search.search import run_property
    from vmfuzz.harness.model.bounds import Bounds
    from vmfuzz.harness.model.origin import Origin
    from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
    from vmfuzz.harness.properties.kit import Observation
    from vmfuzz.harness.targets import resolve

    def check(target, config, batches, device="cpu"):
        if config.max_bs >= 2:  # most cases: the known cause
            raise PropertyFailure(Origin("capacity-soundness", "unsound", writer="fits", cell="known one"), "a")
        if config.num_draft_tokens >= 3:
            raise PropertyFailure(Origin("capacity-soundness", "unsound", writer="fits", cell="new one"), "b")
        return Observation()

    prop = dataclasses.replace(PROPERTIES["capacity-soundness"], check=check)
    target = resolve("reference")
    target.known_findings = (SimpleNamespace(name="the-known-one", matches=lambda o: o.cell == "known one"),)
    result = run_property(target, prop, seed=5, max_examples=200, findings_dir=tmp_path,
                          bounds=Bounds(max_bs=4, max_context_len=16, num_draft_tokens=6, topk=2, spec_steps=2))
    assert result.finding is not None and result.finding.origin.cell == "new one", result.finding
    assert result.classes["known finding the-known-one"] >= 1, result.classes


def test_junit_shows_a_reproducing_known_finding_skipped_with_its_reason_never_a_plain_pass():
    import xml.etree.ElementTree as ET

    from vmfuzz.harness.model.known_file import GONE, REPRODUCES
    from vmfuzz.harness.report.junit import run_junit
    finding = {"known": "dflash-policy", "kind": "property", "detail": "d", "repro": "r.json"}
    summary = {"target": "sglang", "fail_on_known": False, "replays": [], "gate": None,
               "properties": [{"name": "routing", "seconds": 1.0, "status": "failed", "findings": [finding]},
                              {"name": "no-oob-write", "seconds": 1.0, "status": "held", "findings": []}],
               "known_findings": [{"name": "dflash-policy", "status": REPRODUCES, "reason": "upstream's", "detail": "d"},
                                  {"name": "old", "status": GONE, "reason": "fixed upstream", "detail": ""}]}
    root = ET.fromstring(run_junit(summary))
    cases = {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}
    routing = cases[("vmfuzz.sglang", "routing")].find("skipped")
    assert routing is not None and routing.get("message") == "known finding(s): dflash-policy"
    known = cases[("vmfuzz.known", "dflash-policy")].find("skipped")
    assert known is not None and known.get("message") == f"{REPRODUCES}: upstream's"
    assert list(cases[("vmfuzz.known", "old")]) == [] and list(cases[("vmfuzz.sglang", "no-oob-write")]) == []
    assert root.get("failures") == "0"


def test_a_known_entry_whose_property_the_code_under_test_cannot_drive_is_unchecked_and_the_run_goes_on():
    """The base's known entries apply to a head whatever its version: gating 0.5.23 back to 0.5.22 in
    0.5.22's environment, the graph entries met a release whose runners vmfuzz does not drive. Their
    replay raised out of the gate (exit 2, no report); it is "could not run" for that entry alone."""
    from vmfuzz.harness.engine.regression.known import default_known_root, replay_known
    from vmfuzz.harness.model.known_file import UNCHECKED, load
    graph = default_known_root() / "draft-kv-indices-past-context.json"
    target = resolve("reference")  # no cuda-graph runners to drive
    [o] = replay_known([(graph, load(graph))], target, findings_dir=None, device="cpu", isolate=False, timeout=30)
    assert o.status == UNCHECKED and "cannot drive graph-buffer-soundness" in o.detail
    assert o.repro is None and o.finding is None
    assert getattr(target, "known_findings", ()) == ()  # what the replay attached is taken back
