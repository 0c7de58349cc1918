"""``allocation-soundness`` judges the mask's footprint itself, before anything is allocated.

SGLang's ``tree_mask_numel`` says how many cells a preallocated mask takes for
``bs`` requests; the layout arithmetic (``vmfuzz.harness.model.layouts``) says how many
it must. A footprint that is too large (``<<`` for ``*``, one cell too many per
request) wastes memory or asks for more than torch can allocate; one too small
lets a batch ``fits`` admits write past the buffer. Either must be a finding of
allocation-soundness naming ``tree_mask_numel``, never the allocation raising.
"""

from __future__ import annotations

import json

import pytest
import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES
from vmfuzz.harness.properties.kit import PropertyFailure
from vmfuzz.harness.targets import resolve
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


# -- the chain writer's own allocation (build_chain_tree with no buffer) -------------------

EAGLE = ("kernels/ops/speculative/eagle.py",)
_CHAIN_ALLOC = r"\(bs \* width \* width,\), dtype=torch\.bool"


class _OneCellMore:
    """The reference target whose chain writer allocates one cell more than its chains take."""

    def __init__(self, target):
        self._target = target

    def __getattr__(self, name):
        return getattr(self._target, name)

    def chain_write(self, inputs, buffer, heap, **kw):
        out = self._target.chain_write(inputs, buffer, heap, **kw)
        if buffer is None:
            out.tree_mask = torch.cat([out.tree_mask.reshape(-1), out.tree_mask.new_zeros(1)])
        return out


def test_the_chain_writers_own_allocation_is_judged_by_its_size():
    config = Config(TreeMaskMode.QLEN_ONLY, 2, 16, 4, 1, 3)
    target = _OneCellMore(resolve("reference"))
    with pytest.raises(PropertyFailure) as failed:
        PROPERTIES["chain-writer"].check(target, config, [Batch((3, 5))])
    o = failed.value.origin
    assert (o.property, o.effect, o.writer, o.buffer) == ("chain-writer", "wrong", "chain writer", "tree_mask"), o


@pytest.mark.slow
def test_a_chain_allocation_one_cell_too_large_is_caught_by_chain_writer(sglang_target, tmp_path):
    site = altered_copy(tmp_path, [(EAGLE, _CHAIN_ALLOC, "(bs * width * width + 1,), dtype=torch.bool")],
                        "chain-footprint-one-cell-more")
    proc, out = run_on_copy(site, tmp_path, "run", "--target", "sglang", "--seed", "1", "--max-examples", "3",
                            "--isolate", "off", "--property", "chain-writer", "--report-dir", str(tmp_path / "report"))
    assert proc.returncode == 1, out
    assert_caught_by(tmp_path / "report", "chain-writer", out=out)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert any((f.get("origin") or {}).get("effect") == "wrong" and "own allocation" in f["detail"]
               for f in summary["findings"]), summary["findings"]
