"""The right culprit: SGLang's own raise in a runner's set-up is the change's when the base runs the case.

A raise while vmfuzz builds and captures a cuda-graph runner is out of step
(``SetUpRaised``, exit 3): alone, vmfuzz cannot tell its wiring's gap from the
code's defect. A gate with a base asks the base's code, in a fresh process, to
run the same case through the same property (OSS-Fuzz CIFuzz's rule): the base
runs it, so the raise is the change's, a finding (exit 1, a raise, never a
property's catch); the base is out of step too, or cannot be asked: out of step
as before, the line saying which. ``run`` (no base) is unchanged.

The fast tests judge made-up stuck cases; the slow ones gate a stand-in checkout
(tests/sglang_repo.py) whose Triton backend reads a verify buffer it never made
while its graph is captured.
"""

from __future__ import annotations

import json
import pickle
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import sglang_repo
from tests.helpers import sglang_or_skip
from vmfuzz.harness.engine.core import failures
from vmfuzz.harness.engine.regression import out_of_step_on_base as on_base
from vmfuzz.harness.engine.search.results import PropertyResult, Stuck
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.errors import OutOfStep, SetUpRaised
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.origin import Origin
from vmfuzz.harness.properties import graph_shared

TRITON = "python/sglang/srt/layers/attention/triton_backend.py"
#: the target verify graph's metadata read from a buffer the backend never made: capture raises AttributeError
RAISES_IN_CAPTURE = (TRITON, r"qo_indptr=self\.qo_indptr\[: bs \+ 1\],\n(\s+)custom_mask=custom_mask,",
                     r"qo_indptr=self.qo_indptr_buf[: bs + 1],\n\1custom_mask=custom_mask,")
PROP = "capture-replay-agreement"
CONFIG = Config(TreeMaskMode.FULL_MASK, 2, 16, 4, 2, 2, True)
SEAM = "the target verify runner's set-up"


def _sglang_raise(tmp_path: Path, monkeypatch):
    """A function whose code lies in an ``sglang`` package (a stand-in one), raising as a mutant's would."""
    package = tmp_path / "sglang"
    (package / "srt").mkdir(parents=True)
    monkeypatch.setitem(sys.modules, "sglang", SimpleNamespace(__path__=[str(package)]))
    code = compile("def capture(batch):\n    return batch['mamba_track_indices']\n",
                   str(package / "srt" / "cuda_graph_buffer_registry.py"), "exec")
    scope: dict = {}
    exec(code, scope)
    return lambda: scope["capture"]({})


def test_sglangs_own_raise_in_a_set_up_is_kept_and_vmfuzzs_wiring_is_not(tmp_path, monkeypatch):
    boom = _sglang_raise(tmp_path, monkeypatch)
    with pytest.raises(SetUpRaised) as caught:
        graph_shared.built(("target verify", 1), boom)
    raised = failures.own_raise(caught.value)
    assert raised == ("KeyError", "srt/cuda_graph_buffer_registry.py:capture", "'mamba_track_indices'"), raised
    again = pickle.loads(pickle.dumps(SetUpRaised(*caught.value.__reduce__()[1][:3], raised)))  # a worker's pipe
    assert failures.own_raise(again) == raised

    def wiring():  # vmfuzz calling SGLang the wrong way raises in vmfuzz's (here: the test's) frame
        raise TypeError("create() got an unexpected keyword argument 'num_dp_ranks'")
    with pytest.raises(SetUpRaised) as caught:
        graph_shared.built(("target verify", 1), wiring)
    assert failures.own_raise(caught.value) is None
    assert failures.own_raise(OutOfStep("a seam", "f.py", "its signature cannot be read")) is None


KERNEL = """import triton
import triton.language as tl


@triton.jit
def gather(ptr):
    pid = tl.program_id(0)
    tl.store(ptr + pid, tl.load(ptr + pid / 2))  # a float offset: Triton refuses it
"""


