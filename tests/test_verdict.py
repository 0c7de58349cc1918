"""One verdict, every writer: each outcome kind, and each report agreeing with its exit code.

A run's verdict is decided once (``vmfuzz.harness.report.decide``) before any report is
written; summary.json's ``verdict`` and counts, summary.md's first line, report.html's title,
junit.xml's verdict testcase and the terminal's closing line all read it. Here every kind
(``Kind``) is made from a real run's summary, decided, written by every writer, and each
writer's words are checked against the exit code. A kind added to ``Kind`` fails
``test_every_writer_names_every_kind`` (and ``SCENARIOS``) until each writer says what it is.
"""

from __future__ import annotations

import copy
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.helpers import vmfuzz
from vmfuzz.harness.model.summary_file import RunSummary, conform
from vmfuzz.harness.model.verdict import EXIT_CODE, HEADLINE, Kind, Verdict
from vmfuzz.harness.report.decide import decide, verdict_of, with_verdict
from vmfuzz.harness.report.html import HTML_TITLE, report_html
from vmfuzz.harness.report.junit import JUNIT_OUTCOME, run_junit
from vmfuzz.harness.report.summary import MD_HEADLINE, status_counts, summary_md
from vmfuzz.harness.report.verdict import CLOSING, closing_line

#: a changed line no property ran, and one only a GPU runs (``gate.needs_gpu``)
UNRUN_LINE = "python/sglang/p.py line 10 never ran (Mask.fits: no-oob-write)"
GPU_LINE = "python/sglang/p.py line 12 needs a GPU (a CUDA-only branch); check it with the GPU runner"


