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

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.origin import ALLOCATOR
from vmfuzz.harness.properties import PROPERTIES
from vmfuzz.harness.properties.kit import PropertyFailure
from tests.sglang_copies import altered_copy, assert_caught_by, run_on_copy

_VERIFY_MASK = ["srt/layers/attention/verify_mask.py"]
_CHOICE = r"mode = default_tree_mask_mode\(\) if is_read else TreeMaskMode\.QLEN_ONLY"
_EAGLE_UTILS = ["srt/speculative/eagle_utils.py"]
_DEFAULT = r"return TreeMaskMode\.QLEN_ONLY if _is_cpu else TreeMaskMode\.FULL_MASK"
ALTERATIONS = {
    "allocator-ignores-read-layout": [(_VERIFY_MASK, _CHOICE, "mode = TreeMaskMode.QLEN_ONLY")],
    # the device's default layout made QLEN_ONLY on every host: a GPU server's readers get the wrong
    # shape; the harness's host stand-in used to answer in the function's place, so it was never judged
    "default-layout-qlen-everywhere": [(_EAGLE_UTILS, _DEFAULT, "return TreeMaskMode.QLEN_ONLY")],
    # the same answer on each host, written another way
    "default-layout-negated": [(_EAGLE_UTILS, _DEFAULT,
                                "return TreeMaskMode.FULL_MASK if not _is_cpu else TreeMaskMode.QLEN_ONLY")],
    "allocator-read-layout-inlined": [(_VERIFY_MASK, _CHOICE,
                                       "mode = (default_tree_mask_mode if is_read else "
                                       "(lambda: TreeMaskMode.QLEN_ONLY))()")],
}


class _ChoosesNothing:
    """A target whose allocator hands out no mask, as SGLang's does for a draft runner."""

    name = "chooses-nothing"

    def allocate(self, config, heap):
        from vmfuzz.harness.model.allocation import AllocatorChose
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
    if alteration not in ("allocator-ignores-read-layout", "default-layout-qlen-everywhere"):
        assert proc.returncode == 0, out
        return
    assert proc.returncode == 1, out
    assert_caught_by(tmp_path / "report", "capacity-soundness", "no-oob-write", out=out)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert len(summary["groups"]) == 1, summary["groups"]
    assert all(f["origin"]["writer"] == ALLOCATOR and f["origin"]["cell"] == "another layout"
               for f in summary["findings"]), summary["findings"]


#: An allocator of our own over SGLang's struct and sizing: its read layout is taken from the host once,
#: when its module is imported (``{choice}`` is filled in per case).
_ALLOCATOR_MODULE = '''
import torch
from sglang.srt.layers.attention.verify_mask import VerifyMask, tree_mask_numel
from sglang.srt.speculative.eagle_utils import TreeMaskMode, default_tree_mask_mode

_LAYOUT_OF_THIS_HOST = default_tree_mask_mode()


def maybe_create_verify_mask(*, is_draft_runner, skip_prefill, max_bs, max_context_len, num_draft_tokens,
                             device, is_read):
    mode = {choice}
    cells = tree_mask_numel(mode, max_bs, num_draft_tokens, max_context_len)
    return VerifyMask(buffer=torch.zeros(cells, dtype=torch.bool, device=device), mode=mode, max_bs=max_bs,
                      is_read=is_read)
'''


@pytest.mark.parametrize("follows_the_host", [True, False])
def test_a_layout_read_at_import_is_read_again_on_the_imitated_host(sglang_target, tmp_path, follows_the_host):
    import importlib.util
    import sys
    from types import SimpleNamespace

    from vmfuzz.harness.model.allocation import AllocatorChose
    from vmfuzz.harness.targets.sglang import imitated_host
    sg = sglang_target.sglang
    here = sg.eagle_utils.default_tree_mask_mode()  # this machine's answer
    # the layout this machine's host does not answer: only the imitation can make the allocator pick it
    other = sg.Mode.FULL_MASK if here == sg.Mode.QLEN_ONLY else sg.Mode.QLEN_ONLY
    # computed at import from the host, or this machine's answer written in as a constant (ignores the host)
    chosen = "_LAYOUT_OF_THIS_HOST" if follows_the_host else f"TreeMaskMode.{here.name}"
    (tmp_path / "host_at_import.py").write_text(
        _ALLOCATOR_MODULE.replace("{choice}", f"{chosen} if is_read else TreeMaskMode.QLEN_ONLY"))
    spec = importlib.util.spec_from_file_location(f"host_at_import_{follows_the_host}", tmp_path / "host_at_import.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    fake = SimpleNamespace(**{**vars(sg), "maybe_create": module.maybe_create_verify_mask, "verify_mask": module})
    config = Config(TreeMaskMode(int(other)), 2, 8, 4, 2, 2)
    numel = lambda m, bs, d, mcl: int(sg.numel(m, bs, d, mcl))  # noqa: E731
    if follows_the_host:
        vm = imitated_host.allocate(fake, config, numel)
        assert (vm.mode, type(vm)) == (other, sg.VerifyMask)
    else:
        with pytest.raises(AllocatorChose):
            imitated_host.allocate(fake, config, numel)


def test_the_default_layout_is_sglangs_own_answer_on_the_imitated_host(sglang_target):
    from vmfuzz.harness.targets.sglang import host_default
    import sglang.srt.speculative.eagle_utils as eu
    fn = eu.default_tree_mask_mode
    kept = eu._is_cpu
    assert host_default.own_answer(fn, "gpu") == eu.TreeMaskMode.FULL_MASK
    assert host_default.own_answer(fn, "cpu") == eu.TreeMaskMode.QLEN_ONLY
    assert eu._is_cpu is kept  # the flag is put back


_PROBED = """
import os
FULL, QLEN = "full", "qlen"
_is_cpu = False

def by_flag():
    return QLEN if _is_cpu else FULL

def by_module():
    return QLEN if os.environ.get("CPU") else FULL
"""


def test_a_default_read_from_what_no_host_can_set_is_not_run_and_the_layout_answers():
    from vmfuzz.harness.targets.sglang import host_default
    space: dict = {"__name__": "vmfuzz_host_probe"}
    exec(compile(_PROBED, "<host probe>", "exec"), space)
    assert host_default.own_answer(space["by_flag"], "cpu") == "qlen"
    assert host_default.own_answer(space["by_flag"], "gpu") == "full" and space["_is_cpu"] is False
    assert host_default.reads(space["by_module"]) is None  # os is a module: this host's answer, not the imitated one
    assert host_default.own_answer(space["by_module"], "cpu") is None
    assert host_default.answering(space["by_module"], "cpu", "the config's")() == "the config's"
    assert host_default.answering(space["by_flag"], "cpu", "the config's")() == "qlen"