def test_a_kernel_sglang_launches_raising_in_tritons_interpreter_is_sglangs(tmp_path, monkeypatch):
    """The interpreter's error names only Triton's frames (vmfuzz's launch speed-up among them): the
    kernel's own frames, behind it, make it SGLang's."""
    import importlib.util
    import torch
    from vmfuzz.harness.targets.sglang import interpreter_speed
    interpreter_speed.install()  # as every sglang run has it: a vmfuzz frame inside each launch
    package = tmp_path / "sglang"
    (package / "kernels").mkdir(parents=True)
    (package / "kernels" / "gather.py").write_text(KERNEL)
    monkeypatch.setitem(sys.modules, "sglang", SimpleNamespace(__path__=[str(package)]))
    spec = importlib.util.spec_from_file_location("sglang.kernels.gather", package / "kernels" / "gather.py")
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    x = torch.zeros(4)
    with pytest.raises(SetUpRaised) as caught:
        graph_shared.built(("target verify", 1), lambda: kernels.gather[(2,)](x))
    raised = failures.own_raise(caught.value)
    assert raised is not None and raised[0] == "InterpreterError", raised


def test_a_set_up_raise_through_a_stand_in_it_lacks_is_vmfuzzs(tmp_path, monkeypatch):
    from vmfuzz.harness.targets.sglang.stand_in import StandIn
    _sglang_raise(tmp_path, monkeypatch)
    with pytest.raises(OutOfStep) as caught, failures.consulted_check():
        runner = StandIn("model runner", "srt/model_executor/model_runner.py", req_to_token_pool=None)
        graph_shared.built(("target verify", 1), lambda: runner.mamba_pool)
    assert not isinstance(caught.value, SetUpRaised) and "does not provide" in str(caught.value), caught.value


def test_a_replayed_set_up_raise_is_that_raise_when_its_repro_names_it():
    err = SetUpRaised(SEAM, TRITON, "raised", ("AttributeError", "attention/triton_backend.py:f", "no qo_indptr_buf"))
    named = Origin(PROP, "raise", stage="capture", exc_type="AttributeError", frame="attention/triton_backend.py:f")
    raised = failures.vouched(err, named)
    assert isinstance(raised, failures.TargetRaised) and failures.raise_origin(PROP, raised).cause() == named.cause()
    assert failures.vouched(err, Origin(PROP, "raise", exc_type="KeyError", frame="x.py:g")) is None
    assert failures.vouched(err, None) is None
    assert failures.vouched(OutOfStep(SEAM, TRITON, "x"), named) is None


@pytest.mark.parametrize("names", [["no-oob-write"], ["no-oob-write", "fallback-equivalence"]],
                         ids=["alone", "a shared group"])
def test_a_search_keeps_the_case_it_fell_out_of_step_on(tmp_path, names):
    from vmfuzz.harness.engine.search.search import run_campaign
    from vmfuzz.harness.model.bounds import Bounds
    from vmfuzz.harness.targets import resolve
    raised = ("KeyError", "srt/registry.py:capture", "'mamba_track_indices'")

    def set_up_raises(prop, config, steps, device="cpu"):
        raise SetUpRaised(SEAM, TRITON, "it raised KeyError", raised)
    results = run_campaign(resolve("reference"), seed=1, max_examples=3, bounds=Bounds(), findings_dir=tmp_path,
                           properties=names, check=set_up_raises)
    for r in results:
        assert r.out_of_step and not r.findings and r.stuck is not None, r
        assert (r.stuck.members, r.stuck.raised, r.stuck.seam) == (tuple(names), raised, SEAM), r.stuck
        assert r.stuck.batches and r.stuck.config.num_draft_tokens >= 1


def _outcome(tmp_path: Path, raised=("KeyError", "srt/registry.py:capture", "'mamba_track_indices'"),
             members=(PROP,)):
    from vmfuzz.harness.engine.campaign.profiles import PROFILES
    from vmfuzz.harness.engine.campaign.session import RunOutcome, RunPlan
    plan = RunPlan("sglang", PROFILES["pr"], 7, 1, None, tmp_path / "report", properties=list(members),
                   command="gate")
    stuck = Stuck(tuple(members), CONFIG, [Batch([3, 5])], raised, SEAM)
    results = [PropertyResult(m, examples=1, out_of_step=f"{SEAM} in {TRITON}: it raised", stuck=stuck.of(members))
               for m in members]
    return RunOutcome(plan, "sglang", {}, "now", results=results)


def _asked_as(monkeypatch, *answers):
    monkeypatch.setattr(on_base, "_asked", lambda cases, *a: list(answers))


