"""SGLang's allocator chooses the mask's layout; a property judges the choice.

The harness models the server's host through the device-default layout
function (a read FULL_MASK config is a GPU server, a read QLEN_ONLY one a CPU
server) and takes whatever ``maybe_create_verify_mask`` then returns. It never
builds a mask of its own when SGLang returns none or another layout: that
substitute would let a broken allocator pass every check that reuses the buffer.

- ``allocator-ignores-read-layout``: every mask is allocated QLEN_ONLY (a
  plausible memory-saving edit), so a FULL_MASK reader reads the wrong shape.
  Caught as one group: the allocator's choice, seen by every property that asks
  for the mask.
- ``allocator-read-layout-inlined``: the same choice written another way; holds.
"""

from __future__ import annotations

import json

import pytest

from harness.model.config import Batch, Config
from harness.model.layouts import TreeMaskMode
from harness.model.origin import ALLOCATOR
from harness.properties import PROPERTIES
from harness.properties.kit import PropertyFailure
from tests.sglang_copies import altered_copy, assert_caught_by, run_on_copy

_VERIFY_MASK = ["srt/layers/attention/verify_mask.py"]
_CHOICE = r"mode = default_tree_mask_mode\(\) if is_read else TreeMaskMode\.QLEN_ONLY"
ALTERATIONS = {
    "allocator-ignores-read-layout": [(_VERIFY_MASK, _CHOICE, "mode = TreeMaskMode.QLEN_ONLY")],
    "allocator-read-layout-inlined": [(_VERIFY_MASK, _CHOICE,
                                       "mode = (default_tree_mask_mode if is_read else "
                                       "(lambda: TreeMaskMode.QLEN_ONLY))()")],
}


class _ChoosesNothing:
    """A target whose allocator hands out no mask, as SGLang's does for a draft runner."""

    name = "chooses-nothing"

    def allocate(self, config, heap):
        from harness.model.allocation import AllocatorChose
        raise AllocatorChose(None, config.mode.name, "maybe_create_verify_mask(...)")


def test_an_allocator_that_hands_out_no_mask_fails_the_asking_property():
    config = Config(TreeMaskMode.FULL_MASK, 2, 8, 4, 2, 2)
    with pytest.raises(PropertyFailure) as caught:
        PROPERTIES["capacity-liveness"].check(_ChoosesNothing(), config, [Batch((1,))])
    origin = caught.value.origin
    assert (origin.property, origin.effect, origin.writer, origin.cell) == \
        ("capacity-liveness", "unsound", ALLOCATOR, "no mask")
    # the same choice seen by another property is the same cause: one group
    with pytest.raises(PropertyFailure) as again:
        PROPERTIES["capacity-soundness"].check(_ChoosesNothing(), config, [Batch((1,))])
    assert again.value.origin.cause() == origin.cause()


@pytest.mark.slow
@pytest.mark.parametrize("alteration", [None, *ALTERATIONS])
def test_the_allocators_layout_choice_is_judged_not_replaced(sglang_target, tmp_path, alteration):
    site = altered_copy(tmp_path, ALTERATIONS[alteration] if alteration else [], alteration)
    proc, out = run_on_copy(site, tmp_path, "run", "--target", "sglang", "--seed", "1", "--max-examples", "4",
                            "--property", "capacity-soundness", "--property", "no-oob-write",
                            "--report-dir", str(tmp_path / "report"), timeout=400)
    if alteration != "allocator-ignores-read-layout":
        assert proc.returncode == 0, out
        return
    assert proc.returncode == 1, out
    assert_caught_by(tmp_path / "report", "capacity-soundness", "no-oob-write", out=out)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert len(summary["groups"]) == 1, summary["groups"]
    assert all(f["origin"]["writer"] == ALLOCATOR and f["origin"]["cell"] == "another layout"
               for f in summary["findings"]), summary["findings"]
