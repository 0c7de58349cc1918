"""Nothing is "held" or "caught" without a check.

- replay and minimize refuse a property that does not apply to the repro's config;
- selftest counts a catch only for a failure of the property itself: a seam the
  target lacks is "not driven", a target that raised is "raised";
- the reference target's routers and allocation sites are models of their own,
  so ``routing`` and ``allocation-soundness`` reject a wrong answer by their
  logic (and would reject the reference if the facts they check were wrong);
- boundary classes are those of the batches a property judged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vmfuzz.harness.model.origin import Origin

from vmfuzz.harness.cli import main
from vmfuzz.harness.engine.regression.kill_matrix import NOT_DRIVEN, RAISED, caught, kill_matrix
from vmfuzz.harness.engine.search.results import Finding, PropertyResult
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
from vmfuzz.harness.targets import CATALOGUE, resolve
from tests.plugins import CoreOnlyTarget

TREE = {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 16, "num_draft_tokens": 4, "topk": 2,
        "spec_steps": 3}


def _repro(tmp_path: Path, config=TREE) -> Path:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"config": config, "batches": [{"seq_lens": [3, 4]}]}))
    return path


@pytest.mark.parametrize("command", ["replay", "minimize"])
def test_a_property_that_does_not_apply_is_refused(command, tmp_path, capsys):
    code = main([command, str(_repro(tmp_path)), "--property", "chain-writer", "--report-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "chain-writer does not apply" in err and len(err.strip().splitlines()) == 1, err


def test_minimize_refuses_a_property_the_target_cannot_drive(tmp_path, capsys):
    code = main(["minimize", str(_repro(tmp_path)), "--property", "packed-mask", "--target",
                 "tests.plugins:CoreOnlyTarget", "--report-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "cannot be driven" in err, err


# -- selftest ------------------------------------------------------------------------

def test_selftest_on_a_target_without_seams_reports_not_driven():
    matrix = kill_matrix(CoreOnlyTarget(), ["row-offset", "pack-msb-first", "hybrid-decode-mask"], seed=0,
                         max_examples=5, log=lambda s: None)
    row = matrix["row-offset"]
    for prop in ("chain-writer", "reader-agreement", "packed-mask", "routing", "allocation-soundness"):
        assert row[prop] == NOT_DRIVEN, (prop, row)
    assert caught(row["no-oob-write"])
    # the variant's own seam is missing: no property could judge it, none caught it
    assert set(matrix["pack-msb-first"].values()) == {NOT_DRIVEN}
    assert set(matrix["hybrid-decode-mask"].values()) == {NOT_DRIVEN}


def test_selftest_cli_does_not_count_missing_seams_as_caught(tmp_path):
    code = main(["selftest", "--target", "tests.plugins:CoreOnlyTarget", "--variant", "pack-msb-first",
                 "--variant", "row-offset", "--max-examples", "5", "--report-dir", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    status = {c["name"]: c["status"] for c in summary["checks"]}
    assert code == 0 and status == {"pack-msb-first": "skipped", "row-offset": "caught"}, summary


def _result(prop: str, origin: Origin, kind: str = "property") -> PropertyResult:
    finding = Finding(origin.property, "words", Path("x.json"), None, [], kind, origin=origin)
    return PropertyResult(prop, examples=3, finding=finding)


def test_a_raise_or_another_propertys_failure_is_not_a_catch():
    """Read from the finding's origin: its effect and its property, never its words."""
    from vmfuzz.harness.engine.regression.kill_matrix import KNOWN, _cell
    handed = Origin("routing", "unsound", writer="router", buffer="verify_mask", router="hybrid")
    assert _cell(_result("routing", handed), "routing") == 3
    raised = Origin("routing", "raise", exc_type="AttributeError", frame="sglang/x.py:route")
    assert _cell(_result("routing", raised), "routing") == RAISED
    assert _cell(_result("routing", Origin("routing", "crash"), kind="target-crash"), "routing") == RAISED
    other = Origin("fallback-equivalence", "wrong", writer="verify step", buffer="tree_mask")
    assert _cell(_result("no-oob-write", other), "no-oob-write") == RAISED
    assert _cell(PropertyResult("routing", not_driven="no route"), "routing") == NOT_DRIVEN
    assert _cell(PropertyResult("routing", examples=10), "routing") is None


