"""One finding per cause: a planted regression is one group, its repro a server's config;
the minimizer stays within what a server can run; ``compare`` names new and fixed groups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.engine.groups import group_findings, signature
from harness.engine.results import Finding
from harness.model.config import Batch, Config
from harness.model.layouts import TreeMaskMode
from harness.model.repro_file import from_case, dump
from harness.model.validate import server_problem
from tests.helpers import sglang_or_skip, vmfuzz

CONFIG = Config(TreeMaskMode.FULL_MASK, max_bs=1, max_context_len=2, num_draft_tokens=2, topk=1, spec_steps=1)


def _finding(prop: str, detail: str, kind: str = "property", config: Config = CONFIG, place=None) -> Finding:
    return Finding(prop, detail, Path(f"{prop}.json"), config, [Batch((2, 2))], kind, place)


def test_one_cause_seen_by_many_properties_is_one_group():
    oob = "tree_mask: 4 cell(s) written at offsets [10, 16) outside its 8 cells (back redzone, request 1)"
    found = [_finding("no-oob-write", f"out-of-bounds write on the reused buffer (bs 2, max_bs 1): {oob}"),
             _finding("fallback-equivalence", "reuse vs fallback: tree_mask holds 8 cells, the batch's logical "
                                              "region needs 16 (FULL_MASK, bs 2, seq_lens [2, 2])"),
             _finding("capacity-soundness", "fits(2) is True for a 8-cell FULL_MASK buffer (max_bs 1), but 2 "
                                            "requests at max_context_len 2 need 16 cells")]
    groups = group_findings(found)
    assert [g.signature for g in groups] == ["overrun tree_mask above"]
    assert groups[0].properties == ["capacity-soundness", "fallback-equivalence", "no-oob-write"]


def test_different_causes_are_different_groups():
    below = "positions: 2 cell(s) written at offsets [-2, 0) outside its 4 cells (front redzone)"
    found = [_finding("no-oob-write", f"out-of-bounds write on the reused buffer (bs 1, max_bs 1): {below}"),
             _finding("reference-agreement", "reuse path vs oracle: tree_mask differs at 1 cell(s), first at "
                                             "cell 2 (request 0): 0 vs 1"),
             _finding("reference-agreement", "x: positions differs at 1: 3 vs 4"),
             _finding("no-oob-write", "target raised ValueError: bad", place="sglang/x.py:build"),
             _finding("no-oob-write", "target raised ValueError: bad", place="sglang/y.py:fill"),
             _finding("no-oob-write", "worker died", kind="target-crash")]
    sigs = [signature(f) for f in found]
    assert sigs == ["overrun positions below", "wrong tree_mask: tree cell that should be visible",
                    "wrong positions", "raise ValueError at sglang/x.py:build", "raise ValueError at sglang/y.py:fill",
                    "target-crash"]
    # FULL_MASK, seq_len 2, d 2: cell 0 of request 0 is a prefix column
    assert signature(_finding("reference-agreement", "y: tree_mask differs at 1 cell(s), first at cell 0 "
                                                     "(request 0): 1 vs 0")) == "wrong tree_mask: prefix column"


def test_server_problem_names_what_no_server_has():
    assert server_problem(CONFIG) is None
    for bad in (dict(max_context_len=0), dict(max_context_len=1), dict(num_draft_tokens=3, topk=2, spec_steps=1, max_context_len=3),):
        fields = {f: getattr(CONFIG, f) for f in CONFIG.__struct_fields__}
        cfg = Config(**{**fields, **bad})
        if bad.get("topk") == 2:
            assert server_problem(cfg) is None  # topk 2: the width is free up to the candidates
        else:
            assert server_problem(cfg), bad
    chain = Config(TreeMaskMode.QLEN_ONLY, max_bs=2, max_context_len=8, num_draft_tokens=2, topk=1, spec_steps=3)
    assert "spec_steps + 1" in server_problem(chain)


def test_planted_regression_is_one_group_everywhere(tmp_path):
    rep = tmp_path / "rep"
    r = vmfuzz("run", "--target", "reference+fits-off-by-one", "--seed", "1", "--report-dir", str(rep))
    assert r.returncode == 1, r.stderr
    s = json.loads((rep / "summary.json").read_text())
    assert s["counts"]["findings"] > 1 and s["counts"]["groups"] == 1
    (g,) = s["groups"]
    assert g["signature"] == "overrun tree_mask above" and g["count"] == s["counts"]["findings"]
    assert r.stdout.count("finding group 1:") == 1 and "finding group 2" not in r.stdout
    assert "1 finding group (" in r.stdout
    html = (rep / "report.html").read_text()
    assert html.count('class="finding group"') == 1
    assert html.index('class="finding group"') < html.index('id="findings"')
    repro = json.loads(Path(g["repro"]).read_text())
    assert server_problem(Config(**{**repro["config"], "mode": TreeMaskMode.parse(repro["config"]["mode"])})) is None
    assert vmfuzz("replay", g["repro"], "--report-dir", str(tmp_path / "replay")).returncode == 1


def test_planted_regression_in_sglang_is_one_group(tmp_path):
    """The same on the installed SGLang's real code: four properties see it, one group is shown."""
    sglang_or_skip()
    rep = tmp_path / "rep"
    props = [a for n in ("no-oob-write", "fallback-equivalence", "capacity-soundness", "reader-agreement")
             for a in ("--property", n)]
    r = vmfuzz("run", "--target", "sglang+fits-off-by-one", "--seed", "1", "--max-examples", "20", *props,
               "--report-dir", str(rep), timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    s = json.loads((rep / "summary.json").read_text())
    assert [g["signature"] for g in s["groups"]] == ["overrun tree_mask above"]
    assert s["groups"][0]["count"] == 4 and s["groups"][0]["server_valid"]
    assert r.stdout.count("finding group 1:") == 1
    assert (rep / "report.html").read_text().count('class="finding group"') == 1


def test_minimize_keeps_a_config_a_server_could_have(tmp_path):
    """A large failing case shrinks to a still-failing one with context >= the draft (it used to end at 0)."""
    config = Config(TreeMaskMode.FULL_MASK, max_bs=4, max_context_len=64, num_draft_tokens=4, topk=2, spec_steps=3)
    steps = [Batch((40, 7, 63, 12, 5))]
    src = dump(from_case("reference+fits-off-by-one", "capacity-soundness", config, steps), tmp_path / "big.json")
    out = tmp_path / "small.json"
    r = vmfuzz("minimize", str(src), "-o", str(out), "--report-dir", str(tmp_path / "rep"))
    assert r.returncode == 1, r.stdout + r.stderr
    small = json.loads(out.read_text())["config"]
    cfg = Config(**{**small, "mode": TreeMaskMode.parse(small["mode"])})
    assert server_problem(cfg) is None, small
    assert cfg.max_context_len >= cfg.num_draft_tokens >= 1
    assert vmfuzz("replay", str(out), "--report-dir", str(tmp_path / "replay")).returncode == 1


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("compare")
    common = ("--seed", "1", "--property", "no-oob-write", "--property", "capacity-soundness")
    for name, target in (("failing", "reference+fits-off-by-one"), ("fixed", "reference")):
        r = vmfuzz("run", "--target", target, *common, "--max-examples", "20", "--report-dir", str(base / name))
        assert r.returncode in (0, 1), r.stderr
    return base


def test_compare_names_the_fixed_group(two_runs, tmp_path):
    r = vmfuzz("compare", str(two_runs / "failing"), str(two_runs / "fixed"), "--report-dir", str(tmp_path / "a"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fixed          overrun tree_mask above" in r.stdout
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert [g["signature"] for g in s["changes"]["fixed"]] == ["overrun tree_mask above"]
    assert s["changes"]["new"] == [] and s["changes"]["still_failing"] == []
    # the fixed run's no-oob-write went on past the example that failed before: more reached
    assert s["changes"]["classes_gained"] and s["changes"]["examples"][1] > s["changes"]["examples"][0]
    assert s["changes"]["bounds"][0] and "classes" in r.stdout and "bounds" in r.stdout
    back = vmfuzz("compare", str(two_runs / "fixed"), str(two_runs / "failing"), "--report-dir", str(tmp_path / "b"))
    assert back.returncode == 1 and "NEW            overrun tree_mask above" in back.stdout
    same = vmfuzz("compare", str(two_runs / "failing"), str(two_runs / "failing"), "--report-dir", str(tmp_path / "c"))
    assert same.returncode == 0 and "still failing  overrun tree_mask above" in same.stdout


def test_compare_refuses_a_directory_without_reports(two_runs, tmp_path):
    (tmp_path / "empty").mkdir()
    r = vmfuzz("compare", str(tmp_path / "empty"), str(two_runs / "fixed"), "--report-dir", str(tmp_path / "r"))
    assert r.returncode == 2 and "holds no reports" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_raise_place_is_the_innermost_frame_outside_vmfuzz(tmp_path):
    import importlib.util
    from harness.engine.groups import raise_place
    src = tmp_path / "kernel_mod.py"
    src.write_text("def fill(x):\n    return inner(x)\n\ndef inner(x):\n    raise ValueError(x)\n")
    spec = importlib.util.spec_from_file_location("kernel_mod", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        mod.fill(1)
    except ValueError as exc:
        assert raise_place(exc) == f"{tmp_path.name}/kernel_mod.py:inner"


def test_a_cell_is_classed_in_the_step_the_detail_names():
    config = Config(TreeMaskMode.FULL_MASK, max_bs=2, max_context_len=4, num_draft_tokens=2, topk=1, spec_steps=1)
    # step 0 has an empty sequence (cell 0 is a tree cell), step 1 a sequence of 3 (cell 0 is a prefix column)
    f = Finding("multi-step-reuse", "step 1 of 2: reused vs fresh allocation: tree_mask differs at 2 cell(s), "
                "first at cell 0 (request 0): 1 vs 0", Path("m.json"), config, [Batch((0,)), Batch((3,))])
    assert signature(f) == "wrong tree_mask: prefix column"
    packed = _finding("packed-mask", "request 0's packed byte 0 (cells 0..7 of its block) is 0b11101111, "
                                     "the mask's bits LSB first are 0b11110111 (seq_lens [2, 2], d 2)")
    assert signature(packed) == "wrong packed_mask byte"
    assert signature(_finding("capacity-liveness", "fits(3) is False although bs <= max_bs 4: every such step")) \
        == "capacity-liveness: fits(N) is False although bs <= max_bs N"
