"""The shipped JSON Schemas: current with the structs, and true of files the commands write."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema  # the dev extra (bash scripts/bootstrap.sh installs it)
import pytest

from tests.helpers import ROOT, vmfuzz

SCHEMAS = ROOT / "harness" / "schemas"


def validator(name: str):
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def valid(name: str, path) -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(name).iter_errors(
        json.loads(path.read_text()))]
    assert not errors, f"{path}: {errors[:3]}"


def test_the_schemas_are_generated_from_the_structs_and_current():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_schemas.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_a_runs_summary_its_findings_repros_and_a_minimized_deployment_validate(tmp_path):
    rep = tmp_path / "rep"
    r = vmfuzz("run", "--target", "reference+pr33127", "--seed", "1", "--max-examples", "5",
               "--property", "no-oob-write", "--property", "capacity-liveness", "--report-dir", str(rep))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "warning" not in r.stderr  # the summary matched its struct as it was written
    valid("summary", rep / "summary.json")
    findings = json.loads((rep / "summary.json").read_text())["findings"]
    assert findings
    for f in findings:
        valid("repro", rep / f["repro"])  # relative to the report folder
    # another command's summary (replay: a CommandSummary) and the deployment file minimize reads
    again = tmp_path / "again"
    assert vmfuzz("replay", str(rep / findings[0]["repro"]), "--report-dir", str(again)).returncode == 1
    valid("summary", again / "summary.json")
    valid("deployment", ROOT / "examples" / "deployment-pr33127.json")


def test_a_skipped_gates_summary_validates(tmp_path):
    changed = tmp_path / "changed.txt"
    changed.write_text("README.md\n")
    r = vmfuzz("gate", "--target", "reference", "--changed-files", str(changed), "--report-dir", str(tmp_path / "g"))
    assert r.returncode == 0, r.stdout + r.stderr
    valid("summary", tmp_path / "g" / "summary.json")


@pytest.mark.parametrize("name,planted", [
    ("repro", lambda d: d["config"].update(max_bs="eight")),
    ("repro", lambda d: d.update(extra=1)),
    ("summary", lambda d: d["counts"].pop("findings")),
])
@pytest.mark.slow
def test_the_schemas_refuse_a_planted_mistake(tmp_path, name, planted):
    rep = tmp_path / "rep"
    vmfuzz("run", "--target", "reference+pr33127", "--seed", "1", "--max-examples", "3",
           "--property", "no-oob-write", "--report-dir", str(rep))
    summary = json.loads((rep / "summary.json").read_text())
    doc = summary if name == "summary" else json.loads((rep / summary["findings"][0]["repro"]).read_text())
    planted(doc)
    assert list(validator(name).iter_errors(doc))


def test_a_summary_of_the_wrong_shape_is_said_when_it_is_written(tmp_path, capsys):
    from vmfuzz.harness.report.summary import CommandSummary, write_command_summary
    s = CommandSummary("replay", "reference", seconds=1.0)
    s.extra["started"] = 1700000000  # overrides the timestamp as_dict builds: a number, not a string
    write_command_summary(s, tmp_path)
    assert "does not match CommandSummary" in capsys.readouterr().err
    assert (tmp_path / "summary.json").is_file()  # written all the same
