"""bench/release_diffs.py: how a gate report's changed lines are sorted, and its bad input."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import release_diffs  # noqa: E402

RUNNER = '''\
class DecodeCudaGraphRunner:
    def capture(self):
        a = 1
        if is_cuda:
            a = 2
        return a

    def replay(self, bs):
        if bs > 3:
            bs = 3
        return bs


def helper():
    return 0


def logger():
    return 1
'''


def _gate(path: str) -> dict:
    return {"changed": ["python/sglang/runner.py", "python/sglang/x.cu"], "triggered": ["python/sglang/runner.py"],
            "lines": [
                {"path": "python/sglang/runner.py", "traced": path,
                 "judged": {"3": ["graph-replay-equivalence"], "6": ["graph-replay-equivalence"],
                            "19": ["routing"]},
                 "needs_device": [5], "never_ran": [10, 15],
                 "why_never_ran": {"10": "DecodeCudaGraphRunner.replay: padding-inert",
                                   "15": "helper: not driven: no case builds it"},
                 "functions": {"DecodeCudaGraphRunner.capture": {"entered": True, "statements": 4, "ran": 2},
                               "DecodeCudaGraphRunner.replay": {"entered": True, "statements": 3, "ran": 1}}},
                {"path": "python/sglang/x.cu", "traced": None,
                 "why_untraced": "needs a GPU: CUDA kernel source"}]}


def test_each_changed_statement_lands_in_one_category_and_the_bar_is_measured(tmp_path):
    src = tmp_path / "runner.py"
    src.write_text(RUNNER)
    got = release_diffs.classify(_gate(str(src)))
    assert (got["changed"], got["judged"], got["needs_gpu"], got["not_driven"], got["other"]) == (5, 2, 1, 1, 1)
    assert got["unrun_share"] == 0.4 and not got["meets_bar"]
    assert got["judged_off_path"] == 1  # ran under a property, but in no function on the mask's path
    top = {t["function"]: (t["not_driven"], t["other"], t["needs_gpu"]) for t in got["top"]}
    assert top == {"runner.py:helper": (1, 0, 0), "runner.py:DecodeCudaGraphRunner.replay": (0, 1, 0),
                   "runner.py:DecodeCudaGraphRunner.capture": (0, 0, 1)}
    assert got["top_files"] == [["runner.py", 2]]
    assert got["untraced"] == ["python/sglang/x.cu: needs a GPU: CUDA kernel source"]
    assert got["graph_judged_by"] == ["graph-replay-equivalence"]
    assert got["graph_runner"] == {"DecodeCudaGraphRunner.capture": "2/4 ran", "DecodeCudaGraphRunner.replay": "1/3 ran"}


def test_only_gpu_lines_unrun_meets_the_bar(tmp_path):
    src = tmp_path / "runner.py"
    src.write_text(RUNNER)
    gate = _gate(str(src))
    gate["lines"][0]["never_ran"] = []
    got = release_diffs.classify(gate)
    assert got["meets_bar"] and got["unrun_share"] == 0.0


def test_a_never_ran_line_off_the_mask_functions_is_counted_apart_from_the_bar(tmp_path):
    src = tmp_path / "runner.py"
    src.write_text(RUNNER)
    gate = _gate(str(src))
    line = gate["lines"][0]
    del line["judged"]["19"]
    line["never_ran"].append(19)  # logger(): in a triggered file, in no function of the mask's path
    line["why_never_ran"]["19"] = "logger: routing"
    got = release_diffs.classify(gate)
    assert (got["changed"], got["other"], got["unrun_off_path"], got["judged_off_path"]) == (5, 1, 1, 0)
    assert "| 0 / 1 |" in release_diffs.table([{**got, "diff": "a→b", "env": "b", "exit": 3, "seconds": 1.0,
                                                 "changed_files": 2, "triggered": 1}], 3)


def test_a_never_ran_line_in_a_cpu_only_branch_is_not_driven_here():
    assert release_diffs.reason("not driven: CPU-engine branch") == "not_driven"
    assert release_diffs.reason("A.f: graph-replay-equivalence, padding-inert") == "other"


@pytest.mark.parametrize("argv, said", [
    (["0.5.23", "--dir", "{tmp}"], "is not BASE:HEAD"),
    (["0.5.22:0.5.23", "--dir", "{tmp}"], "no environment with sglang 0.5.23"),
    (["0.5.22:0.5.23", "--venv", "0.5.23", "--dir", "{tmp}"], "--venv takes V=DIR"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, said):
    assert release_diffs.main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
