"""Bounds per profile: --bounds, a widening nightly, and what summary.json records."""

import json

import pytest

from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.cli import main
from vmfuzz.harness.engine.campaign.profiles import PROFILES
from vmfuzz.harness.engine.campaign.session import RunPlan, execute
from vmfuzz.harness.report.progress import progress
from vmfuzz.harness.targets import resolve


@pytest.mark.parametrize("text, words", [
    ("d=1", "d must be at least 2"),
    ("depth=3", "is not KEY=VALUE"),
    ("topk=eight", "topk must be an integer"),
    ("max_bs", "is not KEY=VALUE"),
    (",", "at least one KEY=VALUE"),
    # past the memory limits: refused before the search, never a MemoryError read as a finding
    ("max_bs=1000000000000,context=1000000000000", "over MAX_SEARCH_REQUESTS"),
    ("d=100000", "over MAX_DRAFT_TOKENS"),
    ("max_bs=64,context=100000,d=64", "over MAX_BUFFER_CELLS"),
])
def test_bad_bounds_exit_2_with_one_line(capsys, tmp_path, text, words):
    assert main(["run", "--bounds", text, "--report-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


def test_user_bounds_are_searched_and_recorded(tmp_path, capsys):
    rc = main(["run", "--bounds", "d=16,topk=8,spec_steps=6,max_bs=3,context=5", "--seed", "3",
               "--max-examples", "25", "--property", "reference-agreement", "--property", "no-oob-write",
               "--report-dir", str(tmp_path)])
    assert rc == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    [b] = s["bounds"]
    assert (b["num_draft_tokens"], b["topk"], b["spec_steps"], b["max_bs"], b["max_context_len"]) == (16, 8, 6, 3, 5)
    assert s["reached"]["max_bs"] <= 3 and s["reached"]["d"] <= 16
    assert s["kernel"]["launches"] > 0 and 0 < s["kernel"]["kernel_share"] < 1


def test_a_widening_run_searches_each_step_and_reports_the_widest_reached(tmp_path):
    small, wide = Bounds(max_bs=1, max_context_len=2, num_draft_tokens=2, topk=1, spec_steps=1), \
        Bounds(max_bs=6, max_context_len=9, num_draft_tokens=9, topk=4, spec_steps=4)
    plan = RunPlan(target="reference", profile=PROFILES["dev"], seed=5, max_examples=30, time_budget=None,
                   report_dir=tmp_path, properties=["capacity-liveness", "reference-agreement"],
                   bounds_steps=(small, wide))
    outcome = execute(plan, resolve("reference"), lambda res, log: None, progress(2, "reference"))
    assert [b["max_bs"] for b in outcome.bounds_used] == [1, 6]
    [liveness, agreement] = outcome.results
    assert liveness.examples >= 60 and liveness.rounds == 2
    assert agreement.reached["max_bs"] > 1 and agreement.reached["d"] <= 9


def test_sglang_nightly_widens_to_production_draft_shapes_and_pr_stays_small():
    from vmfuzz.harness.targets.sglang.target import SglangTarget
    ladder = SglangTarget.bounds_ladder["nightly"]
    assert ladder[0] == SglangTarget.bounds and "pr" not in SglangTarget.bounds_ladder
    top = ladder[-1]
    assert (top.num_draft_tokens, top.topk, top.spec_steps, top.max_bs, top.max_context_len) == (16, 8, 6, 16, 256)
