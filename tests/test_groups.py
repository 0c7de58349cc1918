"""One finding per cause: a planted regression is one group, its repro a server's config;
the minimizer stays within what a server can run; ``compare`` names new and fixed groups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import msgspec

from vmfuzz.harness.engine.campaign.groups import group_findings, signature
from vmfuzz.harness.engine.search.results import Finding
from vmfuzz.harness.model.origin import BEYOND_CAPACITY, WITHIN_CAPACITY, Origin
from vmfuzz.harness.properties.kit import mask_cell_class
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.repro_file import from_case, dump
from vmfuzz.harness.model.validate import server_problem
from tests.helpers import sglang_or_skip, vmfuzz

CONFIG = Config(TreeMaskMode.FULL_MASK, max_bs=1, max_context_len=2, num_draft_tokens=2, topk=1, spec_steps=1)


OVERRUN = Origin("no-oob-write", "overrun", writer="verify step", buffer="tree_mask", side="above",
                 cell=BEYOND_CAPACITY)


def _finding(origin: Origin, detail: str = "words", config: Config = CONFIG, kind: str = "property") -> Finding:
    return Finding(origin.property, detail, Path(f"{origin.property}.json"), config, [Batch((2, 2))], kind,
                   origin=origin)


def _as(origin: Origin, prop: str, **changes) -> Origin:
    return msgspec.structs.replace(origin, property=prop, **changes)


def test_one_cause_seen_by_many_properties_is_one_group():
    found = [_finding(OVERRUN),
             _finding(_as(OVERRUN, "fallback-equivalence", step=0, steps=1)),
             _finding(_as(OVERRUN, "capacity-soundness", stage="arithmetic"))]
    groups = group_findings(found)
    assert [g.signature for g in groups] == ["overrun tree_mask above by the verify step "
                                             f"({BEYOND_CAPACITY})"]
    assert groups[0].properties == ["capacity-soundness", "fallback-equivalence", "no-oob-write"]


def test_an_overrun_and_the_wrong_cells_of_the_same_write_are_one_group():
    """A row written past its block both leaves the buffer and lands in the wrong cells: one cause."""
    shifted = Origin("no-oob-write", "overrun", writer="verify step", buffer="tree_mask", side="above")
    wrong = Origin("reference-agreement", "wrong", writer="verify step", buffer="tree_mask",
                   cell="tree cell that should be visible")
    assert len(group_findings([_finding(shifted), _finding(wrong)])) == 1
    # alone, the wrong cells are their own cause
    assert len(group_findings([_finding(wrong), _finding(_as(wrong, "fallback-equivalence"))])) == 1


def test_two_overruns_of_the_tree_mask_are_two_groups():
    """Another writer, or another request class (a capacity bug vs a misplaced row), is another cause."""
    chain = _as(OVERRUN, "chain-writer", writer="chain writer")
    misplaced = _as(OVERRUN, "no-oob-write", cell=WITHIN_CAPACITY)
    below = _as(OVERRUN, "no-oob-write", side="below")
    groups = group_findings([_finding(o) for o in (OVERRUN, chain, misplaced, below)])
    assert len(groups) == 4 and len({g.key for g in groups}) == 4


def test_different_causes_are_different_groups():
    found = [Origin("no-oob-write", "overrun", writer="verify step", buffer="retrieve_index", side="below"),
             Origin("reference-agreement", "wrong", writer="verify step", buffer="tree_mask",
                    cell="tree cell that should be visible"),
             Origin("reference-agreement", "wrong", writer="verify step", buffer="positions", cell="value"),
             Origin("no-oob-write", "raise", exc_type="ValueError", frame="sglang/x.py:build"),
             Origin("no-oob-write", "raise", exc_type="ValueError", frame="sglang/y.py:fill"),
             Origin("no-oob-write", "crash")]
    sigs = [signature(_finding(o)) for o in found]
    assert sigs == ["overrun retrieve_index below by the verify step",
                    "wrong tree_mask by the verify step: tree cell that should be visible",
                    "wrong positions by the verify step: value", "raise ValueError at sglang/x.py:build",
                    "raise ValueError at sglang/y.py:fill", "target-crash"]
    assert len(group_findings([_finding(o) for o in found])) == len(found)


def test_where_a_cause_was_seen_is_not_part_of_it():
    """The same wrong cell at step 3 of 5, on graph replay, is the same cause as at step 0 eagerly."""
    a = Origin("reader-agreement", "wrong", writer="triton reader", buffer="mask_indptr", cell="request window",
               stage="eager", step=0, steps=1)
    b = msgspec.structs.replace(a, stage="replay", step=3, steps=5)
    assert a.cause() == b.cause() and len(group_findings([_finding(a), _finding(b)])) == 1


def test_the_mask_cell_class_comes_from_the_layout():
    """FULL_MASK, seq_len 2, d 2: cell 0 of request 0 is a prefix column, cell 2 a tree cell."""
    batch = Batch((2, 2))
    assert mask_cell_class(CONFIG, batch, 0, 0) == "prefix column"
    assert mask_cell_class(CONFIG, batch, 2, 1) == "tree cell that should be visible"
    assert mask_cell_class(CONFIG, batch, 100, 0) == "padding past the batch's region"


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


@pytest.mark.slow
def test_planted_regression_is_one_group_everywhere(tmp_path):
    rep = tmp_path / "rep"
    r = vmfuzz("run", "--target", "reference+fits-off-by-one", "--seed", "1", "--report-dir", str(rep))
    assert r.returncode == 1, r.stderr
    s = json.loads((rep / "summary.json").read_text())
    assert s["counts"]["findings"] > 1 and s["counts"]["groups"] == 1
    (g,) = s["groups"]
    assert g["signature"].startswith("overrun tree_mask above") and g["count"] == s["counts"]["findings"]
    assert g["origin"]["effect"] == "overrun" and g["key"]
    assert r.stdout.count("finding group 1:") == 1 and "finding group 2" not in r.stdout
    assert "1 finding group (" in r.stdout
    html = (rep / "report.html").read_text()
    assert html.count('class="finding group"') == 1
    assert html.index('class="finding group"') < html.index('id="findings"')
    # the report folder travels whole (an artifact, a merge): its repros are named by their place in it
    assert [g["repro"], *g["members"]] == [f"findings/{Path(p).name}" for p in [g["repro"], *g["members"]]]
    assert {f["repro"] for f in s["findings"]} == set(g["members"])
    assert str(rep) not in (rep / "summary.md").read_text() + html
    assert str(rep / g["repro"]) in r.stdout  # the terminal names a file one can open from here
    repro = json.loads((rep / g["repro"]).read_text())
    assert server_problem(Config(**{**repro["config"], "mode": TreeMaskMode.parse(repro["config"]["mode"])})) is None
    assert vmfuzz("replay", str(rep / g["repro"]), "--report-dir", str(tmp_path / "replay")).returncode == 1


@pytest.mark.slow
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
    assert [g["signature"].split(" by ")[0] for g in s["groups"]] == ["overrun tree_mask above"]
    assert s["groups"][0]["count"] == 4 and s["groups"][0]["server_valid"]
    assert r.stdout.count("finding group 1:") == 1
    assert (rep / "report.html").read_text().count('class="finding group"') == 1


@pytest.mark.slow
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


@pytest.mark.slow
def test_compare_names_the_fixed_group(two_runs, tmp_path):
    r = vmfuzz("compare", str(two_runs / "failing"), str(two_runs / "fixed"), "--report-dir", str(tmp_path / "a"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fixed          overrun tree_mask above" in r.stdout
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert [g["signature"].split(" by ")[0] for g in s["changes"]["fixed"]] == ["overrun tree_mask above"]
    assert s["changes"]["new"] == [] and s["changes"]["still_failing"] == []
    # the fixed run's no-oob-write went on past the example that failed before: more reached
    assert s["changes"]["classes_gained"] and s["changes"]["examples"][1] > s["changes"]["examples"][0]
    assert s["changes"]["bounds"][0] and "classes" in r.stdout and "bounds" in r.stdout
    back = vmfuzz("compare", str(two_runs / "fixed"), str(two_runs / "failing"), "--report-dir", str(tmp_path / "b"))
    assert back.returncode == 1 and "NEW            overrun tree_mask above" in back.stdout
    # the new group's repro, named relative to its report folder, is printed as a file one can open
    shown = back.stdout.split("NEW            ")[1].splitlines()[0].rsplit(": ", 1)[1]
    assert Path(shown).is_file() and Path(shown).is_relative_to(two_runs / "failing"), shown
    same = vmfuzz("compare", str(two_runs / "failing"), str(two_runs / "failing"), "--report-dir", str(tmp_path / "c"))
    assert same.returncode == 0 and "still failing  overrun tree_mask above" in same.stdout


@pytest.mark.slow
def test_compare_refuses_a_directory_without_reports(two_runs, tmp_path):
    (tmp_path / "empty").mkdir()
    r = vmfuzz("compare", str(tmp_path / "empty"), str(two_runs / "fixed"), "--report-dir", str(tmp_path / "r"))
    assert r.returncode == 2 and "holds no reports" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_raise_place_is_the_innermost_frame_outside_vmfuzz(tmp_path):
    import importlib.util
    from vmfuzz.harness.engine.core.failures import raise_place
    src = tmp_path / "kernel_mod.py"
    src.write_text("def fill(x):\n    return inner(x)\n\ndef inner(x):\n    raise ValueError(x)\n")
    spec = importlib.util.spec_from_file_location("kernel_mod", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        mod.fill(1)
    except ValueError as exc:
        assert raise_place(exc) == f"{tmp_path.name}/kernel_mod.py:inner"


#: a driver that runs the CLI with every finding's words replaced: what reads origins cannot tell
REWORDED = """
import sys
import vmfuzz.harness.properties.kit as kit
original = kit.PropertyFailure.__init__
def reworded(self, origin, detail):
    original(self, origin, "reworded " + "".join(reversed(str(detail))) + " 12345")
