"""``routing`` judges what the routers decide, not only the mask they hand out.

A TARGET_VERIFY forward that reaches no child, DFlash's custom-mask answer for
the child that verifies, and TBO's split of a TARGET_VERIFY cuda-graph replay
across its overlap children. Each is caught on ``reference`` (a layered model)
and on ``sglang`` through altered copies of the installed router files, loaded
in this process in place of the installed modules for one check (a copy run
through the CLI costs a subprocess; one such run proves the path end to end).
A behaviour-preserving refactor of the same code passes.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from importlib.util import find_spec, spec_from_file_location
from pathlib import Path

import pytest

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
from vmfuzz.harness.targets import resolve
from tests.sglang_copies import altered_copy, assert_caught_by, assert_not_a_raise, run_on_copy

CONFIG = Config(TreeMaskMode.FULL_MASK, 2, 8, 3, 2, 2)
BATCH = Batch((3, 8, 1))  # three requests: TBO splits them 1 + 2

_ATTN = "srt/layers/attention/"
_HYBRID, _TBO, _DFLASH = _ATTN + "hybrid_attn_backend.py", _ATTN + "tbo_backend.py", "srt/speculative/dflash_utils.py"
_DISPATCH = r"(        backend = self\._select_backend\(forward_batch\.forward_mode\)\n        return backend\.forward_extend\()"

#: name -> (edits as tests.sglang_copies.altered_copy takes them, what the finding's origin must say)
ALTERATIONS = {
    # a shortcut for verification that forgets to hand the forward on
    "hybrid-verify-reaches-no-child": (
        [([_HYBRID], _DISPATCH, "        if forward_batch.forward_mode.is_target_verify():\n"
                                "            return None\n" r"\1")],
        {"effect": "unsound", "writer": "router", "cell": "dispatch", "router": "hybrid"}),
    "dflash-custom-mask-flipped": (
        [([_DFLASH], r"\(backend_name not in _DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS\)",
          "(backend_name in _DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS)")],
        {"effect": "unsound", "writer": "dflash policy", "buffer": "custom_mask", "router": "hybrid"}),
    # the first child's view takes one request past the split
    "tbo-replay-off-by-one": (
        [([_TBO], r"slice\(None, tbo_split_seq_index\)", "slice(None, tbo_split_seq_index + 1)")],
        {"effect": "wrong", "writer": "router", "cell": "replay split", "router": "tbo", "role": "tbo-child-0",
         "buffer": "req_pool_indices"}),
    "tbo-replay-drops-a-request": (
        [([_TBO], r"slice\(tbo_split_seq_index, None\)", "slice(tbo_split_seq_index + 1, None)")],
        {"effect": "wrong", "writer": "router", "cell": "replay split", "router": "tbo", "role": "tbo-child-1"}),
    "tbo-replay-children-swapped": (
        [([_TBO], r"self\.children\[0\],\n(\s*)bs_left,", r"self.children[1],\n\1bs_left,"),
         ([_TBO], r"self\.children\[1\],\n(\s*)bs_right,", r"self.children[0],\n\1bs_right,")],
        {"effect": "wrong", "writer": "router", "cell": "replay split", "router": "tbo"}),
}

#: the same behaviour written another way, in each file the alterations touch
REFACTOR = [
    ([_HYBRID], _DISPATCH + r"\n            q, k, v, layer, forward_batch, save_kv_cache, \*\*kwargs\n        \)",
     "        return self._select_backend(forward_batch.forward_mode).forward_extend(\n"
     "            q, k, v, layer, forward_batch, save_kv_cache, **kwargs\n        )"),
    ([_DFLASH], r"\(backend_name not in _DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS\)",
     "(not {backend_name} <= _DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS)"),
    ([_TBO], r"bs_right = bs - bs_left", "bs_right = bs - tbo_split_seq_index"),
]


def _swap_in(monkeypatch, edits) -> None:
    """Load the edited SGLang files in place of the installed modules, for this test only."""
    package = Path(find_spec("sglang").origin).parent
    sources: dict[str, str] = {}
    for files, pattern, repl in edits:
        rel = files[0]
        text = sources.get(rel) or (package / rel).read_text()
        assert re.search(pattern, text), f"{pattern!r} no longer applies to {package / rel}"
        sources[rel] = re.sub(pattern, repl, text)
    for rel, text in sources.items():
        name = "sglang." + rel.removesuffix(".py").replace("/", ".")
        module = types.ModuleType(name)
        module.__file__, module.__package__ = str(package / rel), name.rpartition(".")[0]
        module.__spec__ = spec_from_file_location(name, package / rel)
        monkeypatch.setitem(sys.modules, name, module)
        exec(compile(text, str(package / rel), "exec"), module.__dict__)


def _caught(target, want: dict) -> None:
    with pytest.raises(PropertyFailure) as caught:
        PROPERTIES["routing"].check(target, CONFIG, [BATCH])
    origin = caught.value.origin
    assert_not_a_raise(str(caught.value), origin)
    assert origin.property == "routing", origin
    assert {k: getattr(origin, k) for k in want} == want, (origin, str(caught.value))


# -- sglang: altered copies of the router files --------------------------------------

@pytest.mark.parametrize("alteration", ALTERATIONS)
def test_altered_router_is_caught(sglang_target, monkeypatch, alteration):
    edits, want = ALTERATIONS[alteration]
    _swap_in(monkeypatch, edits)
    _caught(sglang_target, want)


def test_refactored_routers_pass(sglang_target, monkeypatch):
    _swap_in(monkeypatch, REFACTOR)
    obs = PROPERTIES["routing"].check(sglang_target, CONFIG, [BATCH])
    assert {"tbo: replay split 1+2", "hybrid: dflash custom mask built", "hybrid: dflash custom mask skipped"} \
        <= obs.classes


@pytest.mark.slow
def test_a_router_reaching_no_child_is_a_finding_through_the_cli(sglang_target, tmp_path):
    site = altered_copy(tmp_path, ALTERATIONS["hybrid-verify-reaches-no-child"][0], "hybrid-verify-reaches-no-child")
    proc, out = run_on_copy(site, tmp_path, "run", "--target", "sglang", "--seed", "1", "--max-examples", "3",
                            "--property", "routing", "--report-dir", str(tmp_path / "report"))
    assert proc.returncode == 1, out
    assert_caught_by(tmp_path / "report", "routing", out=out)


# -- reference: the embedded model, layered -------------------------------------------

def _layered(**change):
    """The reference target with ``change`` applied to what its routers answer or its TBO replays."""
    target = resolve("reference")
    route, replay = target.route, target.tbo_replay
    if "route" in change:
        target.route = lambda *a: change["route"](route(*a))
    if "replay" in change:
        target.tbo_replay = lambda *a: change["replay"](*replay(*a))
    return target


def test_reference_holds():
    obs = PROPERTIES["routing"].check(resolve("reference"), CONFIG, [BATCH])
    assert "tbo: replay split 1+2" in obs.classes


@pytest.mark.parametrize("served,says", [((), "asks no child"), (("prefill", "decode"), "asks 2 children")])
def test_reference_router_reaching_no_child_or_two_is_caught(served, says):
    target = _layered(route=lambda r: dataclasses.replace(r, verify_served=served) if r.router == "hybrid" else r)
    with pytest.raises(PropertyFailure, match=says) as caught:
        PROPERTIES["routing"].check(target, CONFIG, [BATCH])
    assert (caught.value.origin.effect, caught.value.origin.cell) == ("unsound", "dispatch")


def test_reference_dflash_boolean_flipped_is_caught():
    target = _layered(route=lambda r: dataclasses.replace(r, dflash_custom_mask=not r.dflash_custom_mask))
    _caught(target, {"writer": "dflash policy", "buffer": "custom_mask", "effect": "unsound"})


@pytest.mark.parametrize("change,role,buffer", [
    (lambda p, c: (p, [c[1], c[0]]), "tbo-child-0", "req_pool_indices"),      # children swapped
    (lambda p, c: (p, [c[0], None]), "tbo-child-1", "batch split"),           # second child never set up
    (lambda p, c: (p, [c[0], dataclasses.replace(c[1], custom_mask=c[1].custom_mask[1:])]),
     "tbo-child-1", "custom_mask"),                                          # a mask split one cell late
])
def test_reference_tbo_replay_split_wrong_is_caught(change, role, buffer):
    _caught(_layered(replay=change), {"router": "tbo", "role": role, "buffer": buffer, "cell": "replay split"})
