"""bench/mutation_score.py's parts that decide a mutant's fate, without running a gate.

The whole pipeline (cosmic-ray, a gate per mutant) takes a minute a mutant on
SGLang; PERFORMANCE.md records its runs. Here: a gate's exit is read as the
right outcome, the copy cosmic-ray edits is never the installed file, the
mutated file is found, and the sample stays inside the driven functions.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import mutation_kill  # noqa: E402
import mutation_score  # noqa: E402
import mutation_equiv  # noqa: E402
import sglang_tests  # noqa: E402
from mutation_table import classify, killed_by, killing_properties, mutant_row, render  # noqa: E402

pytest.importorskip("cosmic_ray")
from cosmic_ray.work_item import WorkerOutcome, WorkResult  # noqa: E402

CODE_DIFF = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-    return bs <= self.max_bs\n+    return bs < self.max_bs\n"
LOG_DIFF = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-    logger.info('a %d', 1 + 2)\n+    logger.info('a %d', 1 - 2)\n"


@pytest.mark.parametrize("output, diff, outcome", [
    ("vmfuzz-kill: exit 1 in 3s", CODE_DIFF, "killed"),
    ("vmfuzz-kill: exit 0 in 3s", CODE_DIFF, "survived"),
    # equivalence is read from the outputs, never from the diff's text
    ("vmfuzz-kill: exit 0 in 3s\nvmfuzz-equiv: identical (812 outputs compared)", CODE_DIFF, "suspected-equivalent"),
    ("vmfuzz-kill: exit 0 in 3s\nvmfuzz-equiv: differs: verify ->.tree_mask (3 outputs; first x)", LOG_DIFF,
     "survived"),
    ("vmfuzz-kill: exit 0 in 3s", LOG_DIFF, "survived"),  # outputs not compared: never equivalent
    ("vmfuzz-kill: exit 3 in 3s", CODE_DIFF, "out-of-step"),  # could not check: never a kill
    # the gate measured the mutated line: no property ran it (exit 3), or it lies off the mask's path
    ('vmfuzz-kill: exit 3 in 3s\nvmfuzz-lines: {"never_ran": true, "outside": false, "judged_by": []}', CODE_DIFF,
     "not-exercised"),
    ('vmfuzz-kill: exit 0 in 3s\nvmfuzz-lines: {"never_ran": false, "outside": true, "judged_by": []}', CODE_DIFF,
     "off-path"),
    # a line a property ran is on the path wherever it lies: its survivor is a false green
    ('vmfuzz-kill: exit 0 in 3s\nvmfuzz-lines: {"never_ran": false, "outside": true, "judged_by": ["routing"]}',
     CODE_DIFF, "survived"),
    ("vmfuzz-kill: exit 2 in 3s", CODE_DIFF, "error"),
    ("timeout", CODE_DIFF, "timed-out"),
    ("Traceback ...", CODE_DIFF, "error"),  # the kill command itself broke: not a kill
])
def test_a_gates_exit_is_read_as_its_outcome(output, diff, outcome):
    result = WorkResult(worker_outcome=WorkerOutcome.NORMAL, output=output, diff=diff)
    assert classify(result) == outcome


def test_the_copy_cosmic_ray_edits_is_never_the_installed_file(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "a" / "b").mkdir(parents=True)
    (pkg / "a" / "b" / "m.py").write_text("x = 1\n")
    (pkg / "a" / "other.py").write_text("y = 2\n")
    (pkg / "a" / "__pycache__").mkdir()
    copy = tmp_path / "copy"
    mutation_score.mirror(pkg, copy, {Path("a/b/m.py")})
    assert not (copy / "a" / "b" / "m.py").is_symlink() and (copy / "a" / "other.py").is_symlink()
    assert not (copy / "a" / "__pycache__").exists()
    (copy / "a" / "b" / "m.py").write_text("x = 2\n")
    assert (pkg / "a" / "b" / "m.py").read_text() == "x = 1\n"

    os.chdir(tmp_path)
    (tmp_path / "python").mkdir()
    os.rename(copy, tmp_path / "python" / "sglang")
    driven = {"package": str(pkg), "files": {"a/b/m.py": ["p"], "a/other.py": ["q"]}}
    assert mutation_kill.mutated_files(driven) == ["a/b/m.py"]


def test_the_sample_stays_inside_the_driven_functions():
    src = "def f():\n    return 1\n\nclass C:\n    def g(self):\n        return 2\n\n    def h(self):\n        return 3\n"
    assert mutation_score.driven_lines(src, ["C.g"]) == [(5, 6)]
    assert mutation_score.driven_lines(src, ["f", "C.h"]) == [(1, 2), (8, 9)]
    assert mutation_score.driven_lines(src, ["", "f"]) is None  # a whole-file row: every line


def test_a_kill_by_the_mutant_raising_is_told_apart_from_a_property_s_check():
    """Read from the typed origins the kill command prints, never from finding text."""
    raised = 'vmfuzz-origin: {"effect": "raise", "exc_type": "IndexError", "property": "no-oob-write"}\n'
    checked = ('vmfuzz-origin: {"buffer": "tree_mask", "effect": "overrun", "property": "no-oob-write", '
               '"side": "above", "writer": "verify step"}\n')
    crashed = 'vmfuzz-origin: {"effect": "crash", "property": "routing"}\n'
    assert killed_by(raised) == "the mutant raising"
    assert killed_by(crashed) == "the mutant raising"
    assert killed_by(checked) == "a property's check"
    assert killed_by(raised + checked) == "a property's check"
    assert killing_properties(raised + checked + crashed) == ["no-oob-write"]
    # words that look like a finding credit nothing: only an origin does
    words = "      finding (property): out-of-bounds write on the reused buffer (bs 2)\n"
    assert killed_by(words) == "unknown" and killing_properties(words) == []


def test_a_run_with_no_output_credits_nothing():
    assert killed_by("") == "unknown" and killed_by(None) == "unknown"
    assert killing_properties("vmfuzz-kill: exit 1 in 3.0s") == []


PROPS = ["no-oob-write", "reader-agreement", "packed-mask", "allocation-soundness"]


def _gate_record(folder: Path, target_name: str, properties=PROPS, examples: int = 6) -> dict:
    """What a gate records (``output_record`` switched on through the environment, as the bench does):
    each property's search, its checks run through the same ``direct_check`` the gate uses."""
    from vmfuzz.harness.engine.core import output_record
    from vmfuzz.harness.engine.search.search import run_property
    from vmfuzz.harness.model.bounds import Bounds
    from vmfuzz.harness.properties import PROPERTIES
    from vmfuzz.harness.targets import resolve
    target = resolve(target_name)
    old = os.environ.get(output_record.DIR_ENV)
    os.environ[output_record.DIR_ENV] = str(folder)
    try:
        for name in properties:
            run_property(target, PROPERTIES[name], seed=7, max_examples=examples, bounds=Bounds(),
                         findings_dir=folder / "findings")
        output_record.flush()
    finally:
        os.environ.pop(output_record.DIR_ENV)
        if old is not None:
            os.environ[output_record.DIR_ENV] = old
        output_record._record = None
    return output_record.merged(folder)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return [_gate_record(tmp_path_factory.mktemp(f"pristine{k}"), "reference") for k in range(2)]