kit.PropertyFailure.__init__ = reworded
from vmfuzz.harness.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("variant", ["fits-off-by-one", "unfilled-prefix", "hybrid-decode-mask"])
@pytest.mark.slow
def test_rewording_every_message_changes_no_group_compare_or_known_match(variant, tmp_path):
    """Groups, compare and known matching read origins: a run whose every finding message is
    reworded groups the same, compares as "still failing" (nothing new, nothing fixed)."""
    import subprocess
    import sys
    driver = tmp_path / "reworded.py"
    driver.write_text(REWORDED)
    args = ("run", "--target", f"reference+{variant}", "--seed", "3", "--max-examples", "25")
    plain = vmfuzz(*args, "--report-dir", str(tmp_path / "plain"))
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "CI": "true"}
    other = subprocess.run([sys.executable, str(driver), *args, "--report-dir", str(tmp_path / "other")],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert plain.returncode == other.returncode == 1, plain.stderr + other.stderr
    a = json.loads((tmp_path / "plain" / "summary.json").read_text())
    b = json.loads((tmp_path / "other" / "summary.json").read_text())
    assert all(f["detail"].startswith("reworded ") for f in b["findings"])  # the words did change
    assert [(g["key"], g["count"], g["properties"]) for g in a["groups"]] == \
        [(g["key"], g["count"], g["properties"]) for g in b["groups"]]
    cmp = vmfuzz("compare", str(tmp_path / "plain"), str(tmp_path / "other"), "--report-dir", str(tmp_path / "c"))
    assert cmp.returncode == 0, cmp.stdout + cmp.stderr
    c = json.loads((tmp_path / "c" / "summary.json").read_text())["changes"]
    assert c["new"] == [] and c["fixed"] == [] and len(c["still_failing"]) == len(a["groups"])


def test_minimizing_keeps_the_findings_origin():
    """A candidate that fails another way (here: a raise once the batch is small) is not a smaller
    case of the finding: the minimizer keeps the overrun and never drifts into the raise."""
    from types import SimpleNamespace

    from vmfuzz.harness.engine.regression.shrink import checker, minimize
    from vmfuzz.harness.properties.kit import fail

    def check(target, config, batches, device="cpu"):
        bs = batches[0].bs
        if bs <= 2:
            raise IndexError("a smaller batch trips something else")
        if bs > config.max_bs:
            fail("no-oob-write", f"bs {bs} past max_bs", effect="overrun", writer="verify step",
                 buffer="tree_mask", side="above", cell=BEYOND_CAPACITY)

    prop = SimpleNamespace(name="no-oob-write", check=check)
    config = Config(TreeMaskMode.FULL_MASK, max_bs=2, max_context_len=4, num_draft_tokens=2, topk=1, spec_steps=1)
    still_fails, close = checker(prop, None, "cpu", None, 30.0)
    (small_config, small), detail, _ = minimize((config, [Batch((4, 4, 4, 4, 4, 4))]), still_fails)
    close()
    assert detail.origin.effect == "overrun" and small[0].bs > small_config.max_bs and small[0].bs > 2
    # told which origin to keep (a repro's recorded one), a case failing only another way is not it
    keep = Origin("no-oob-write", "raise", exc_type="IndexError", frame="tests/test_groups.py:check")
    still_fails, _ = checker(prop, None, "cpu", None, 30.0, keep=keep)
    assert still_fails((config, [Batch((4, 4, 4, 4))])) is None
    assert still_fails((config, [Batch((4, 4))])).origin.exc_type == "IndexError"


@pytest.mark.slow
def test_readmes_crash_report_minimizes_to_its_overrun_or_says_it_does_not_reproduce(tmp_path):
    """README's crash.json: on released SGLang (fixed) it reproduces nothing new (the known routing
    entry is listed, never minimized into); with the regression layered it shrinks to no-oob-write."""
    sglang_or_skip()
    crash = tmp_path / "crash.json"
    crash.write_text(json.dumps({"config": {"mode": "FULL_MASK", "max_bs": 8, "max_context_len": 4096,
                                            "num_draft_tokens": 4, "topk": 1, "spec_steps": 3},
                                 "batches": [{"seq_lens": [4096] * 9}]}))
    fixed = vmfuzz("minimize", str(crash), "--target", "sglang", "-o", str(tmp_path / "a.json"),
                   "--report-dir", str(tmp_path / "ra"), timeout=900)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "nothing to minimize" in fixed.stdout and not (tmp_path / "a.json").exists()
    bad = vmfuzz("minimize", str(crash), "--target", "sglang+pr33127", "-o", str(tmp_path / "b.json"),
                 "--report-dir", str(tmp_path / "rb"), timeout=900)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    small = json.loads((tmp_path / "b.json").read_text())
    assert small["property"] == "no-oob-write" and small["origin"]["effect"] == "overrun"


@pytest.mark.parametrize("origin,why", [({"property": "x", "effect": "bogus"}, "is not one of"),
                                        ({"property": "x", "effect": "overrun", "step": 10 ** 30}, "outside 0..64"),
                                        ("garbage", "Expected `object | null`")])
@pytest.mark.slow
def test_a_repro_with_a_bad_origin_is_one_line_exit_2(origin, why, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"config": {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 4,
                                          "num_draft_tokens": 3, "topk": 2, "spec_steps": 2},
                               "batches": [{"seq_lens": [4, 1]}], "origin": origin}))
    r = vmfuzz("replay", str(bad), "--report-dir", str(tmp_path / "r"))
    assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_known_entry_labels_a_group_only_when_it_names_every_member(tmp_path):
    """A wrong output of the writer that overran a buffer joins the overrun's group; the group is
    known only if the entry names that member too. Otherwise it is new: the verdict, new_groups and a
    merge of the run's shards all say so."""
    from types import SimpleNamespace

    from vmfuzz.harness.engine.search.results import Finding, PropertyResult
    from vmfuzz.harness.engine.campaign.session import RunOutcome
    from vmfuzz.harness.model.config import Config
    from vmfuzz.harness.model.layouts import TreeMaskMode
    from vmfuzz.harness.model.origin import Origin
    from vmfuzz.harness.report.findings import new_groups
    from vmfuzz.harness.report.merge import join_groups
    overrun = Origin("no-oob-write", "overrun", writer="tree kernel", buffer="tree_mask", side="above",
                     cell="past the end")
    wrong = Origin("reference-agreement", "wrong", writer="tree kernel", buffer="tree_mask", cell="prefix column")
    config = Config(TreeMaskMode.FULL_MASK, 2, 8, 4, 2, 2)
    found = [Finding(o.property, "x", tmp_path / f"{o.effect}.json", config, [], origin=o) for o in (overrun, wrong)]
    results = [PropertyResult(f.prop, finding=f) for f in found]
    entry = SimpleNamespace(name="the-overrun", matches=lambda origin: origin == overrun)
    outcome = RunOutcome(SimpleNamespace(fail_on_known=False), "t", {}, "", results=results,
                         known=[SimpleNamespace(entry=entry, status="reproduces", reproduces=True)])
    [group] = outcome.groups
    assert len(group["members"]) == 2, group  # the join rule folded the wrong output in
    assert group["known"] is None and new_groups(outcome) == 1 and outcome.failed
    # the overrun alone is the known entry's group
    only = RunOutcome(SimpleNamespace(fail_on_known=False), "t", {}, "", results=results[:1], known=outcome.known)
    assert only.groups[0]["known"] == "the-overrun" and new_groups(only) == 0 and not only.failed
    # a merge of a shard where it is known and one where it is not: not known
    shard = {**group, "known": "the-overrun"}
    assert join_groups([{"groups": [shard]}, {"groups": [group]}])[0]["known"] is None