@pytest.fixture(scope="module")
def held(tmp_path_factory) -> dict:
    """A real run's summary.json on the reference target, every property held."""
    out = tmp_path_factory.mktemp("held") / "rep"
    r = vmfuzz("run", "--target", "reference", "--property", "capacity-soundness", "--property", "no-oob-write",
               "--seed", "1", "--max-examples", "5", "--isolate", "off", "--report-dir", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["verdict"]["kind"] == "held", s["verdict"]
    return s


def _recount(s: dict) -> dict:
    s["counts"].update(status_counts(s["properties"], s["replays"], s.get("gate")))
    return s


def _group(known: str | None) -> dict:
    return {"signature": "overrun of tree_mask", "count": 1, "properties": ["no-oob-write"], "repro": "f.json",
            "repro_property": "no-oob-write", "detail": "d", "server_valid": True, "members": ["f.json"],
            "key": "k", "known": known}


def _known(s):
    s["groups"] = [_group("upstream-entry")]
    s["counts"].update(groups=1, new_groups=0, known=1)


def _new(s):
    s["groups"] = [_group(None)]
    s["counts"].update(groups=1, new_groups=1, findings=1)
    s["properties"][0]["status"] = "failed"


def _in_part(s):
    s["properties"][0].update(status="held in part", sub_checks={"mask cells": "done",
                                                                 "kv_indices": "not driven (never reached)"})


def _gate(lines: list[str], device: list[str]):
    def make(s):
        s["gate"] = {"changed": ["python/sglang/p.py"], "triggered": ["python/sglang/p.py"], "exercised": [],
                     "not_driven": ["python/sglang/p.py"], "why_not_driven": {}, "lines": [],
                     "could_not_check": lines, "needs_gpu": device, "out_of_step": [], "warnings": []}
    return make


def _out_of_step(s):
    s["properties"][0].update(status="out of step", out_of_step="a seam in srt/x.py: renamed")


def _lane_lost(s):
    s["properties"][1].update(status="lane lost", out_of_step="search lane in vmfuzz: killed (SIGKILL); not checked")


def _interrupted(s):
    s["interrupted"] = True


#: how each kind comes about from a held run's summary (None: not from a search's summary at all --
#: the code under test never loaded, ``vmfuzz.harness.commands.common.load_failed``)
SCENARIOS = {
    Kind.HELD: lambda s: None,
    Kind.KNOWN: _known,
    Kind.NEW_FINDING: _new,
    Kind.HELD_IN_PART: _in_part,
    Kind.COULD_NOT_CHECK: _gate([UNRUN_LINE, GPU_LINE], [GPU_LINE]),  # one not a GPU's is enough
    Kind.NEEDS_GPU: _gate([GPU_LINE], [GPU_LINE]),
    Kind.OUT_OF_STEP: _out_of_step,
    Kind.CANNOT_LOAD: None,
    Kind.LANE_LOST: _lane_lost,
    Kind.INTERRUPTED: _interrupted,
}


def test_every_writer_names_every_kind():
    """Each writer maps a kind through a table that must be total: a new kind fails here first."""
    for name, table in (("HEADLINE", HEADLINE), ("EXIT_CODE", EXIT_CODE), ("summary.md", MD_HEADLINE),
                        ("report.html", HTML_TITLE), ("junit.xml", JUNIT_OUTCOME), ("closing line", CLOSING),
                        ("this test's scenarios", SCENARIOS)):
        assert set(table) == set(Kind), f"{name} does not name {set(Kind) - set(table)}"


def _expect(code: int) -> str:
    return {0: "pass", 1: "fail", 3: "could not check"}.get(code, "interrupted")


def _word(text: str) -> str:
    """What a writer's words say, in the four classes an exit code has."""
    low = text.lower()
    if "could not check" in low:
        return "could not check"
    if "interrupted" in low:
        return "interrupted"
    if "failed" in low:
        return "fail"
    assert "passed" in low or "held" in low, text
    return "pass"


def _summary_of(kind: Kind, held: dict) -> dict:
    s = copy.deepcopy(held)
    s.pop("verdict")
    if SCENARIOS[kind] is None:  # decided where the code failed to load; every writer still reads it
        return with_verdict(_recount(s), Verdict.of(kind, "nonexistent_pkg pinned ==1.0, not installed"))
    SCENARIOS[kind](s)
    s = _recount(s)
    v = decide(s, signal_code=143)
    assert v.kind is kind, (kind, v)
    return with_verdict(s, v)


@pytest.mark.parametrize("kind", list(Kind), ids=lambda k: k.value)
def test_every_writer_agrees_with_the_exit_code(kind, held, tmp_path):
    s = _summary_of(kind, held)
    conform(s, RunSummary)  # summary.json's shape holds the verdict
    v = verdict_of(s)
    code = EXIT_CODE[kind] if EXIT_CODE[kind] is not None else 143
    assert s["verdict"]["exit_code"] == v.exit_code == code, s["verdict"]
    expected = _expect(code)
    md_first = summary_md(s).splitlines()[0]
    title = re.search(r"<title>(.*)</title>", report_html(s, tmp_path)).group(1)
    closing = closing_line(v, s, s["target"])
    said = {"summary.json headline": _word(s["verdict"]["headline"]), "summary.md": _word(md_first),
            "report.html": _word(title), "closing line": _word(closing)}
    assert all(w == expected for w in said.values()), (kind, code, said, md_first, title, closing)
    [case] = [c for c in ET.fromstring(run_junit(s)).iter("testcase") if c.get("classname") == "vmfuzz.verdict"]
    outcome = next((c.tag for c in case), None)
    assert outcome == {"pass": None, "fail": "failure"}.get(expected, "error"), (kind, outcome)
    if code == 3:  # a pass is never what a could-not-check run's first line, title or closing line says
        assert "passed" not in md_first and "passed" not in title and " held" not in closing.split(":")[0]


def test_held_in_part_is_its_own_count_and_never_a_plain_junit_pass(held):
    s = _summary_of(Kind.HELD_IN_PART, held)
    assert s["counts"]["held_in_part"] == 1 and s["counts"]["held"] == len(s["properties"]) - 1, s["counts"]
    cases = {c.get("name"): c for c in ET.fromstring(run_junit(s)).iter("testcase")
             if c.get("classname") != "vmfuzz.verdict"}
    gap = cases[s["properties"][0]["name"]]
    assert gap.find("error") is not None and "kv_indices" in gap.find("error").get("message")


def test_could_not_check_counts_the_gates_lines(held):
    """Exit 3 on a gate's changed lines: summary.json's count says so (it said 0)."""
    s = _summary_of(Kind.COULD_NOT_CHECK, held)
    assert s["counts"]["could_not_check"] == 2, s["counts"]
    assert "**COULD NOT CHECK**" in summary_md(s).splitlines()[0]


def test_a_verdict_that_does_not_match_its_exit_code_cannot_be_made():
    with pytest.raises(ValueError):
        Verdict(Kind.HELD_IN_PART, 0)
    assert Verdict.of(Kind.INTERRUPTED, signal_code=143).exit_code == 143


def test_merge_decides_the_joined_verdict_by_the_same_rule(held):
    """A shard that held in part makes the merged run held in part (exit 3), whatever the other said."""
    from vmfuzz.harness.report.merge import merge_summaries
    a, b = copy.deepcopy(held), copy.deepcopy(held)
    a["properties"], b["properties"] = held["properties"][:1], held["properties"][1:]
    b["properties"][0].update(status="held in part", sub_checks={"packing": "not driven (never reached)"})
    for s in (a, b):
        _recount(s)
        s.update(verdict=decide(s).as_dict())
    merged = merge_summaries([a, b])
    assert merged["verdict"]["kind"] == "held in part" and merged["verdict"]["exit_code"] == 3, merged["verdict"]
    assert merged["counts"]["held_in_part"] == 1 and merged["counts"]["held"] == 1, merged["counts"]
    assert "**COULD NOT CHECK**" in summary_md(merged).splitlines()[0]


def test_a_summary_from_an_older_vmfuzz_is_decided_by_its_readers(held):
    """A summary without ``verdict`` (written before it existed) still gets every writer's words right."""
    s = _summary_of(Kind.OUT_OF_STEP, held)
    s.pop("verdict")
    assert "**COULD NOT CHECK**" in summary_md(s).splitlines()[0]
    assert verdict_of(s).exit_code == 3


def test_the_terminal_and_summary_of_a_real_run_agree(tmp_path):
    """End to end: a pr run its cap cuts short exits 3, and its closing line and summary.md say could not check."""
    out = tmp_path / "rep"
    r = vmfuzz("run", "--target", "reference", "--property", "capacity-soundness", "--isolate", "off",
               "--time-budget", "0.01", "--profile", "pr", "--report-dir", str(out))
    s = json.loads((out / "summary.json").read_text())
    assert r.returncode == s["verdict"]["exit_code"] == 3, (r.returncode, s["verdict"], r.stdout, r.stderr)
    last = r.stdout.strip().splitlines()[-1]
    first = (out / "summary.md").read_text().splitlines()[0]
    assert _word(last) == _word(first) == _expect(r.returncode), (last, first)


def test_reports_written_elsewhere_say_could_not_check(held, tmp_path):
    """Reports that could not go where CI looks are no pass: the fallback's reports say so too."""
    from vmfuzz.harness.report.verdict import write_reports_somewhere
    written = {}

    def write(summary, where: Path):
        if where == tmp_path / "asked":
            raise OSError(28, "No space left on device")
        written["summary"] = summary

    s, where = write_reports_somewhere(write, held, tmp_path / "asked")
    assert where is not None and where != tmp_path / "asked"
    assert s["verdict"]["exit_code"] == 3 and written["summary"]["verdict"]["kind"] == "could not check", s["verdict"]