@pytest.mark.parametrize("variant, field", [
    ("row-offset", "verify ->.tree_mask"),  # the tree kernel writes every row d cells late
    ("pack-msb-first", "pack_mask ->.buffer"),  # the packed reader view
    ("eager-indptr-no-draft-span", "read_eager ->.indptr"),  # the Triton reader's metadata
])
def test_a_survivor_whose_outputs_differ_names_the_output(pristine, variant, field, tmp_path):
    """What the gate handed its checks, recorded during its run, against the pristine code's (here the
    reference target stands for SGLang and a known-bad variant for a mutant)."""
    from vmfuzz.harness.engine.core import output_record
    mutant = _gate_record(tmp_path, "reference+" + variant)
    diffs, compared = output_record.differences(pristine, mutant)
    assert compared and diffs and field in {mutation_equiv.field_of(k) for k in diffs}, diffs[:5]
    line = mutation_equiv.verdict(diffs, compared)
    assert line.startswith("differs: ") and mutation_equiv.field_of(diffs[0]) in line and f"of {compared} " in line


def test_unchanged_outputs_are_suspected_equivalent_over_every_example(pristine, tmp_path):
    from vmfuzz.harness.engine.core import output_record
    again = _gate_record(tmp_path, "reference")
    diffs, compared = output_record.differences(pristine, again)
    assert diffs == [] and compared == len(pristine[0])
    # every example of every property is on the record, each case under its own digest
    cases = {" ".join(k.split(" ", 2)[:2]) for k in again}
    assert {c.split(" ")[0] for c in cases} == set(PROPS) and len(cases) > len(PROPS) * 3
    assert mutation_equiv.verdict([], compared).startswith("identical")
    assert mutation_equiv.verdict([], 0).startswith("not checked")


