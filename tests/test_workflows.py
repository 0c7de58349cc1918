"""The workflows end to end: nightly reports, fault isolation, gate, minimize."""

from __future__ import annotations

import functools
import json
import xml.etree.ElementTree as ET

import msgspec
import pytest

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES
from vmfuzz.harness.model.repro_file import dump, from_case, load
from tests.helpers import ROOT, vmfuzz


def _junit_counts(path):
    suite = ET.parse(path).getroot().find("testsuite")
    cases = suite.findall("testcase")
    return {"tests": int(suite.get("tests")), "failures": int(suite.get("failures")),
            "skipped": int(suite.get("skipped")), "cases": [c.get("name") for c in cases],
            "failed_cases": [c.get("name") for c in cases if c.find("failure") is not None]}


@pytest.mark.slow
def test_nightly_with_workers_writes_four_reports_whose_counts_agree(tmp_path):
    rep = tmp_path / "rep"
    r = vmfuzz("run", "--profile", "nightly", "--time-budget", "20", "--workers", "2",
               "--report-dir", str(rep), "--db", str(tmp_path / "db"), "--target", "reference+pr33127")
    assert r.returncode in (0, 1), r.stderr
    for name in ("summary.json", "summary.md", "junit.xml", "report.html"):
        assert (rep / name).is_file(), name
    s = json.loads((rep / "summary.json").read_text())
    j = _junit_counts(rep / "junit.xml")
    assert j["tests"] == s["counts"]["properties"] == len(j["cases"]) == len(PROPERTIES)
    assert j["failures"] == s["counts"]["failed"] == len(j["failed_cases"])
    assert j["skipped"] == s["counts"]["skipped"]
    assert sorted(j["failed_cases"]) == sorted(p["name"] for p in s["properties"] if p["status"] == "failed")
    assert s["profile"] == "nightly" and isinstance(s["seed"], int) and s["workers"] == 2
    assert s["versions"]["torch"]
    assert (r.returncode == 1) == bool(s["findings"])
    for f in s["findings"]:
        assert load(rep / f["repro"]).property == f["property"]
    # the persistent database and the failures the next night replays first
    assert (tmp_path / "db" / "hypothesis").is_dir()
    kept = sorted(p.name for p in (tmp_path / "db" / "last-failures").glob("*.json"))
    assert len(kept) == len(s["findings"])


@pytest.mark.slow
@pytest.mark.parametrize("plugin,kind", [("AbortingTarget", "target-crash"), ("HangingTarget", "target-hang")])
def test_misbehaving_plugin_becomes_a_finding_and_the_run_uses_its_budget(tmp_path, plugin, kind):
    budget = 8.0
    rep = tmp_path / "rep"
    r = vmfuzz("run", "--target", f"tests.plugins:{plugin}", "--seed", "3", "--time-budget", str(budget),
               "--example-timeout", "1", "--property", "no-oob-write", "--property", "capacity-liveness",
               "--report-dir", str(rep))
    assert r.returncode == 1, r.stdout + r.stderr
    s = json.loads((rep / "summary.json").read_text())
    faults = [f for f in s["findings"] if f["kind"] == kind]
    assert faults, s["findings"]
    repro = load(rep / faults[0]["repro"])
    assert repro.fault == kind and repro.target == f"tests.plugins:{plugin}"
    # the run went on: the property after the faulting one ran, and the budget was used
    assert [p["name"] for p in s["properties"]] == ["no-oob-write", "capacity-liveness"]
    assert s["properties"][1]["examples"] > 0
    assert s["timings"]["total_seconds"] >= 0.8 * budget
    # and the saved fault replays as the same fault (a plug-in is imported only when named)
    again = vmfuzz("replay", str(rep / faults[0]["repro"]), "--example-timeout", "1", "--target", f"tests.plugins:{plugin}")
    assert again.returncode == 1 and kind in again.stdout


