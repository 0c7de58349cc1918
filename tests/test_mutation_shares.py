"""Equivalent only beyond the gate's examples; the two quoted shares; each false green with its reason.

Fake kill-command outputs and fake wider searches: no gate, no SGLang run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import mutation_records  # noqa: E402
import mutation_shares  # noqa: E402
import mutation_wide  # noqa: E402

pytest.importorskip("cosmic_ray")
from cosmic_ray.work_item import WorkerOutcome, WorkResult  # noqa: E402

PASS = "vmfuzz-kill: exit 0 in 9s\n"
SAME = "vmfuzz-equiv: identical (900 outputs compared, every example the gate ran)\n"
WIDE_SAME = "vmfuzz-wide: identical (4100 outputs compared; seed 8191, 120 examples a property)\n"
WIDE_DIFF = "vmfuzz-wide: differs: read_replay ->.page_table (3 of 4100 outputs; seed 8191)\n"
WIDE_KILL = "vmfuzz-wide: killed (reader-agreement; seed 8191)\n"
WIDE_UNSURE = "vmfuzz-wide: not checked (the wider search exited 2)\n"
CHECK = 'vmfuzz-kill: exit 1 in 9s\nvmfuzz-origin: {"effect": "wrong", "property": "packed-mask"}\n'
RAISE = 'vmfuzz-kill: exit 1 in 9s\nvmfuzz-origin: {"effect": "raise", "property": "routing"}\n'


def _fate(output: str) -> str:
    return mutation_records.classify(WorkResult(worker_outcome=WorkerOutcome.NORMAL, output=output))


@pytest.mark.parametrize("output, fate", [
    (PASS + SAME, "suspected-equivalent"),  # identical on the gate's examples only
    (PASS + SAME + WIDE_SAME, "equivalent"),
    (PASS + SAME + WIDE_DIFF, "survived"),  # the wider search told them apart: a false green
    (PASS + SAME + WIDE_KILL, "survived"),
    (PASS + SAME + WIDE_UNSURE, "suspected-equivalent"),  # a search that could not check shows nothing
    # a later wider search replaces an earlier one
    (PASS + SAME + WIDE_UNSURE + WIDE_SAME, "equivalent"),
    # the gate's own outputs differ: no wider search can make it equivalent
    (PASS + "vmfuzz-equiv: differs: verify ->.tree_mask (2 of 9)\n" + WIDE_SAME, "survived"),
    (PASS + WIDE_SAME, "survived"),  # never compared on the gate's examples
])
def test_equivalent_needs_the_wider_search(output, fate):
    assert _fate(output) == fate


def _row(output: str, job: str, line: int = 3) -> dict:
    from mutation_table import mutant_row
    m = SimpleNamespace(module_path="python/sglang/srt/a.py", operator_name="core/NumberReplacer", start_pos=(line, 0))
    return mutant_row(job, m, WorkResult(worker_outcome=WorkerOutcome.NORMAL, output=output, diff=""))


def _sample() -> list[dict]:
    return [_row(CHECK, "caught1", 1), _row(CHECK, "caught2", 2), _row(CHECK, "caught3", 3),
            _row(RAISE, "raised", 4),  # counted apart: nothing handed on to judge
            _row("vmfuzz-kill: exit 1 in 9s\n", "no-origin", 5),  # exercised, caught by no check
            _row(PASS + SAME + WIDE_SAME, "equiv", 6),
            _row(PASS + SAME, "suspected", 7),
            _row(PASS + SAME + WIDE_DIFF, "wide-differs", 8),
            _row(PASS + "vmfuzz-equiv: differs: read_eager ->.qo_indptr (2 of 9)\n", "differs", 9),
            _row('vmfuzz-kill: exit 3 in 9s\nvmfuzz-lines: {"never_ran": true}\n', "unrun", 10),
            _row('vmfuzz-kill: exit 0 in 9s\nvmfuzz-lines: {"outside": true, "judged_by": []}\n', "off", 11)]


def test_the_shares_are_over_every_exercised_non_raising_mutant_and_over_the_non_equivalent():
    got = mutation_shares.shares(_sample())
    # 3 caught + 1 no-origin kill + 1 equivalent + 1 suspected + 2 survivors; raise, unrun, off-path left out
    assert (got.exercised, got.caught, got.equivalent, got.non_equivalent) == (8, 3, 1, 7)
    assert got.over_all() == "38% (3/8)" and got.over_non_equivalent() == "43% (3/7)"
    assert mutation_shares.Shares().over_all() == "- (0/0)"


def test_every_false_green_is_listed_with_its_reason():
    reasons = {r["job"]: why for r, why in mutation_shares.shares(_sample()).false_greens}
    assert set(reasons) == {"suspected", "wide-differs", "differs"}  # never the shown-equivalent one
    assert "no wider search run" in reasons["suspected"]
    assert "the wider search: differs: read_replay ->.page_table" in reasons["wide-differs"]
    assert "read_eager ->.qo_indptr" in reasons["differs"]


def test_the_headline_quotes_both_shares_and_lists_the_false_greens():
    from mutation_table import render
    md, data = render(_sample(), {"sample": 11, "seed": 5, "of": 99})
    text = "\n".join(md)
    assert ("**Caught by a property's check: 38% (3/8) of all exercised non-raising mutants**, beside "
            "**43% (3/7) of those not shown equivalent**") in text
    assert "**False green: 3**" in text
    assert "- `srt/a.py:7` NumberReplacer: identical on the gate's examples" in text
    assert "1 killed only by the mutant raising or crashing, 1 not exercised" in text
    assert data["total"]["equivalent"] == 1 and data["total"]["suspected-equivalent"] == 1


@pytest.mark.parametrize("code, origins, pristine, diffs, compared, said", [
    (0, [], [0, 0], [], 812, "identical (812 outputs compared; S)"),
    (0, [], [0, 0], ["routing c1 call2:select ->.mode"], 812, "differs: select ->.mode (1 of 812 outputs; S;"),
    (1, [{"property": "reader-agreement", "effect": "wrong"}], [0, 0], [], 812, "killed (reader-agreement; S)"),
    (1, [{"property": "routing", "effect": "raise"}], [0, 0], [], 0, "killed (the mutant raising; S)"),
    (0, [], [1, 0], [], 812, "not checked (the pristine wider search exited [1, 0]"),
    (2, [], [0, 0], [], 0, "not checked (the wider search exited 2)"),
    (0, [], [0, 0], [], 0, "not checked (no output both searches recorded"),
])
def test_the_wider_search_s_verdict(code, origins, pristine, diffs, compared, said):
    assert mutation_wide.verdict(code, origins, pristine, diffs, compared, "S").startswith(said)


def test_widen_searches_each_suspected_equivalent_once_on_the_mutated_copy(tmp_path, monkeypatch):
    """``mutation_score.py widen`` writes each suspected-equivalent mutant into worker-0 again, stores the
    wider search's line with its output, puts the file back, and does not search it twice."""
    from tests.test_mutation_score import _finished_run

    import mutation_score
    work = _finished_run(tmp_path, {"j1": PASS + SAME, "j2": CHECK, "j3": PASS + SAME})
    seen = []

    def fake_judge(work_, copy, rel, properties, seed, examples, bounds, budget):
        seen.append(((copy / "python" / "sglang" / rel).read_text(), properties, seed, examples))
        return "identical (40 outputs compared; fake)" if len(seen) == 1 else "differs: x (1 of 40 outputs; fake)"

    monkeypatch.setattr(mutation_wide, "judge", fake_judge)
    assert mutation_score.main(["widen", str(work), "--wide-seed", "17", "--wide-examples", "9"]) == 0
    assert seen == [("def width():\n    return 9\n", ["p"], 17, 9)] * 2  # the two suspected, mutated; not j2
    assert (work / "worker-0" / "python" / "sglang" / "srt" / "mask.py").read_text() == "def width():\n    return 8\n"
    rows = {r["job"]: r for r in json.loads((work / "score.json").read_text())["mutants"]}
    assert sorted(r["outcome"] for r in rows.values()) == ["equivalent", "killed", "survived"]
    assert mutation_score.main(["widen", str(work)]) == 0
    assert len(seen) == 2  # resumed: each has its line
    with pytest.raises(SystemExit, match="at least 1"):
        mutation_score.main(["widen", str(work), "--wide-examples", "0"])


def test_a_mutant_whose_diff_was_lost_gets_it_back_from_the_copy(tmp_path):
    """cosmic-ray's http distributor keeps no diff for a gate whose answer it stopped waiting for; a rerun
    writes the mutant again and takes its diff from the copy."""
    from cosmic_ray.work_db import WorkDB, use_db
    from mutation_copy import mutant_written, written_diff
    from tests.test_mutation_score import _finished_run
    work = _finished_run(tmp_path, {"j1": PASS + SAME})
    with use_db(str(work / "session.sqlite"), WorkDB.Mode.open) as db:
        item = next(iter(db.completed_work_items))[0]
    package = Path(json.loads((work / "driven.json").read_text())["package"])
    with mutant_written(work / "worker-0", item) as applied:
        assert applied
        diff = written_diff(work / "worker-0", item, package)
    assert "-    return 8\n+    return 9\n" in diff and diff.startswith("--- a/srt/mask.py")