def _reports(outcome, tmp_path: Path) -> dict:
    from vmfuzz.harness.report.summary import build_summary, write_summary
    s = write_summary(build_summary(outcome), tmp_path / "report")
    return {"summary": s, "md": (tmp_path / "report" / "summary.md").read_text().splitlines()[0],
            "html": re.search(r"<title>(.*)</title>", (tmp_path / "report" / "report.html").read_text()).group(1),
            "junit": (tmp_path / "report" / "junit.xml").read_text()}


@pytest.mark.parametrize("base_said", ["held", "failed"])
def test_a_case_the_base_runs_makes_the_set_up_raise_the_changes_finding(tmp_path, monkeypatch, base_said):
    members = ("graph-replay-equivalence", PROP, "padding-inert")
    outcome = _outcome(tmp_path, members=members)
    _asked_as(monkeypatch, on_base.Answer(base_said))
    [rec] = on_base.ask_base(outcome, tmp_path, "f" * 40, "sglang", case_seconds=1, say=lambda line: None)
    assert rec["verdict"] == "the change's raise" and rec["properties"] == list(members), rec
    for r in outcome.results:  # every member the shared build stopped: one cause, one group
        assert r.out_of_step is None and r.finding is not None and r.finding.origin.effect == "raise"
        assert "the base ffffffffffff builds and runs the same case: new with this change" in r.finding.detail
        assert r.finding.path.is_file() and r.finding.path.parent == tmp_path / "report" / "findings"
    said = _reports(outcome, tmp_path)
    s = said["summary"]
    assert (s["verdict"]["kind"], s["verdict"]["exit_code"], len(s["groups"])) == ("new finding", 1, 1), s["verdict"]
    assert "FAILED" in said["md"] and "FAILED" in said["html"] and "<failure" in said["junit"], said


@pytest.mark.parametrize("answer, words", [
    (on_base.Answer("out of step", "the same", SEAM), f"the base ffffffffffff is out of step on the same case too: "
                                                      "vmfuzz's to fix"),
    (on_base.Answer("out of step", "the draft decode runner's set-up in x.py: y", "the draft decode runner's set-up"),
     "is out of step on the same case too (the draft decode runner's set-up in x.py: y): vmfuzz's to fix"),
    (on_base.Answer("fell", "target raised ValueError: z"), "fails the same case another way (target raised"),
    (on_base.Answer("unasked", "the base's SGLang does not load: ImportError: q"), "could not be asked (the base's"),
])
def test_a_case_the_base_does_not_run_stays_out_of_step_saying_why(tmp_path, monkeypatch, answer, words):
    outcome = _outcome(tmp_path)
    _asked_as(monkeypatch, answer)
    [rec] = on_base.ask_base(outcome, tmp_path, "f" * 40, "sglang", case_seconds=1, say=lambda line: None)
    [r] = outcome.results
    assert rec["verdict"] == "out of step" and not r.findings and words in r.out_of_step, (rec, r.out_of_step)
    said = _reports(outcome, tmp_path)
    v = said["summary"]["verdict"]
    assert (v["kind"], v["exit_code"]) == ("out of step", 3) and words in v["why"], v
    assert "COULD NOT CHECK" in said["md"] and "could not check" in said["html"], said


def test_no_raise_of_sglangs_own_stays_out_of_step_though_the_base_runs_it(tmp_path, monkeypatch):
    """A binding or a driver's count that no longer fits the change is vmfuzz's to follow, never the PR's finding."""
    outcome = _outcome(tmp_path, raised=None)
    _asked_as(monkeypatch, on_base.Answer("held"))
    on_base.ask_base(outcome, tmp_path, "f" * 40, "sglang", case_seconds=1, say=lambda line: None)
    [r] = outcome.results
    assert not r.findings and "runs the same case, and this is no raise of SGLang's own" in r.out_of_step


def test_a_gate_of_no_checkout_says_the_base_could_not_be_asked(tmp_path):
    outcome = _outcome(tmp_path)
    [rec] = on_base.ask_base(outcome, None, "f" * 40, "sglang", case_seconds=1, say=lambda line: None)
    assert rec["base_said"] == "unasked" and "not a checkout" in outcome.results[0].out_of_step
    assert on_base.ask_base(_outcome(tmp_path, members=()), None, "f", "sglang", case_seconds=1) == []


