"""A failure names every cause it showed, and a known entry excuses it only when it names them all.

Two sizing defects in one target: the buffer too short for the requests it was
sized for, and a capacity check that lets one request more reuse it. One
overrun shows both; its first escaped cell is only the first defect's.
"""

from __future__ import annotations

import json

import pytest

from vmfuzz.harness.model.known_file import decode
from vmfuzz.harness.model.origin import BEYOND_CAPACITY, WITHIN_CAPACITY, Origin, Part, key_text
from vmfuzz.harness.model.outputs import Violation
from vmfuzz.harness.properties.kit import PropertyFailure, fail_overrun

SIZED_FOR = {"property": "no-oob-write", "effect": "overrun", "buffer": "tree_mask", "cell": WITHIN_CAPACITY}
REPRO = {"property": "no-oob-write", "config": {"mode": "FULL_MASK", "max_bs": 1, "max_context_len": 2,
                                                "num_draft_tokens": 2, "topk": 1, "spec_steps": 1},
         "batches": [{"seq_lens": [2]}]}


def _entry(*origins):
    return decode(json.dumps({"sglang": ">=0.5.23,<=0.5.23", "reason": "the sizing leaves out the draft columns",
                              "origins": list(origins), "repro": REPRO}).encode(), "short-sizing.json")


def _overrun(violations, capacity_bs=1) -> Origin:
    with pytest.raises(PropertyFailure) as got:
        fail_overrun("no-oob-write", "d", violations, writer="verify step", capacity_bs=capacity_bs)
    return got.value.origin


def test_an_overrun_names_every_escaped_cell_class_first_cell_first():
    # one stray range from request 0 (sized for) into request 1 (past capacity), and the front too
    origin = _overrun([Violation("tree_mask", "back", 2, 8, 6, 2, request=0, last_request=1),
                       Violation("tree_mask", "front", -2, 0, 2, 2)])
    assert (origin.cell, origin.side) == (WITHIN_CAPACITY, "above")
    assert {(p.cell, p.side) for p in origin.parts()} == {(WITHIN_CAPACITY, "above"), (BEYOND_CAPACITY, "above"),
                                                          ("", "below")}
    assert "request past the buffer's capacity" in origin.label() and "request the buffer was sized for" in origin.label()


def test_a_single_cause_keeps_its_key_and_a_multiple_one_does_not_depend_on_order():
    one = _overrun([Violation("tree_mask", "back", 6, 8, 2, 4, request=0, last_request=0)])
    assert one.also == () and key_text(one.cause()) == "overrun|verify step|tree_mask|above|" + WITHIN_CAPACITY
    # a write past the redzone names no request: no cause of its own beside the located one
    assert _overrun([Violation("tree_mask", "beyond", 90, 99, 9, 4),
                     Violation("tree_mask", "back", 6, 8, 2, 4, request=0)]).also == ()
    a = Origin("no-oob-write", "overrun", "verify step", "tree_mask", "above", WITHIN_CAPACITY,
               also=(Part("overrun", "tree_mask", "above", BEYOND_CAPACITY),))
    b = Origin("no-oob-write", "overrun", "verify step", "tree_mask", "above", BEYOND_CAPACITY,
               also=(Part("overrun", "tree_mask", "above", WITHIN_CAPACITY),))
    assert a.cause() == b.cause() != one.cause()


def test_a_known_entry_excuses_only_a_failure_it_names_every_cause_of():
    entry = _entry(SIZED_FOR)
    both = _overrun([Violation("tree_mask", "back", 2, 8, 6, 2, request=0, last_request=1)])
    assert entry.matches(Origin("no-oob-write", "overrun", "verify step", "tree_mask", "above", WITHIN_CAPACITY))
    assert not entry.matches(both)
    assert [p.cell for p in entry.uncovered(both)] == [BEYOND_CAPACITY]
    assert _entry(SIZED_FOR, {**SIZED_FOR, "cell": BEYOND_CAPACITY}).matches(both)


def test_every_differing_output_is_named():
    import torch

    from vmfuzz.harness.model.config import Batch, Config
    from vmfuzz.harness.model.layouts import TreeMaskMode
    from vmfuzz.harness.model.outputs import StepOutput
    from vmfuzz.harness.properties.kit import first_difference

    config, batch = Config(TreeMaskMode.QLEN_ONLY, 2, 4, 2, 1, 1), Batch((1, 1))
    def out(mask, pos):
        z = torch.zeros(4, dtype=torch.long)
        return StepOutput(torch.tensor(mask, dtype=torch.bool), torch.tensor(pos), z, z, z, True)
    diff = first_difference("x", out([1, 0, 1, 1] * 2, [1, 2, 3, 4]), out([1, 0, 1, 0] * 2, [1, 2, 3, 5]),
                            config, batch, torch.ones(8, dtype=torch.bool))
    assert diff.buffer == "tree_mask" and [p.buffer for p in diff.also] == ["positions"]
    assert "positions differs at 3" in diff
    with pytest.raises(PropertyFailure) as got:
        from vmfuzz.harness.properties.kit import fail
        fail("no-oob-write", diff, writer="verify step")
    assert [p.buffer for p in got.value.origin.parts()] == ["tree_mask", "positions"]


@pytest.mark.slow
def test_two_sizing_defects_one_known_end_new_naming_the_other(sglang_target, tmp_path):
    """Every case the deployment allows that reuses the buffer escapes first in request 0 (the known
    short sizing); a batch past max_bs also escapes into request 1 (the admitted extra request). Before,
    every such case was passed over as the known entry's: held, exit 0."""
    from tests.helpers import vmfuzz as run_cli
    known = tmp_path / "known"
    known.mkdir()
    (known / "short-sizing.json").write_text(json.dumps(
        {"sglang": ">=0.5.23,<=0.5.23", "reason": "the sizing leaves out the draft columns", "origins": [SIZED_FOR],
         "repro": REPRO}))
    deployment = tmp_path / "deployment.json"
    deployment.write_text(json.dumps({"cuda_graph_max_bs": 1, "max_running_requests": 2, "context_length": 1,
                                      "num_draft_tokens": 2, "topk": 1, "spec_steps": 1, "layout": "FULL_MASK"}))
    got = run_cli("run", "--target", "sglang+full-no-draft-span+pr33127", "--property", "no-oob-write", "--seed", "1",
                  "--max-examples", "30", "--deployment", str(deployment), "--known", str(known),
                  "--report-dir", str(tmp_path / "report"))
    out = got.stdout + got.stderr
    assert got.returncode == 1, out
    assert "new cause, beside known entry short-sizing's: overrun tree_mask above by the verify step " \
           "(request past the buffer's capacity)" in out, out
    [group] = [g for g in json.loads((tmp_path / "report" / "summary.json").read_text())["groups"]
               if g["known"] is None]
    assert group["partly_known"] == "short-sizing" and group["origin"]["also"][0]["cell"] == BEYOND_CAPACITY
