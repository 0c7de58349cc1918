"""The required check's rule (vmfuzz.harness.report.ci_check), run on every exit code of the gate.

Each case writes a summary.json as the gate would, the event payload GitHub hands
the job, and a stand-in ``gh`` on PATH that answers the PR's events and workflow
runs from files (or refuses, as a token without the scope does); it then runs the
module's command and reads its exit status and the job summary it appended to
``$GITHUB_STEP_SUMMARY``. The last test runs the example workflow's own gate step and
check step, as the runner would, on each exit code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vmfuzz.harness.report import ci_check
from vmfuzz.harness.report.ci_check import LABEL
from tests.helpers import ROOT
from tests.test_ci_workflow import workflow

GPU = "python/sglang/srt/speculative/eagle_utils.py line 212 needs a GPU (CUDA tensor branch); check them with gpu_check"
UNDRIVEN = "python/sglang/srt/layers/attention/verify_mask.py lines 40-41 never ran (under: if page_size > 1)"
PUSHED, LABELLED, LATER = "2026-01-05T10:00:00Z", "2026-01-05T11:00:00Z", "2026-01-05T12:00:00Z"

GH = """#!/bin/sh
echo "$*" >> "$FAKE_GH_DIR/calls"
case "$*" in
  *issues/*/events*) f=events.json ;;
  *actions/runs*) f=runs.json ;;
  *) f=none ;;
esac
if [ ! -f "$FAKE_GH_DIR/$f" ]; then echo "HTTP 403: Resource not accessible by integration" >&2; exit 1; fi
cat "$FAKE_GH_DIR/$f"
"""


def gate_summary(code: int, kind: str, lines=(), gpu=(), out_of_step=()) -> dict:
    return {"verdict": {"kind": kind, "exit_code": code, "headline": kind, "why": (list(lines) or [""])[0]},
            "gate": {"could_not_check": list(lines), "needs_gpu": list(gpu), "out_of_step": list(out_of_step)}}


def event(action: str = "synchronize", labels=(), added: str | None = None, sender: str = "contributor") -> dict:
    e = {"action": action, "sender": {"login": sender},
         "pull_request": {"number": 7, "head": {"sha": "a" * 40}, "labels": [{"name": n} for n in labels]}}
    if added:
        e["label"] = {"name": added}
    return e


class Job:
    """One run of the check step: its files, the stand-in gh, and what came out."""

    def __init__(self, tmp_path: Path, monkeypatch):
        self.dir = tmp_path
        self.report = tmp_path / "vmfuzz-report"
        self.report.mkdir()
        self.gh = tmp_path / "gh"
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "gh").write_text(GH)
        (tmp_path / "bin" / "gh").chmod(0o755)
        self.gh.mkdir()
        self.step_summary = tmp_path / "step-summary.md"
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
        monkeypatch.setenv("FAKE_GH_DIR", str(self.gh))
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(self.step_summary))
        monkeypatch.setenv("GITHUB_EVENT_PATH", str(tmp_path / "event.json"))
        monkeypatch.setenv("GITHUB_REPOSITORY", "sgl-project/sglang")

    def given(self, summary: dict | None = None, ev: dict | None = None, events=None, runs=None) -> "Job":
        if summary is not None:
            (self.report / "summary.json").write_text(json.dumps(summary))
        (self.dir / "event.json").write_text(json.dumps(ev or event()))
        if events is not None:  # two pages, as gh api --paginate prints them
            half = len(events) // 2
            (self.gh / "events.json").write_text(json.dumps(events[:half]) + "\n" + json.dumps(events[half:]))
        if runs is not None:
            (self.gh / "runs.json").write_text(json.dumps({"workflow_runs": [{"created_at": t} for t in runs]}))
        return self

    def run(self, rc: str) -> tuple[int, str]:
        code = ci_check.main(["--exit-code", rc, "--report-dir", str(self.report),
                              "--out", str(self.report / "ci-check.md")])
        text = self.step_summary.read_text() if self.step_summary.exists() else ""
        assert (self.report / "ci-check.md").read_text().strip() == text.strip()
        return code, text

    def calls(self) -> str:
        return (self.gh / "calls").read_text() if (self.gh / "calls").exists() else ""


@pytest.fixture
def job(tmp_path, monkeypatch):
    return Job(tmp_path, monkeypatch)


def labelled_at(when: str, actor: str | None = "maintainer", label: str = LABEL) -> dict:
    return {"event": "labeled", "created_at": when, "label": {"name": label},
            "actor": {"login": actor} if actor else None}


def test_exit_0_passes(job):
    code, text = job.given(gate_summary(0, "passed")).run("0")
    assert code == 0 and text.startswith("## vmfuzz gate: passed")


def test_a_skipped_gate_passes_with_its_words(job):
    code, text = job.given({"command": "gate", "verdict": "skipped", "headline": "no changed file names mask code",
                            "counts": {}}).run("0")
    assert code == 0 and "skipped" in text and "no changed file names mask code" in text


def test_exit_0_against_a_summary_that_says_3_fails(job):
    code, text = job.given(gate_summary(3, "could not check", [UNDRIVEN])).run("0")
    assert code != 0 and "disagree" in text


@pytest.mark.parametrize("rc, words", [("1", "a new finding"), ("2", "bad usage or a broken set-up")])
def test_findings_and_usage_fail_even_when_a_maintainer_labelled_the_pr(job, rc, words):
    code, text = job.given(gate_summary(1, "new finding") if rc == "1" else None,
                           event("labeled", [LABEL], added=LABEL, sender="maintainer")).run(rc)
    assert code == int(rc) and words in text
    assert "accepts exit 3 only" in text and "accepted by" not in text
    assert job.calls() == ""  # the label's history is never read for these codes


def test_exit_3_without_the_label_fails_naming_gpu_lines_apart_from_undriven_ones(job, capsys):
    code, text = job.given(gate_summary(3, "could not check", [GPU, UNDRIVEN], gpu=[GPU])).run("3")
    assert code == 3 and "the required check fails (exit 3)" in text.splitlines()[0]
    gpu, rest = text.index("**Needs a GPU** (1)"), text.index("**Not driven here** (1)")
    assert gpu < text.index(f"- {GPU}") < rest < text.index(f"- {UNDRIVEN}")
    assert f"adds the label `{LABEL}`" in text and "accepted by" not in text
    assert "::error title=vmfuzz gate::" in capsys.readouterr().out
    assert job.calls() == ""


def test_exit_3_accepted_by_the_label_that_started_this_run(job):
    code, text = job.given(gate_summary(3, "could not check (needs a GPU)", [GPU], gpu=[GPU]),
                           event("labeled", [LABEL], added=LABEL, sender="merrymaintainer")).run("3")
    assert code == 0 and "accepted by @merrymaintainer" in text.splitlines()[0]
    assert GPU in text and "**Needs a GPU** (1)" in text  # the accepted lines stay on record


def test_exit_3_with_the_label_already_on_is_accepted_by_whoever_added_it_after_the_push(job):
    events = [labelled_at(LATER, "someone", "needs-review"), {"event": "unlabeled", "created_at": PUSHED},
              labelled_at(LABELLED, "accepter")]
    code, text = job.given(gate_summary(3, "could not check", [UNDRIVEN]),
                           event("labeled", [LABEL, "needs-review"], added="needs-review", sender="someone"),
                           events=events, runs=[LATER, PUSHED]).run("3")
    assert code == 0 and "accepted by @accepter" in text and "@someone" not in text
    assert "issues/7/events" in job.calls() and f"head_sha={'a' * 40}" in job.calls()


def test_a_label_whose_actor_cannot_be_read_still_accepts_and_says_so(job):
    code, text = job.given(gate_summary(3, "could not check", [UNDRIVEN]), event("unlabeled", [LABEL]),
                           events=[labelled_at(LABELLED, actor=None)], runs=[PUSHED]).run("3")
    assert code == 0 and "who added the label could not be read" in text


@pytest.mark.parametrize("events, runs", [
    ([labelled_at(PUSHED)], [LABELLED]),  # added before the head commit's first run
    ([labelled_at(LABELLED), {"event": "head_ref_force_pushed", "created_at": LATER}], [PUSHED]),  # forced after
    ([], [PUSHED]),  # on the PR per the event, in no event the API lists
])
def test_a_label_older_than_the_code_does_not_accept(job, events, runs):
    code, text = job.given(gate_summary(3, "could not check", [UNDRIVEN]), event("labeled", [LABEL, "x"], added="x"),
                           events=events, runs=runs).run("3")
    assert code == 3 and "added before its latest push" in text and "accepted by" not in text


def test_a_push_after_the_label_fails_without_asking_the_api(job):
    code, text = job.given(gate_summary(3, "could not check", [UNDRIVEN]), event("synchronize", [LABEL])).run("3")
    assert code == 3 and "added before this synchronize event" in text and job.calls() == ""


@pytest.mark.parametrize("runs", [None, []])
def test_a_history_that_cannot_be_read_never_accepts(job, runs):
    code, text = job.given(gate_summary(3, "could not check", [UNDRIVEN]), event("unlabeled", [LABEL]),
                           events=[labelled_at(LABELLED)], runs=runs).run("3")
    assert code == 3 and "could not be read" in text and "not accepted" in text
    assert ("HTTP 403" in text) == (runs is None)


def test_exit_3_that_names_no_line_still_fails_and_says_why(job):
    summary = {"command": "gate", "verdict": "could not check", "verdict_kind": "cannot load",
               "headline": "cannot load the code under test: transformers ==5.12.1 pinned, 5.19 installed",
               "exit_code": 3, "counts": {}}
    code, text = job.given(summary).run("3")
    assert code == 3 and "transformers ==5.12.1" in text and "named no line" in text


def test_out_of_step_lines_are_their_own_section(job):
    code, text = job.given(gate_summary(3, "out of step", out_of_step=["verify_mask.py: seam renamed"])).run("3")
    assert code == 3 and "**vmfuzz out of step** (1)" in text and "seam renamed" in text


@pytest.mark.parametrize("rc, code", [("137", 137), ("130", 130), ("4", 4), ("", 1), ("-1", 1), ("abc", 1)])
def test_any_other_code_or_none_fails(job, rc, code):
    got, text = job.given(None, event("labeled", [LABEL], added=LABEL)).run(rc)
    assert got == code and ("none of vmfuzz's" in text or "did not run" in text)


def _gate_steps(tmp_path: Path, code: int, ev: dict) -> subprocess.CompletedProcess:
    """The gate step's and the required-check step's own shell, run as the runner runs them
    (bash -e, one after the other, the first's output handed to the second), with vmfuzz
    answering ``code`` after writing a summary.json with one unchecked line of each kind."""
    steps = workflow()["jobs"]["gate"]["steps"]
    [gate] = [st for st in steps if st.get("id") == "gate"]
    [check] = [st for st in steps if "vmfuzz.harness.report.ci_check" in st.get("run", "")]
    summary = {"verdict": {"kind": "x", "exit_code": code, "headline": "x", "why": ""},
               "gate": {"could_not_check": ["a.py line 1 needs a GPU (cuda)", "b.py line 2 never ran"],
                        "needs_gpu": ["a.py line 1 needs a GPU (cuda)"]}}
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "vmfuzz").write_text(  # the gate: its report, then its exit code
        f"#!/bin/sh\nmkdir -p vmfuzz-report\necho '{json.dumps(summary)}' > vmfuzz-report/summary.json\nexit {code}\n")
    (tmp_path / "bin" / "vmfuzz").chmod(0o755)
    venv = tmp_path / ".vmfuzz" / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # this checkout's vmfuzz
    (venv / "python").chmod(0o755)
    (tmp_path / "event.json").write_text(json.dumps(ev))
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "PYTHONPATH": str(ROOT), "GITHUB_WORKSPACE": str(tmp_path),
           "GITHUB_OUTPUT": str(tmp_path / "output"), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
           "GITHUB_EVENT_PATH": str(tmp_path / "event.json"), "GITHUB_REPOSITORY": "o/r"}
    first = subprocess.run(["bash", "-e", "-c", gate["run"].replace("${{ github.base_ref }}", "main")],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr  # it only keeps the code: the next step decides
    rc = (tmp_path / "output").read_text().strip().removeprefix("rc=")
    return subprocess.run(["bash", "-e", "-c", check["run"]], cwd=tmp_path, env={**env, "GATE_RC": rc},
                          capture_output=True, text=True, timeout=60)


ACCEPTING = event("labeled", [LABEL], added=LABEL, sender="maint")


@pytest.mark.parametrize("code, ev, passes", [
    (0, {}, True), (1, ACCEPTING, False), (2, ACCEPTING, False), (3, {}, False), (3, ACCEPTING, True),
    (137, ACCEPTING, False),
])
def test_the_workflows_steps_fail_exit_3_unless_a_maintainer_accepts_it_and_accept_nothing_else(tmp_path, code,
                                                                                                  ev, passes):
    r = _gate_steps(tmp_path, code, ev)
    assert (r.returncode == 0) == passes, (r.returncode, r.stdout, r.stderr)
    text = (tmp_path / "summary.md").read_text()
    assert (tmp_path / "vmfuzz-report" / "ci-check.md").read_text().strip() == text.strip()  # the PR comment's
    if code == 3:
        assert "**Needs a GPU** (1)" in text and "**Not driven here** (1)" in text
        assert ("accepted by @maint" in text) == passes
