"""``allocation-soundness`` judges the mask's footprint itself, before anything is allocated.

SGLang's ``tree_mask_numel`` says how many cells a preallocated mask takes for
``bs`` requests; the layout arithmetic (``harness.model.layouts``) says how many
it must. A footprint that is too large (``<<`` for ``*``, one cell too many per
request) wastes memory or asks for more than torch can allocate; one too small
lets a batch ``fits`` admits write past the buffer. Either must be a finding of
allocation-soundness naming ``tree_mask_numel``, never the allocation raising.
"""

from __future__ import annotations

import json

import pytest

from harness.model.config import Batch, Config
from harness.model.layouts import TreeMaskMode
from harness.properties import PROPERTIES
from harness.properties.kit import PropertyFailure
from harness.targets import resolve
from tests.sglang_copies import altered_copy, assert_caught_by, run_on_copy

VM = ("srt/layers/attention/verify_mask.py",)
_FULL = r"per_req = num_draft_tokens \* \(max_context_len \+ num_draft_tokens\)"
_QLEN = r"per_req = num_draft_tokens \* num_draft_tokens\n"

#: name -> (edits, the effect the footprint check must report)
ALTERATIONS = {
    # the mutant the last mutation run killed only by torch refusing the allocation
    "full-footprint-shifted": ([(VM, _FULL, "per_req = num_draft_tokens << (max_context_len + num_draft_tokens)")],
                               "wrong"),
    "full-footprint-one-cell-more": ([(VM, _FULL, "per_req = num_draft_tokens * (max_context_len + num_draft_tokens)"
                                                  " + 1")], "wrong"),
    "full-footprint-one-cell-less": ([(VM, _FULL, "per_req = num_draft_tokens * (max_context_len + num_draft_tokens)"
                                                  " - 1")], "unsound"),
    "qlen-footprint-one-cell-more": ([(VM, _QLEN, "per_req = num_draft_tokens * num_draft_tokens + 1\n")], "wrong"),
}

#: the same footprint, computed another way: never a finding
REFACTOR = [(VM, _FULL, "per_req = num_draft_tokens * max_context_len + num_draft_tokens**2")]


def _run(tmp_path, edits, name):
    site = altered_copy(tmp_path, edits, name)
    return run_on_copy(site, tmp_path, "run", "--target", "sglang", "--seed", "1", "--max-examples", "5",
                       "--isolate", "off", "--property", "allocation-soundness",
                       "--report-dir", str(tmp_path / "report"))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ALTERATIONS))
def test_a_wrong_footprint_is_caught_by_allocation_soundness(sglang_target, name, tmp_path):
    edits, effect = ALTERATIONS[name]
    proc, out = _run(tmp_path, edits, name)
    assert proc.returncode == 1, out
    assert_caught_by(tmp_path / "report", "allocation-soundness", out=out)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    origins = [f.get("origin") or {} for f in summary["findings"]]
    assert origins and all(o.get("property") == "allocation-soundness" and o.get("effect") == effect
                           and o.get("writer") == "tree_mask_numel" and o.get("buffer") == "tree_mask"
                           for o in origins), origins


@pytest.mark.slow
def test_the_same_footprint_computed_another_way_holds(sglang_target, tmp_path):
    proc, out = _run(tmp_path, REFACTOR, "footprint-refactored")
    assert proc.returncode == 0, out


def _numel_shifted(mode, bs, d, max_context_len):
    per_req = d << (max_context_len + d) if mode == TreeMaskMode.FULL_MASK else d * d
    return bs * per_req


def test_a_footprint_too_large_to_allocate_is_judged_not_raised():
    """On the reference target, a footprint seam past anything torch allocates (even on meta)
    is reported as the footprint, with the right origin, before the allocation site runs."""
    target = resolve("reference")
    target.numel = _numel_shifted
    config = Config(TreeMaskMode.FULL_MASK, 2, 4096, 4, 2, 2)
    with pytest.raises(PropertyFailure) as failed:
        PROPERTIES["allocation-soundness"].check(target, config, [Batch((1,))])
    o = failed.value.origin
    assert (o.property, o.effect, o.writer, o.buffer) == ("allocation-soundness", "wrong", "tree_mask_numel",
                                                          "tree_mask"), o
    assert "2^" in str(failed.value)