def test_what_differs_between_pristine_runs_is_never_compared():
    from vmfuzz.harness.engine.core import output_record
    a, t = "packed-mask c0 call1:pack_mask ->.indptr", "packed-mask c0 call1:pack_mask ->.buffer"
    runs = [{a: ["1"], t: ["5"]}, {a: ["1"], t: ["6"]}]
    assert output_record.differences(runs, {a: ["1"], t: ["7"]}) == ([], 1)
    assert output_record.differences(runs, {a: ["2"], t: ["7"]}) == ([a], 1)
    # a call the pristine copy never made, in a case both checked, is a difference too
    extra = "packed-mask c0 call2:pack_mask ->.indptr"
    assert output_record.differences(runs, {**runs[0], extra: ["1"]}) == ([extra], 1)
    # a case only one run checked is not compared; one answer seen twice differently is noise
    other = "packed-mask c9 call1:pack_mask ->.indptr"
    assert output_record.differences(runs, {a: ["1"], other: ["3"]}) == ([], 1)
    assert output_record.differences([{a: ["1", "2"]}, {a: ["1", "2"]}], {a: ["3"]}) == ([], 0)


def _fake_sglang(root: Path, value: int) -> Path:
    pkg = root / "python" / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (root / "python" / "sglang" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "mask.py").write_text(f"def width():\n    return {value}\n")
    return root


def test_sglang_s_own_tests_judge_the_same_mutant(tmp_path):
    """A fake checkout: one test that imports the mutated module and fails on the mutant, one that
    fails unmutated (a GPU test, say: never used), one about another module (not selected)."""
    tests = tmp_path / "checkout" / "test"
    tests.mkdir(parents=True)
    (tests / "test_mask.py").write_text("from sglang.srt.mask import width\n\n"
                                        "def test_width():\n    assert width() == 8\n")
    (tests / "test_needs_gpu.py").write_text("from sglang.srt import mask\n\n"
                                             "def test_gpu():\n    assert False, 'no GPU'\n")
    (tests / "test_other.py").write_text("import sglang.srt.other\n\ndef test_x():\n    pass\n")
    pristine, mutant = _fake_sglang(tmp_path / "pristine", 8), _fake_sglang(tmp_path / "mutant", 9)
    chosen = sglang_tests.select(tests, ["srt/mask.py"], pristine)
    assert chosen == {"srt/mask.py": [f"{tests / 'test_mask.py'}::test_width"]}
    assert sglang_tests.verdict(chosen, ["srt/mask.py"], mutant).startswith("killed")
    assert sglang_tests.verdict(chosen, ["srt/mask.py"], pristine).startswith("survived")
    assert sglang_tests.verdict(None, ["srt/mask.py"], mutant) == "not run: no checkout given"
    assert sglang_tests.verdict(chosen, ["srt/other.py"], mutant).startswith("not run")


def _finished_run(tmp_path: Path, outputs: dict[str, str]) -> Path:
    """A WORK directory as an exec leaves it: worker-0's pristine copy of a one-file fake SGLang (``width``
    returns 8) and one NumberReplacer mutant of it (8 -> 9) per job, each with the kill command's output."""
    pristine = _fake_sglang(tmp_path / "pristine", 8) / "python" / "sglang"
    work = tmp_path / "work"
    mutation_score.mirror(pristine, work / "worker-0" / "python" / "sglang", {Path("srt/mask.py")})
    (work / "driven.json").write_text(json.dumps({"package": str(pristine), "files": {"srt/mask.py": ["p"]}}))
    (work / "plan.json").write_text(json.dumps({"sample": len(outputs), "of": 2, "seed": 1}))
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import MutationSpec, WorkItem
    with use_db(str(work / "session.sqlite"), WorkDB.Mode.create) as db:
        for job, output in outputs.items():
            db.add_work_item(WorkItem(job_id=job, mutations=[MutationSpec(
                module_path="python/sglang/srt/mask.py", operator_name="core/NumberReplacer", occurrence=0,
                start_pos=(2, 11), end_pos=(2, 12))]))
            db.set_result(job, WorkResult(worker_outcome=WorkerOutcome.NORMAL, diff=CODE_DIFF, output=output))
    return work


