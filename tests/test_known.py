"""Known findings (``known/``): real defects of SGLang, listed by the gate, reported by run,
recognised during the search so the rest of a property stays driven."""

from __future__ import annotations

import json

import msgspec
import pytest

from harness.engine.known import applicable, attach, default_known_root, entries
from harness.model.config import Batch, Config
from harness.model.known_file import Known, decode
from harness.model.layouts import TreeMaskMode
from harness.model.repro_file import ReproError
from harness.properties import PROPERTIES, PropertyFailure
from harness.targets import CATALOGUE, resolve

CASE = (Config(TreeMaskMode.FULL_MASK, 2, 4, 3, 2, 2, True), [Batch((4, 1))])
ENTRY = {"sglang": ">=0.5.17,<0.5.23", "reason": "why it is upstream's", "match": "resolves the router to",
         "repro": {"property": "routing", "config": {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 4,
                                                    "num_draft_tokens": 3, "topk": 2, "spec_steps": 2},
                   "batches": [{"seq_lens": [4, 1]}]}}


def _known(**changes) -> Known:
    return decode(json.dumps({**ENTRY, **changes}).encode(), "x.json")


def test_the_repository_entries_load_and_apply_by_release():
    found = {k.name: k for _, k in entries(default_known_root())}
    assert {"dflash-policy-behind-router", "dflash-policy-behind-dots-wrapper"} <= set(found)
    router = found["dflash-policy-behind-router"]
    assert [v for v in ("0.5.16", "0.5.17", "0.5.21", "0.5.22", "0.5.23") if router.applies_to(v)] == \
        ["0.5.17", "0.5.21", "0.5.22"]
    assert found["dflash-policy-behind-dots-wrapper"].applies_to("0.5.23")
    # no SGLang under test (the reference model): nothing applies
    assert applicable(entries(default_known_root()), {"reference": "0.1.0"}) == []


@pytest.mark.parametrize("changes,why", [({"sglang": "0.5.17 to 0.5.22"}, "version range"),
                                         ({"reason": "two\nlines"}, "one line"),
                                         ({"match": "("}, "regular expression"),
                                         ({"match": ""}, "regular expression"),
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
    attach(target, [(None, msgspec.structs.replace(_known(match="hybrid router.*DFlash"), name="policy"))])
    obs = PROPERTIES["routing"].check(target, *CASE)
    assert "hybrid: known finding policy" in obs.classes
    # a new router defect in the same case is still a finding
    worse = CATALOGUE["tbo-child-mask"].layer(target)
    with pytest.raises(PropertyFailure, match="tbo router"):
        PROPERTIES["routing"].check(worse, *CASE)


def test_a_known_entry_names_only_its_own_defect():
    k = _known(match="dots-swa router.*DFlash")
    assert k.matches("routing", "dots-swa router, speculative_attention_mode decode: DFlash's ...")
    assert not k.matches("routing", "hybrid router, speculative_attention_mode decode: DFlash's ...")
    assert not k.matches("no-oob-write", "dots-swa router, ...: DFlash's ...")


@pytest.mark.slow
def test_gate_lists_the_known_finding_and_passes_run_reports_it(sglang_target, tmp_path):
    from tests.helpers import vmfuzz as run_cli
    changed = tmp_path / "changed.txt"
    changed.write_text("python/sglang/srt/speculative/dflash_utils.py\n")
    gate = run_cli("gate", "--target", "sglang", "--changed-files", str(changed), "--property", "routing",
                   "--report-dir", str(tmp_path / "gate"))
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "known finding (upstream's to fix, not this change's): dflash-policy-behind-dots-wrapper" in gate.stdout
    s = json.loads((tmp_path / "gate" / "summary.json").read_text())
    assert s["counts"]["known"] == 1 and s["counts"]["findings"] == 0 and s["findings"] == []
    run = run_cli("run", "--target", "sglang", "--property", "routing", "--seed", "1", "--max-examples", "3",
                  "--report-dir", str(tmp_path / "run"))
    assert run.returncode == 1, run.stdout + run.stderr
    findings = json.loads((tmp_path / "run" / "summary.json").read_text())["findings"]
    assert [f["kind"] for f in findings] == ["known"], findings