def test_a_known_finding_is_never_a_variants_catch():
    from vmfuzz.harness.engine.regression.kill_matrix import KNOWN, _cell
    from vmfuzz.harness.model.known_file import decode
    policy = Origin("routing", "unsound", writer="dflash policy", router="dots-swa", role="decode",
                    spec_mode="decode", resolved="DotsSWAMLAAttnBackend")
    entry = decode(json.dumps({
        "sglang": ">=0.5.19,<=0.5.23", "reason": "upstream's",
        "origins": [{"property": "routing", "effect": "unsound", "writer": "dflash policy",
                     "resolved": "DotsSWAMLAAttnBackend"}],
        "repro": {"property": "routing", "config": {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 4,
                                                   "num_draft_tokens": 3, "topk": 2, "spec_steps": 2},
                  "batches": [{"seq_lens": [4, 1]}]}}).encode(), "k.json")
    assert _cell(_result("routing", policy), "routing", [entry]) == KNOWN
    assert _cell(_result("routing", policy), "routing") == 3  # without the entry it would count


# -- routing and allocation-soundness judge by their own logic --------------------------

CONFIG = Config(TreeMaskMode.FULL_MASK, 2, 8, 3, 2, 2)
CASE = (CONFIG, [Batch((1, 8))])
ROUTER_VARIANTS = [v for v, var in CATALOGUE.items() if var.seam == "route"]
ALLOCATION_VARIANTS = [v for v, var in CATALOGUE.items() if var.seam == "allocation_call"]


@pytest.mark.parametrize("variant", ROUTER_VARIANTS + ALLOCATION_VARIANTS)
def test_a_variants_wrong_answer_is_what_the_property_rejects(variant):
    prop = "routing" if variant in ROUTER_VARIANTS else "allocation-soundness"
    reference = resolve("reference")
    PROPERTIES[prop].check(reference, *CASE)  # the right answer holds
    with pytest.raises(PropertyFailure) as exc:
        PROPERTIES[prop].check(CATALOGUE[variant].layer(reference), *CASE)
    assert exc.value.prop == prop and "target raised" not in exc.value.detail


def test_routing_would_reject_the_reference_if_the_fact_were_wrong(monkeypatch):
    """The reference's routers decide by their own code: a wrong fact makes them disagree."""
    import vmfuzz.harness.properties.routers as routers
    real = routers.verify_child
    swapped = {"prefill": "decode", "decode": "prefill"}
    monkeypatch.setattr(routers, "verify_child",
                        lambda r, m: swapped[real(r, m)] if r == "hybrid" else real(r, m))
    with pytest.raises(PropertyFailure, match="hybrid router"):
        PROPERTIES["routing"].check(resolve("reference"), *CASE)


@pytest.mark.parametrize("topk", [1, 2])
def test_allocation_would_reject_the_reference_if_the_fact_were_wrong(monkeypatch, topk):
    import vmfuzz.harness.properties.allocation as allocation
    real = allocation.reads_mask
    monkeypatch.setattr(allocation, "reads_mask", lambda b, k: (not real(b, k)) if b == "flashattention" else
                        real(b, k))
    config = Config(TreeMaskMode.FULL_MASK, 2, 8, 3, topk, 2)
    with pytest.raises(PropertyFailure, match="flashattention.*is_read"):
        PROPERTIES["allocation-soundness"].check(resolve("reference"), config, [Batch((1,))])


# -- boundary classes are the judged batches' -------------------------------------------

def test_shared_members_report_only_the_batches_they_judged(tmp_path):
    from hypothesis import strategies as st

    from vmfuzz.harness.engine.search.search import run_property
    from vmfuzz.harness.model.bounds import Bounds
    from vmfuzz.harness.properties import shared_group

    names = ("no-oob-write", "capacity-soundness", "capacity-liveness")
    case = (CONFIG, [Batch((1, 2))])  # no request at the context limit (8)
    res = run_property(resolve("reference"), shared_group(names), seed=1, max_examples=1, bounds=Bounds(),
                       findings_dir=tmp_path, strategy=st.just(case))
    assert res.finding is None
    judged = res.member_classes
    assert "seq_len = max_context_len" not in judged["no-oob-write"], judged
    assert "seq_len = max_context_len" not in judged["capacity-soundness"], judged
    assert "synthetic: every request at max_context_len" in judged["capacity-soundness"]
    assert "synthetic: every request at max_context_len" not in judged["no-oob-write"]
    assert "path reuse" in judged["no-oob-write"] and "path reuse" not in judged["capacity-liveness"]