def test_sglang_s_own_tests_judge_mutants_an_earlier_exec_ran(tmp_path):
    """``mutation_score.py sglang-tests`` fills only that column of a finished run: each mutant is
    written into worker-0 again, judged, and put back; the gate's own verdict is left as it was. A
    test file whose other test fails unmutated (written for another release, say) still counts its
    passing test."""
    checkout = tmp_path / "checkout" / "test"
    checkout.mkdir(parents=True)
    (checkout / "test_mask.py").write_text("from sglang.srt.mask import width\n\n"
                                           "def test_width():\n    assert width() == 8\n\n"
                                           "def test_newer_signature():\n    assert width(3) == 8\n")
    work = _finished_run(tmp_path, {"j1": "vmfuzz-kill: exit 1 in 3s\n" + CHECKED + "vmfuzz-sglang-tests: "
                                           + sglang_tests.NOT_GIVEN})
    assert mutation_score.main(["sglang-tests", str(work), "--sglang-tests", str(checkout.parent)]) == 0
    row, = json.loads((work / "score.json").read_text())["mutants"]
    assert row["outcome"] == "killed" and row["properties"] == ["reader-agreement"]
    assert row["sglang_tests"].startswith("killed (1 test(s) in 1 file(s)")
    assert (work / "worker-0" / "python" / "sglang" / "srt" / "mask.py").read_text() == "def width():\n    return 8\n"
    assert "SGLang's tests kill 1" in (work / "score.md").read_text()


def _row(output: str, job: str = "j", file: str = "srt/a.py", operator: str = "core/NumberReplacer"):
    from types import SimpleNamespace
    m = SimpleNamespace(module_path=f"python/sglang/{file}", operator_name=operator, start_pos=(3, 0))
    return mutant_row(job, m, WorkResult(worker_outcome=WorkerOutcome.NORMAL, output=output, diff=CODE_DIFF))


CHECKED = 'vmfuzz-origin: {"effect": "wrong", "property": "reader-agreement"}\n'
CRASHED = 'vmfuzz-origin: {"effect": "crash", "property": "routing"}\n'


def test_the_headline_counts_property_kills_over_non_equivalent_mutants():
    done = [_row("vmfuzz-kill: exit 1 in 9s\nvmfuzz-cpu: 30.00 s gate; examples 600\n" + CHECKED),
            _row("vmfuzz-kill: exit 1 in 9s\nvmfuzz-cpu: 30.00 s gate; examples 600\n" + CRASHED),
            _row("vmfuzz-kill: exit 1 in 9s\nvmfuzz-cpu: 30.00 s gate; examples 600\n"),  # no origin: no credit
            _row("vmfuzz-kill: exit 0 in 9s\nvmfuzz-cpu: 30.00 s gate; examples 600\n"
                 "vmfuzz-equiv: differs: read_eager ->.qo_indptr (2 outputs; first x)"),
            _row("vmfuzz-kill: exit 0 in 9s\nvmfuzz-cpu: 30.00 s gate; examples 600\n"
                 "vmfuzz-equiv: identical (90 outputs compared)\nvmfuzz-sglang-tests: killed (1 test file(s): 1 failed)"),
            _row("vmfuzz-kill: exit 0 in 9s\nvmfuzz-equiv: identical (90 outputs compared); "
                 "the mutated line never ran on these cases")]
    md, data = render(done, {"sample": 6, "seed": 1, "of": 9})
    text = "\n".join(md)
    # exercised non-raising: the check's kill, the kill with no origin, the survivor and the two identical on
    # the gate's examples (no wider search: not shown equivalent, so in both denominators); the crash apart
    assert ("**Caught by a property's check: 20% (1/5) of all exercised non-raising mutants**, beside "
            "**20% (1/5) of those not shown equivalent**") in text
    assert data["total"]["by a check"] == 1 and data["total"]["by raising"] == 1
    assert data["total"]["suspected-equivalent"] == 2
    assert "3 kills, 150 CPU s" in text and "1.20 kills per CPU-minute" in text
    assert "20.0 property examples per CPU-second" in text
    assert [r["properties"] for r in done[:3]] == [["reader-agreement"], [], []]
    assert "killed (1 test file(s)" in text and "not run: no checkout given" in text
    assert "differs: read_eager ->.qo_indptr" in text
    # the survivor with differing outputs and both suspected-equivalents, each with its reason
    assert "**False green: 3**" in text and text.count("no wider search run") == 2


def test_the_mutated_lines_are_read_from_the_copy(tmp_path, monkeypatch):
    pkg, copy = tmp_path / "pkg", tmp_path / "copy" / "python" / "sglang"
    pkg.mkdir(), copy.mkdir(parents=True)
    (pkg / "a.py").write_text("a\nb\nc\nd\n")
    (copy / "a.py").write_text("a\nB\nc\nd\n")
    monkeypatch.chdir(tmp_path / "copy")
    assert mutation_kill.mutated_lines({"package": str(pkg)}, "a.py") == [2]