def test_gate_on_documentation_only_exits_at_once_and_says_why(tmp_path):
    changed = tmp_path / "changed.txt"
    changed.write_text("docs/basic_usage/speculative_decoding.md\nREADME.md\n")
    r = vmfuzz("gate", "--target", "reference", "--changed-files", str(changed), "--report-dir", str(tmp_path / "rep"))
    assert r.returncode == 0
    lines = r.stdout.strip().splitlines()
    assert "skipped" in lines[0] and "verify-mask" in lines[0]
    # CI still gets something to collect: a skipped testcase, and a summary for the PR comment
    assert lines[1:] == [f"reports: {tmp_path / 'rep'}/ (summary.json, summary.md, junit.xml, report.html)"]
    assert "<skipped" in (tmp_path / "rep" / "junit.xml").read_text()
    assert not (tmp_path / "rep" / "findings").exists()


def test_gate_recognises_verify_mask_paths():
    from vmfuzz.harness.engine.campaign.changes import touches_verify_mask
    hits = touches_verify_mask(["python/sglang/srt/layers/attention/verify_mask.py",
                                "python/sglang/srt/speculative/eagle_worker_v2.py",
                                "python/sglang/srt/managers/scheduler_pp_mixin.py",
                                "python/sglang/kernels/jit/csrc/speculative/tree.cuh",
                                "docs/index.md", "python/sglang/srt/layers/quantization/fp8.py"])
    assert len(hits) == 4 and "docs/index.md" not in hits


