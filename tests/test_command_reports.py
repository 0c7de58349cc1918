"""Every command leaves summary.json, summary.md and a junit.xml that parses, with agreeing counts."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

import vmfuzz.harness.engine.search.exhaustive
from vmfuzz.harness.cli import main
from tests.helpers import ROOT

REPRO = str(ROOT / "repro" / "pr33127" / "pr33127.json")
DEPLOYMENT = str(ROOT / "examples" / "deployment-pr33127.json")


def _junit(path):
    root = ET.parse(path).getroot()
    cases = root.iter("testcase")
    out = {"failed": 0, "skipped": 0, "passed": 0, "names": []}
    for c in cases:
        out["names"].append(c.get("name"))
        if c.find("failure") is not None or c.find("error") is not None:
            out["failed"] += 1
        elif c.find("skipped") is not None:
            out["skipped"] += 1
        else:
            out["passed"] += 1
    return out


def _reports(d):
    for name in ("summary.json", "summary.md", "junit.xml"):
        assert (d / name).is_file(), f"{name} missing from {sorted(p.name for p in d.iterdir())}"
    return json.loads((d / "summary.json").read_text()), _junit(d / "junit.xml"), (d / "summary.md").read_text()


@pytest.fixture
def small_exhaustive(monkeypatch):
    """The enumeration cut to a handful of configurations: what is tested here is the report."""
    every = vmfuzz.harness.engine.search.exhaustive.configs()
    monkeypatch.setattr(vmfuzz.harness.engine.search.exhaustive, "configs", lambda: every[:: max(1, len(every) // 6)])


CASES = {
    # command line (without --report-dir), exit code, (failed, skipped) testcases
    "replay held": (["replay", REPRO, "--target", "reference"], 0, (0, 0)),
    "replay failed": (["replay", REPRO], 1, (1, 0)),
    # a deployment file: its observed batch, over the deployment's properties (capacity-liveness holds)
    "replay deployment failed": (["replay", DEPLOYMENT, "--target", "reference+pr33127"], 1, (5, 0)),
    "replay deployment held": (["replay", DEPLOYMENT, "--target", "reference"], 0, (0, 0)),
    "minimize": (["minimize", DEPLOYMENT, "--target", "reference+pr33127"], 1, (1, 0)),
    "minimize nothing": (["minimize", REPRO, "--target", "reference"], 0, (0, 0)),
    "selftest": (["selftest", "--variant", "fits-refuses-full", "--max-examples", "10"], 0, (0, 0)),
    "verify-policy held": (["verify-policy"], 0, (0, 0)),
    "verify-policy failed": (["verify-policy", "--target", "reference+fits-off-by-one"], 1, (1, 0)),
    "exhaustive": (["exhaustive", "--workers", "1", "--target", "reference+pr33127"], 1, None),
    "run": (["run", "--seed", "1", "--max-examples", "3", "--property", "capacity-liveness"], 0, (0, 0)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_command_leaves_three_reports(name, tmp_path, capsys, small_exhaustive):
    argv, code, want = CASES[name]
    rc = main([*argv, "--report-dir", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert rc == code, out
    s, j, md = _reports(tmp_path / "r")
    assert s["command"] == argv[0]
    assert f"vmfuzz {argv[0]}" in md
    checks = s.get("checks") or s["properties"]
    assert len(j["names"]) >= len(checks)
    failed = sum(c["status"] == "failed" for c in checks)
    assert j["failed"] == failed and (failed > 0) == (code == 1), (j, checks)
    if want is not None:
        assert (j["failed"], j["skipped"]) == want


def test_skipped_gate_is_a_skipped_testcase(tmp_path, capsys):
    changed = tmp_path / "changed.txt"
    changed.write_text("docs/README.md\n")
    assert main(["gate", "--target", "reference", "--changed-files", str(changed), "--report-dir", str(tmp_path / "r")]) == 0
    s, j, md = _reports(tmp_path / "r")
    assert s["verdict"] == "skipped" and s["command"] == "gate"
    assert j == {"failed": 0, "skipped": 1, "passed": 0, "names": ["gate"]}
    assert "skipped" in md


def test_minimize_writes_under_the_report_dir_not_beside_its_input(tmp_path, capsys):
    src = tmp_path / "in" / "case.json"
    src.parent.mkdir()
    src.write_text((ROOT / "repro" / "pr33127" / "pr33127.json").read_text())
    assert main(["minimize", str(src), "--report-dir", str(tmp_path / "r")]) == 1
    assert sorted(p.name for p in src.parent.iterdir()) == ["case.json"]
    assert (tmp_path / "r" / "case.min.json").is_file()


def test_hand_written_repro_needs_only_config_and_batches(tmp_path, capsys):
    hand = tmp_path / "crash.json"
    hand.write_text(json.dumps({"config": {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 8,
                                           "num_draft_tokens": 4, "topk": 2, "spec_steps": 2},
                                "batches": [{"seq_lens": [8, 8, 8]}]}))
    assert main(["replay", str(hand), "--report-dir", str(tmp_path / "a")]) == 0
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["target"] == "reference"
    # every property that applies to a drafting FULL_MASK config that is no chain, each one a testcase
    from vmfuzz.harness.properties import PROPERTIES
    assert [c["name"] for c in s["checks"]] == [n for n in PROPERTIES if n not in ("trivial-path", "chain-writer")]
    assert main(["replay", str(hand), "--target", "reference+pr33127", "--property", "capacity-soundness",
                 "--report-dir", str(tmp_path / "b")]) == 1
    assert "FAILED capacity-soundness on reference+pr33127" in capsys.readouterr().out