def test_the_gate_s_cpu_time_is_its_children_s(tmp_path):
    before = mutation_kill.children_cpu()
    import subprocess
    subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)
    assert mutation_kill.children_cpu() > before
    (tmp_path / "summary.json").write_text(json.dumps({"counts": {"examples": 412}}))
    assert mutation_kill.examples(tmp_path / "summary.json") == 412
    assert mutation_kill.examples(tmp_path / "missing.json") is None


def test_one_seed_samples_the_same_mutations_whatever_job_ids_init_gave_them():
    """cosmic-ray gives each mutation a random job id per ``init``: the sample follows the mutations."""
    import random
    import uuid
    from types import SimpleNamespace

    def items(rng):
        made = [SimpleNamespace(job_id=uuid.UUID(int=rng.getrandbits(128)).hex, mutations=[SimpleNamespace(
                    module_path=Path(f"python/sglang/f{i % 3}.py"), start_pos=(i, 4), end_pos=(i, 9),
                    operator_name="core/NumberReplacer", occurrence=i % 2)]) for i in range(200)]
        return made, {it.job_id: mutation_score.mutation_key(it) for it in made}

    (first, key1), (second, key2) = items(random.Random(1)), items(random.Random(2))
    a = {key1[j] for j in mutation_score.sample_jobs(first, 1, 20)}
    b = {key2[j] for j in mutation_score.sample_jobs(second, 1, 20)}
    assert len(a) == 20 and a == b


def _summary(path: Path, *origins: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"groups": [{"origin": o, "known": False} for o in origins]}))
    return path


def test_a_nightly_s_verdict_is_read_from_its_origins(tmp_path):
    import mutation_nightly as nightly
    checked = _summary(tmp_path / "a.json", {"property": "packed-mask", "effect": "wrong"},
                       {"property": "routing", "effect": "raise"})
    raised = _summary(tmp_path / "b.json", {"property": "routing", "effect": "raise"})
    assert nightly.verdict(1, checked) == {"verdict": "killed (a property's check)", "properties": ["packed-mask"],
                                           "exit": 1}
    assert nightly.verdict(1, raised)["verdict"] == "killed (the mutant raising)"
    assert nightly.verdict(1, tmp_path / "none.json")["verdict"].startswith("error")  # no output credits nothing
    assert nightly.verdict(0, raised)["verdict"] == "survived"
    assert nightly.verdict(3, raised)["verdict"] == "could not check (exit 3)"


def test_a_nightly_judges_the_gate_s_survivors_on_the_mutated_copy(tmp_path, monkeypatch):
    """``mutation_score.py nightly`` runs only the gate's survivors by default, each with its mutant written
    into worker-0 again and put back after; it resumes, and its section sits beside the gate's figures."""
    import mutation_nightly as nightly
    work = _finished_run(tmp_path, {"j1": "vmfuzz-kill: exit 0 in 3s\nvmfuzz-equiv: differs: read_eager ->.x (1 outputs)",
                                    "j2": "vmfuzz-kill: exit 1 in 3s\n" + CHECKED})
    assert mutation_score.main(["report", str(work)]) == 0
    seen = []

    def fake_run(copy, rel, properties, budget, seed, scratch, first_finding):
        seen.append(((copy / "python" / "sglang" / rel).read_text(), properties, budget, seed))
        return nightly.verdict(1, _summary(scratch / "report" / "summary.json",
                                           {"property": "p", "effect": "wrong"}))

    monkeypatch.setattr(nightly, "run_one", fake_run)
    assert mutation_score.main(["nightly", str(work), "--budget", "5", "--seed", "4"]) == 0
    assert seen == [("def width():\n    return 9\n", ["p"], 5.0, 4)]  # the survivor only, mutated
    assert (work / "worker-0" / "python" / "sglang" / "srt" / "mask.py").read_text() == "def width():\n    return 8\n"
    state = json.loads((work / "nightly.json").read_text())
    assert state["verdicts"]["j1"]["verdict"] == "killed (a property's check)" and "j2" not in state["verdicts"]
    md = (work / "score.md").read_text()
    assert "A 5-second nightly (seed 4)" in md and "Of the gate's 1 survivor(s) run, the nightly killed 1" in md
    assert "Of the 1 non-equivalent mutants run, the nightly killed 1 (100%)**: 1 by a property's check" in md
    assert mutation_score.main(["nightly", str(work), "--budget", "5", "--seed", "4"]) == 0
    assert len(seen) == 1  # resumed: nothing run twice
    with pytest.raises(SystemExit, match="must be a positive"):
        mutation_score.main(["nightly", str(work), "--budget", "0"])