def test_gate_unreadable_changed_files_is_one_line_exit_2(tmp_path):
    r = vmfuzz("gate", "--target", "reference", "--changed-files", str(tmp_path / "missing.txt"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.slow
def test_minimize_full_mask_deployment_ends_at_max_bs_1_and_two_requests(tmp_path):
    dep = msgspec.json.decode((ROOT / "examples" / "deployment-pr33127.json").read_bytes())
    assert dep["cuda_graph_max_bs"] == 8 and len(dep["seq_lens"]) == 48 and min(dep["seq_lens"]) > 4000
    out = tmp_path / "min.json"
    r = vmfuzz("minimize", str(ROOT / "examples" / "deployment-pr33127.json"), "--target", "reference+pr33127",
               "-o", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "before:" in r.stdout and "after:" in r.stdout
    repro = load(out)
    assert repro.config.max_bs == 1 and repro.config.mode == "FULL_MASK"
    assert len(repro.batches) == 1 and len(repro.batches[0].seq_lens) == 2
    assert vmfuzz("replay", str(out)).returncode == 1
    assert vmfuzz("replay", str(out), "--target", "reference").returncode == 0


@functools.lru_cache(maxsize=None)
def _pr33127():
    from vmfuzz.harness.targets import resolve
    return resolve("reference+pr33127")


def _pr33127_fails(case):
    """The minimizer's question on the reference model with the PR's bug: no-oob-write's detail, or None."""
    from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
    try:
        PROPERTIES["no-oob-write"].check(_pr33127(), case[0], case[1])
    except PropertyFailure as exc:
        return exc.detail
    return None


def test_minimize_stops_where_no_single_simplification_keeps_failing():
    from vmfuzz.harness.engine.regression.shrink import _valid, candidates, minimize
    fails = _pr33127_fails

    start = (Config(TreeMaskMode.FULL_MASK, 3, 20, 3, 2, 2), [Batch((20, 19, 5, 20, 0, 18))])
    (config, steps), _, _ = minimize(start, fails)
    assert config.max_bs == 1 and steps[0].bs == 2
    # it ends at a config a server could have (not at context 0), and no single
    # simplification a server could have keeps it failing
    from vmfuzz.harness.model.validate import server_problem
    assert server_problem(config) is None and config.max_context_len >= config.num_draft_tokens
    for cand in candidates((config, steps)):
        cand = _valid(*cand, server=True)
        assert cand is None or fails(cand) is None


def test_minimize_lowers_linked_values_together():
    """README's crash (max_bs 8, nine requests at context 4096, d 4 over 3 steps): the capture and the batch
    past it shrink together (8 and 9 -> 1 and 2), and the draft's width with its steps (a chain's width is
    steps + 1: neither lowers alone), down to what the same overrun needs."""
    from vmfuzz.harness.engine.regression.shrink import minimize
    fails = _pr33127_fails

    start = (Config(TreeMaskMode.FULL_MASK, 8, 4096, 4, 1, 3), [Batch((4096,) * 9)])
    (config, steps), _, _ = minimize(start, fails)
    assert (config.max_bs, steps[0].bs, config.num_draft_tokens, config.spec_steps) == (1, 2, 2, 1), config
    assert config.max_context_len <= 2


def test_plain_repro_file_keeps_the_documented_keys_and_fault_round_trips(tmp_path):
    config = Config(TreeMaskMode.QLEN_ONLY, 2, 8, 2, 1, 1)
    plain = dump(from_case("reference", "no-oob-write", config, [Batch((1, 2))]), tmp_path / "a.json")
    assert "fault" not in json.loads(plain.read_text())
    crash = dump(from_case("x:y", "no-oob-write", config, [Batch((1,))], fault="target-crash"), tmp_path / "b.json")
    assert load(crash).fault == "target-crash"


def test_pr_replays_saved_repros_and_expects_them_to_hold_on_the_fixed_target(tmp_path):
    from vmfuzz.harness.engine.regression.regressions import read_saved, replay_saved, saved_repros
    from vmfuzz.harness.targets import resolve

    root = tmp_path / "repro"
    config = Config(TreeMaskMode.FULL_MASK, 1, 0, 2, 1, 1)
    dump(from_case("reference+pr33127", "no-oob-write", config, [Batch((0, 0))]), root / "pr33127" / "case.json")
    paths = read_saved(saved_repros([root]))
    [fixed] = replay_saved(paths, resolve("reference"), source="saved", findings_dir=tmp_path / "f")
    assert fixed.status == "held" and fixed.teeth is True and fixed.finding is None
    [broken] = replay_saved(paths, resolve("reference+fits-off-by-one"), source="saved",
                            findings_dir=tmp_path / "f")
    assert broken.status == "failed" and broken.finding.path.is_file()
    assert load(broken.finding.path).target == "reference+fits-off-by-one"


@pytest.mark.slow
def test_selftest_prints_the_kill_matrix(tmp_path):
    r = vmfuzz("selftest", "--variant", "row-offset", "--variant", "full-no-draft-span", "--max-examples", "10")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kill matrix" in r.stdout and "row-offset" in r.stdout and "all 2 variants caught" in r.stdout


def test_deployment_verdict_is_exact_arithmetic():
    from vmfuzz.harness.model.deployment_file import Deployment
    from vmfuzz.harness.engine.search.deployment import capacity_verdict
    from vmfuzz.harness.targets import resolve

    dep = Deployment(cuda_graph_max_bs=8, max_running_requests=48, context_length=4096,
                     num_draft_tokens=4, topk=1, spec_steps=3)
    assert capacity_verdict(resolve("reference+pr33127"), dep)[0] is True
    assert capacity_verdict(resolve("reference"), dep)[0] is False
    small = Deployment(cuda_graph_max_bs=8, max_running_requests=8, context_length=4096,
                       num_draft_tokens=4, topk=1, spec_steps=3)
    assert capacity_verdict(resolve("reference+pr33127"), small)[0] is False


def test_bad_deployment_file_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "dep.json"
    bad.write_text('{"cuda_graph_max_bs": 8}')
    r = vmfuzz("run", "--deployment", str(bad), "--max-examples", "1")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_output_is_line_oriented_under_ci(monkeypatch):
    from vmfuzz.harness.report.progress import LineProgress, progress
    monkeypatch.setenv("CI", "true")
    assert isinstance(progress(3, "x"), LineProgress)


@pytest.mark.parametrize("spec,can", [("reference+pr33127", True), ("reference", False)])
@pytest.mark.slow
def test_deployment_scoped_run_answers_whether_it_can_write_out_of_range(tmp_path, spec, can):
    rep = tmp_path / "rep"
    r = vmfuzz("run", "--deployment", str(ROOT / "examples" / "deployment-pr33127.json"), "--target", spec,
               "--seed", "1", "--max-examples", "5", "--property", "capacity-soundness",
               "--property", "capacity-liveness", "--report-dir", str(rep))
    assert r.returncode == (1 if can else 0), r.stdout + r.stderr
    d = json.loads((rep / "summary.json").read_text())["deployment"]
    assert d["can_write_out_of_range"] is can and d["cuda_graph_max_bs"] == 8
    assert ("CAN write out of range" if can else "cannot write out of range") in r.stdout
    for f in json.loads((rep / "summary.json").read_text())["findings"]:
        c = load(rep / f["repro"]).config
        assert (c.max_bs, c.max_context_len, c.mode) == (8, 4096, "FULL_MASK")


def test_plugin_targets_take_variants_and_are_named_by_their_spec():
    from vmfuzz.harness.targets import resolve
    t = resolve("tests.plugins:RaisingTarget+pr33127")
    assert t.name == "tests.plugins:RaisingTarget+pr33127"
    assert type(t).__name__ == "RaisingTarget" and t.fits.__name__ == "pre_fix_fits"


@pytest.mark.slow
def test_a_target_that_raises_is_a_finding_not_a_crash_of_the_harness(tmp_path):
    rep = tmp_path / "rep"
    r = vmfuzz("run", "--target", "tests.plugins:RaisingTarget", "--seed", "1", "--max-examples", "40",
               "--property", "no-oob-write", "--property", "capacity-liveness", "--report-dir", str(rep))
    assert r.returncode == 1, r.stdout + r.stderr
    s = json.loads((rep / "summary.json").read_text())
    [f] = s["findings"]
    assert "CUDA error" in f["detail"] and s["properties"][1]["status"] == "held"


@pytest.mark.parametrize("argv", [
    ["selftest", "--variant", "nope"],
    ["minimize", str(ROOT / "examples" / "deployment-pr33127.json"), "--target", "nosuch"],
    ["minimize", str(ROOT / "examples" / "deployment-pr33127.json"), "--property", "nope"],
    ["minimize", "no/such/file.json"],
    ["run", "--workers", "0"],
    ["run", "--time-budget", "-1"],
    ["gate", "--target", "reference", "--base", "no-such-revision-xyz", "--repo", str(ROOT)],
])
@pytest.mark.slow
def test_bad_input_is_one_line_on_stderr_and_exit_2(argv):
    r = vmfuzz(*argv)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_deployment_past_the_memory_limit_leaves_allocating_properties_not_driven_in_the_plan(tmp_path):
    # the plan says it once, before any work: the session searches the rest and reports these not driven
    from vmfuzz.harness.commands.planning import plan
    from vmfuzz.harness.commands.request import RunRequest
    from vmfuzz.harness.model.limits import MAX_BUFFER_CELLS
    dep = json.loads((ROOT / "examples" / "deployment-pr33127.json").read_text())
    dep.update(context_length=1 << 20, seq_lens=[1 << 20])
    (tmp_path / "dep.json").write_text(json.dumps(dep))
    request = RunRequest(command="run", target="reference", profile="dev", properties=tuple(PROPERTIES),
                         deployment=tmp_path / "dep.json", report_dir=tmp_path / "rep",
                         db=str(tmp_path / "db"), db_folder=tmp_path / "db")
    run_plan, _ = plan(request)
    assert run_plan.deployment.config.max_context_len == 1 << 20
    why = run_plan.not_driven
    assert all(f"over MAX_BUFFER_CELLS ({MAX_BUFFER_CELLS})" in why[n]
               for n in ("no-oob-write", "fallback-equivalence", "reference-agreement"))
    assert "capacity-soundness" not in why and "capacity-liveness" not in why  # arithmetic: any size
    # a FULL_MASK server is no shape of the chain writer's, whatever its size
    assert why["chain-writer"] == "this server's config (FULL_MASK, topk 1) is not a topk-1 chain in QLEN_ONLY"
    assert "over MAX_BUFFER_CELLS" in why["reader-agreement"]  # a FULL_MASK reader: its shape, too large
    assert list(why) == [n for n in PROPERTIES if n in why]  # in the plan's order
