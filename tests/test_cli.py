import json
from pathlib import Path

import pytest

from vmfuzz.harness.cli import main
from vmfuzz.harness.model.repro_file import load

ROOT = Path(__file__).resolve().parents[1]
PR33127 = ROOT / "repro" / "pr33127" / "pr33127.json"

GOOD = {
    "target": "reference", "property": "no-oob-write",
    "config": {"mode": "FULL_MASK", "max_bs": 1, "max_context_len": 4, "num_draft_tokens": 2,
               "topk": 1, "spec_steps": 1, "is_read": True},
    "batches": [{"seq_lens": [4, 4]}],
}


def _write(tmp_path, data) -> str:
    p = tmp_path / "case.json"
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(p)


def _bad(change):
    data = json.loads(json.dumps(GOOD))
    change(data)
    return data


@pytest.mark.parametrize("data, words", [
    ("{not json", "not valid JSON"),
    (_bad(lambda d: d["config"].update(max_bs="eight")), "max_bs"),
    (_bad(lambda d: d["config"].update(mode="HALF_MASK")), "unknown layout 'HALF_MASK'"),
    (_bad(lambda d: d.pop("batches")), "batches"),
    (_bad(lambda d: d.update(property="no-such-check")), "unknown property"),
    (_bad(lambda d: d["batches"][0].update(seq_lens=[9])), "seq_lens[0] = 9"),
    (_bad(lambda d: d["config"].update(num_draft_tokens=9)), "candidates"),
])
def test_bad_repro_files_exit_2_with_one_line(tmp_path, capsys, data, words):
    code = main(["replay", _write(tmp_path, data)])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and words in err, err


@pytest.mark.parametrize("argv, words", [
    (["run", "--target", "nosuch"], "unknown target 'nosuch'"),
    (["run", "--target", "reference+nosuch"], "unknown variant 'nosuch'"),
    (["run", "--target", "no_such_module_xyz:thing"], "cannot import plug-in module"),
    (["run", "--max-examples", "many"], "invalid int value"),
    (["run", "--property", "nope"], "unknown property"),
    (["replay", "/nonexistent/file.json"], "cannot read"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_command_lines_exit_2_with_one_line(capsys, argv, words):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and words in err, err


def test_hand_written_repro_without_trees_replays(tmp_path, capsys):
    assert main(["replay", _write(tmp_path, GOOD), "--target", "reference+pr33127"]) == 1
    assert "no-oob-write" in capsys.readouterr().out
    assert main(["replay", _write(tmp_path, GOOD)]) == 0


def test_canonical_pr33127_repro_fails_regressed_and_holds_fixed(capsys):
    assert main(["replay", str(PR33127), "--target", "reference+pr33127"]) == 1
    assert "no-oob-write" in capsys.readouterr().out
    assert main(["replay", str(PR33127), "--target", "reference"]) == 0


def test_seeded_run_on_the_regression_writes_the_minimal_repro(tmp_path, capsys):
    code = main(["run", "--target", "reference+pr33127", "--seed", "1", "--report-dir", str(tmp_path),
                 "--property", "no-oob-write"])
    assert code == 1
    [path] = (tmp_path / "findings").glob("no-oob-write*.json")
    repro = load(path)
    assert repro.config.mode == "FULL_MASK" and repro.config.max_bs == 1
    assert any(len(b.seq_lens) == 2 for b in repro.batches)
    assert main(["replay", str(path)]) == 1
    assert "no-oob-write" in capsys.readouterr().out


def test_targets_lists_every_variant_with_its_description(capsys):
    from vmfuzz.harness.targets import CATALOGUE
    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    for v in CATALOGUE.values():
        assert f"+{v.name}" in out and v.description in out