def test_a_mutant_python_will_not_compile_is_stillborn_not_an_error(tmp_path):
    """cosmic-ray can turn a keyword-only ``*`` into ``<<``: the gate cannot import the copy (exit 2). Judged
    after the fact by Python's own compiler, it is stillborn (out of the score); a mutant that compiles and
    still made the gate exit 2 stays an error."""
    import stillborn
    pkg = tmp_path / "pkg" / "srt"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("def f(\n    x,\n    *,\n    y,\n):\n    return x\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "driven.json").write_text(json.dumps({"package": str(tmp_path / "pkg"), "files": {"srt/a.py": ["p"]}}))
    (work / "plan.json").write_text(json.dumps({"sample": 2, "of": 2, "seed": 1}))
    refused = "--- a/a.py\n+++ b/a.py\n@@ -3,1 +3,1 @@\n-    *,\n+    <<,\n"
    compiles = "--- a/a.py\n+++ b/a.py\n@@ -6,1 +6,1 @@\n-    return x\n+    return y\n"
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import MutationSpec, WorkItem
    with use_db(str(work / "session.sqlite"), WorkDB.Mode.create) as db:
        for job, diff in (("j1", refused), ("j2", compiles)):
            db.add_work_item(WorkItem(job_id=job, mutations=[MutationSpec(
                module_path="python/sglang/srt/a.py", operator_name="core/ReplaceBinaryOperator_Mul_LShift",
                occurrence=0, start_pos=(3, 4), end_pos=(3, 5))]))
            db.set_result(job, WorkResult(worker_outcome=WorkerOutcome.NORMAL, diff=diff,
                                          output="vmfuzz-kill: exit 2 in 3s; file srt/a.py"))
    assert stillborn.rescore(work) == 1
    with use_db(str(work / "session.sqlite"), WorkDB.Mode.open) as db:
        outcomes = {item.job_id: classify(result) for item, result in db.completed_work_items}
    assert outcomes == {"j1": "stillborn", "j2": "error"}
    md, _ = render([r for r in mutation_score_rows(work)], {"sample": 2, "seed": 1, "of": 2})
    assert "0 raised in a Triton kernel" in "\n".join(md) and "in 1, Python's own compiler refuses" in "\n".join(md)


def mutation_score_rows(work):
    from mutation_table import rows
    return list(rows(work))


class _FakeNightly:
    """``subprocess.Popen`` for a nightly: writes its summary (importing ``imported``) after ``finds_at``
    polls, a finding file at ``finds_at``; exits ``on_term`` on SIGTERM, else ``code`` after ``runs`` polls."""

    def __init__(self, imported, code=1, finds_at=None, runs=3, on_term=143):
        self.imported, self.code, self.finds_at, self.runs, self.started = imported, code, finds_at, runs, []
        self.on_term = on_term  # 143: its handler wrote the reports; -15: the signal itself ended it

    def __call__(self, cmd, **kwargs):
        fake = self
        report = Path(cmd[cmd.index("--report-dir") + 1])

        class Proc:
            polls, returncode, signals = 0, None, []

            def poll(self):
                self.polls += 1
                if fake.finds_at is not None and self.polls >= fake.finds_at:
                    (report / "findings").mkdir(parents=True, exist_ok=True)
                    (report / "findings" / "f.json").write_text(json.dumps(
                        {"property": "p", "origin": {"property": "p", "effect": "wrong"}}))
                if self.signals or self.polls >= fake.runs:
                    report.mkdir(parents=True, exist_ok=True)
                    (report / "summary.json").write_text(json.dumps({
                        "versions": {"sglang path": str(fake.imported)},
                        "groups": [{"origin": {"property": "p", "effect": "wrong"}, "known": False}]}))
                    self.returncode = (fake.on_term if self.signals else fake.code)
                return self.returncode

            def send_signal(self, sig):
                self.signals.append(sig)

        proc = Proc()
        self.started.append(proc)
        return proc


def test_a_nightly_that_imported_the_installed_package_judges_nothing(tmp_path, monkeypatch):
    """The verdict counts only if the run imported the mutated copy (summary.json's ``sglang path``)."""
    import mutation_nightly as nightly
    copy = tmp_path / "worker-0"
    (copy / "python" / "sglang").mkdir(parents=True)
    monkeypatch.setattr(nightly.time, "sleep", lambda s: None)
    monkeypatch.setattr(nightly.subprocess, "Popen", _FakeNightly(tmp_path / "site-packages" / "sglang"))
    said = nightly.run_one(copy, "srt/a.py", ["p"], 5.0, 1, tmp_path)
    assert said["verdict"].startswith("error (the run imported SGLang from") and said["properties"] == []
    monkeypatch.setattr(nightly.subprocess, "Popen", _FakeNightly(copy / "python" / "sglang"))
    assert nightly.run_one(copy, "srt/a.py", ["p"], 5.0, 1, tmp_path)["verdict"] == "killed (a property's check)"


def test_a_nightly_stopped_at_its_first_finding_is_judged_by_that_finding(tmp_path, monkeypatch):
    """``--first-finding`` sends SIGTERM once a finding is saved; the reports the run then writes (exit 143)
    judge it. Without the flag the same run goes on to its own end."""
    import signal
    import mutation_nightly as nightly
    copy = tmp_path / "worker-0"
    (copy / "python" / "sglang").mkdir(parents=True)
    monkeypatch.setattr(nightly.time, "sleep", lambda s: None)
    fake = _FakeNightly(copy / "python" / "sglang", finds_at=2, runs=50)
    monkeypatch.setattr(nightly.subprocess, "Popen", fake)
    said = nightly.run_one(copy, "srt/a.py", ["p"], 5.0, 1, tmp_path, first_finding=True)
    assert said["verdict"] == "killed (a property's check)" and said["exit"] == 143
    assert fake.started[0].signals == [signal.SIGTERM] and fake.started[0].polls < 50
    said = nightly.run_one(copy, "srt/a.py", ["p"], 5.0, 1, tmp_path)
    assert fake.started[1].signals == [] and fake.started[1].polls == 50 and said["exit"] == 1
    assert nightly.verdict(143, tmp_path / "none.json")["verdict"] == "error (exit 143, no origin)"
    # a run already past its signal handling when the SIGTERM came dies of it: the same stop
    monkeypatch.setattr(nightly.subprocess, "Popen", _FakeNightly(copy / "python" / "sglang", finds_at=2, runs=50,
                                                                 on_term=-signal.SIGTERM))
    said = nightly.run_one(copy, "srt/a.py", ["p"], 5.0, 1, tmp_path, first_finding=True)
    assert said["verdict"] == "killed (a property's check)" and said["exit"] == 143


def test_a_known_finding_s_replay_neither_stops_a_nightly_nor_kills(tmp_path, monkeypatch):
    """A run replays upstream's known findings first and saves what reproduces: that says nothing of the
    mutant, so it must not stop the run at its first finding, nor count as what killed it."""
    import signal
    import mutation_nightly as nightly
    from vmfuzz.harness.engine.regression.known import default_known_root, entries
    monkeypatch.setattr(nightly, "_known", lambda: tuple(k for _, k in entries(default_known_root())))
    findings = tmp_path / "report" / "findings"
    findings.mkdir(parents=True)
    # what a 0.5.23 run saves replaying known/dflash-policy-behind-dots-wrapper.json
    (findings / "known-dflash-policy-behind-dots-wrapper.json").write_text(json.dumps({"origin": {
        "property": "routing", "effect": "unsound", "writer": "dflash policy", "router": "dots-swa", "role": "wrapped",
        "spec_mode": "prefill", "resolved": "DotsSWAMLAAttnBackend"}}))
    summary = _summary(tmp_path / "report" / "summary.json")
    assert nightly.saved_origins(findings) == []
    assert nightly.verdict(143, summary)["verdict"] == "error (exit 143, no origin)"

    class Running:
        """A run that ends by itself after 5 polls, or at once after a signal."""

        def __init__(self):
            self.returncode, self.signals, self.polls = None, [], 0

        def poll(self):
            self.polls += 1
            if self.signals or self.polls >= 5:
                self.returncode = 0
            return self.returncode

        def send_signal(self, sig):
            self.signals.append(sig)

    monkeypatch.setattr(nightly.time, "sleep", lambda s: None)
    proc = Running()
    assert nightly._wait(proc, float("inf"), findings) == 0 and proc.signals == []
    (findings / "routing.json").write_text(json.dumps(
        {"origin": {"property": "routing", "effect": "wrong", "writer": "hybrid router"}}))
    assert nightly.saved_origins(findings) == [{"property": "routing", "effect": "wrong", "writer": "hybrid router"}]
    proc = Running()
    nightly._wait(proc, float("inf"), findings)
    assert proc.signals == [signal.SIGTERM]


def test_a_finding_saved_before_the_stopped_run_listed_it_still_judges(tmp_path):
    """SIGTERM can land while the parent has not yet collected a worker's finding: the summary lists no
    group, and the saved repro's own typed origin is what the run found (a crash here, never a check)."""
    import mutation_nightly as nightly
    summary = _summary(tmp_path / "report" / "summary.json")
    assert nightly.verdict(143, summary)["verdict"] == "error (exit 143, no origin)"
    (tmp_path / "report" / "findings").mkdir()
    (tmp_path / "report" / "findings" / "p-target-crash.json").write_text(json.dumps(
        {"property": "p", "origin": {"property": "p", "effect": "crash"}}))
    (tmp_path / "report" / "findings" / "note.json").write_text("not json")
    assert nightly.verdict(143, summary) == {"verdict": "killed (the mutant raising)", "properties": [], "exit": 143}
    (tmp_path / "report" / "findings" / "q.json").write_text(json.dumps(
        {"property": "q", "origin": {"property": "q", "effect": "wrong"}}))
    assert nightly.verdict(143, summary)["properties"] == ["q"]


def test_a_nightly_can_run_a_seeded_few_of_the_mutants_the_gate_never_reached(tmp_path):
    import mutation_nightly as nightly
    work = tmp_path / "work"
    work.mkdir()
    # the gate itself names a mutated line no property ran (exit 3, not-exercised)
    rows = [{"job": f"j{k}", "outcome": "not-exercised" if k % 2 else "suspected-equivalent",
             "equiv": None if k % 2 else "identical (9 outputs compared)"}
            for k in range(8)] + [{"job": "s", "outcome": "survived", "equiv": "differs: x"}]
    (work / "score.json").write_text(json.dumps({"mutants": rows}))
    unreached = [r["job"] for r in nightly.chosen(work, "never-ran")]
    assert unreached == ["j1", "j3", "j5", "j7"]
    few = [r["job"] for r in nightly.chosen(work, "never-ran", limit=2, seed=3)]
    assert len(few) == 2 and set(few) <= set(unreached) and few == [r["job"] for r in
                                                                  nightly.chosen(work, "never-ran", 2, 3)]
    assert [r["job"] for r in nightly.chosen(work, "survived", limit=5)] == ["s"]
    with pytest.raises(SystemExit, match="at least 1"):
        mutation_score.main(["nightly", str(work), "--limit", "0"])


def test_the_mutated_lines_are_read_from_the_gate_s_measurement(tmp_path, monkeypatch):
    """``vmfuzz-lines``: the gate's own record of the mutated statement (never run, off the path, or
    which properties ran it), matched to the statement holding the mutated line."""
    monkeypatch.chdir(tmp_path)
    pristine = tmp_path / "pristine"
    (pristine / "srt").mkdir(parents=True)
    (tmp_path / "python" / "sglang" / "srt").mkdir(parents=True)
    src = "def f(x):\n    y = (x +\n         1)\n    return y\n"
    (pristine / "srt" / "a.py").write_text(src)
    (tmp_path / "python" / "sglang" / "srt" / "a.py").write_text(src.replace("1)", "2)"))
    driven = {"package": str(pristine), "files": {"srt/a.py": ["routing"]}}
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"gate": {"lines": [{"path": "python/sglang/srt/a.py", "changed_lines": [2],
                                                       "never_ran": [2], "outside": [], "at_import": [],
                                                       "judged": {}}]}}))
    got = mutation_kill.mutated_line_verdict(summary, driven, ["srt/a.py"])
    assert got["measured"] and got["never_ran"] and not got["outside"]  # line 3 belongs to the statement at 2
    summary.write_text(json.dumps({"gate": {"lines": [{"path": "python/sglang/srt/a.py", "changed_lines": [2],
                                                       "never_ran": [], "judged": {"2": ["routing"]}}]}}))
    assert mutation_kill.mutated_line_verdict(summary, driven, ["srt/a.py"])["judged_by"] == ["routing"]
    assert mutation_kill.mutated_line_verdict(tmp_path / "none.json", driven, ["srt/a.py"]) == {}


def test_a_kill_by_code_that_does_not_import_is_read_from_the_command_s_checks(tmp_path):
    """The gate's import finding is a command summary: its failed check's origin is what killed the mutant
    (so a file Python refuses is told stillborn, not "unknown")."""
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"command": "gate", "checks": [
        {"status": "failed", "origin": {"property": "import", "effect": "raise", "stage": "import"}},
        {"status": "held", "origin": {"property": "x", "effect": "wrong"}}]}))
    assert mutation_kill.killing_origins(summary) == [{"property": "import", "effect": "raise", "stage": "import"}]