def test_a_base_that_cannot_be_had_is_not_asked(tmp_path):
    """Not a git checkout: the base's tree cannot be taken out of it, said in the line."""
    outcome = _outcome(tmp_path)
    on_base.ask_base(outcome, tmp_path, "0" * 40, "sglang", case_seconds=1, say=lambda line: None)
    assert "the base 000000000000 could not be asked (git archive of the base failed" in outcome.results[0].out_of_step


# --- the gate on a stand-in checkout: slow (each gate ~1 min on 2 cores) ---

@pytest.fixture(scope="module")
def repo(stand_in_checkout):
    return stand_in_checkout


def _said(report: Path) -> tuple[dict, str]:
    return json.loads((report / "summary.json").read_text()), (report / "summary.md").read_text().splitlines()[0]


@pytest.mark.slow
def test_the_gate_files_a_set_up_raise_the_base_does_not_have_as_the_changes_finding(repo, tmp_path):
    """Before: exit 3, "vmfuzz is out of step with this SGLang". Now: exit 1, the raise, the base's word."""
    from tests.test_gate_checkout import branch, gate
    from tests.sglang_copies import run_on_copy
    branch(repo, "pr-raise", "triton: the verify graph's qo_indptr from its own buffer", RAISES_IN_CAPTURE)
    proc, out = gate(repo, tmp_path / "report", "--property", PROP)
    assert proc.returncode == 1, out
    s, md = _said(tmp_path / "report")
    [f] = s["findings"]
    assert (f["property"], f["origin"]["effect"], f["origin"]["exc_type"]) == (PROP, "raise", "AttributeError"), f
    assert f["origin"]["frame"].endswith("triton_backend.py:_build_cuda_graph_forward_metadata"), f
    assert "qo_indptr_buf" in f["detail"] and "builds and runs the same case: new with this change" in f["detail"]
    repro = tmp_path / "report" / f["repro"]  # summary.json names the folder's own repros by their place in it
    assert repro.is_file() and repro.parent.name == "findings", f
    assert s["verdict"]["kind"] == "new finding" and "FAILED" in md and "out of step" not in md, (s["verdict"], md)
    assert s["gate"]["out_of_step_on_base"][0]["verdict"] == "the change's raise", s["gate"]
    # the repro replays as the raise it names on the change's code, not as vmfuzz out of step
    replayed, said = run_on_copy(repo / "python", tmp_path, "replay", str(repro), "--target", "sglang",
                                 "--report-dir", str(tmp_path / "replayed"))
    assert replayed.returncode == 1 and "qo_indptr_buf" in said, said


@pytest.mark.slow
def test_the_gate_leaves_a_set_up_raise_the_base_has_too_out_of_step(repo, tmp_path):
    from tests.test_gate_checkout import gate
    sglang_repo.git(repo, "checkout", "-q", "-B", "raising-base", "main")
    base = sglang_repo.commit(repo, "triton: the verify graph's qo_indptr from its own buffer", RAISES_IN_CAPTURE)
    sglang_repo.commit(repo, "triton: a note on the verify graph", touch=TRITON)
    proc, out = gate(repo, tmp_path / "report", "--property", PROP, change=("--base", base))
    assert proc.returncode == 3, out
    s, md = _said(tmp_path / "report")
    assert s["findings"] == [] and s["verdict"]["kind"] == "out of step", s["verdict"]
    assert f"the base {base[:12]} is out of step on the same case too: vmfuzz's to fix" in s["verdict"]["why"], s
    assert "COULD NOT CHECK** (vmfuzz out of step)" in md, md


@pytest.mark.slow
def test_run_without_a_base_is_out_of_step_as_ever(tmp_path):
    from tests.sglang_copies import altered_copy, run_on_copy
    sglang_or_skip()
    site = altered_copy(tmp_path, [(["srt/layers/attention/triton_backend.py"], *RAISES_IN_CAPTURE[1:])], "raise")
    proc, out = run_on_copy(site, tmp_path, "run", "--target", "sglang", "--property", PROP, "--profile", "pr",
                            "--report-dir", str(tmp_path / "report"))
    assert proc.returncode == 3 and "asking the base" not in out, out
    s, md = _said(tmp_path / "report")
    assert s["verdict"]["kind"] == "out of step" and "qo_indptr_buf" in s["verdict"]["why"], s["verdict"]
