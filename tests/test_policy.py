import copy

import pytest

from vmfuzz.harness.cli import main
from vmfuzz.harness.model.config import Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.engine.search.policy import grid, verify_policy
from vmfuzz.harness.model.repro_file import load
from vmfuzz.harness.targets import resolve


def test_grid_reaches_production_scale():
    configs = grid()
    assert max(c.max_bs for c in configs) == 1024
    assert max(c.d for c in configs) == 64
    assert max(c.max_context_len for c in configs) == 1 << 20
    assert {c.mode for c in configs} == {TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY}


def test_reference_policy_holds(tmp_path, capsys):
    assert main(["verify-policy", "--report-dir", str(tmp_path)]) == 0
    assert "held" in capsys.readouterr().out
    assert not (tmp_path / "findings").exists()


@pytest.mark.parametrize("variant", ["pr33127", "fits-off-by-one", "full-no-draft-span"])
@pytest.mark.slow
def test_capacity_variants_are_refuted_with_a_replayable_repro(variant, tmp_path, capsys):
    spec = f"reference+{variant}"
    assert main(["verify-policy", "--target", spec, "--report-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "capacity-soundness" in out
    path = tmp_path / "findings" / "capacity-soundness.json"
    repro = load(path)
    assert repro.target == spec and repro.config.num_draft_tokens >= 2
    assert main(["replay", str(path)]) == 1
    assert main(["replay", str(path), "--target", "reference"]) == 0


def test_over_cautious_policy_fails_liveness():
    target = copy.copy(resolve("reference"))
    target.fits = lambda mask, bs: bs < mask.max_bs  # never reuses at the captured size
    report = verify_policy(target, configs=[Config(TreeMaskMode.QLEN_ONLY, 8, 16, 4, 2, 2)])
    assert set(report.first) == {"capacity-liveness"}
    assert report.first["capacity-liveness"].bs == 8


def test_bad_target_is_usage_error(capsys):
    assert main(["verify-policy", "--target", "reference+nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]
