"""``routing`` judges where a router sends its cuda-graph set-up and a replay's verify-buffer fix-up.

Both must reach every child that runs TARGET_VERIFY (the one whose mask is
handed out, and a hybrid-linear router's linear child) with the router's own
arguments, and the fix-up no other child. Caught on ``sglang`` through altered
copies of the installed router files (loaded in this process, as in
tests/test_routers_judged.py) and on ``reference`` with what its routers answer
changed; a behaviour-preserving refactor of the same code holds.
"""

from __future__ import annotations

import dataclasses

import pytest

from vmfuzz.harness.model.routing import FIXUP_SPEC
from vmfuzz.harness.properties import PROPERTIES
from vmfuzz.harness.targets import resolve
from tests.test_routers_judged import BATCH, CONFIG, _caught, _swap_in

_ATTN = "srt/layers/attention/"
_HYBRID, _LINEAR = _ATTN + "hybrid_attn_backend.py", _ATTN + "hybrid_linear_attn_backend.py"
_HYBRID_FIXUP = (r"        self\._select_backend\(\n            ForwardMode\.TARGET_VERIFY\n"
                 r"        \)\.update_verify_buffers_to_fill_after_draft\(spec_info, cuda_graph_bs\)")
_PREFILL_STATE = r"            self\.prefill_backend\.init_cuda_graph_state\(max_bs, max_num_tokens\)"
_LINEAR_FIXUP = r"spec_info=spec_info, cuda_graph_bs=cuda_graph_bs"

_REPLAY = {"effect": "wrong", "writer": "router", "cell": "replay fix-up", "stage": "replay"}
_SET_UP = {"effect": "wrong", "writer": "router", "cell": "graph set-up", "buffer": "cuda-graph state"}

#: name -> (edits as tests.test_routers_judged._swap_in takes them, what the finding's origin must say)
ALTERATIONS = {
    # the fix-up sent to the decode child whatever the mode: in prefill mode the mask's reader misses it
    "hybrid-fixup-to-decode": (
        [([_HYBRID], _HYBRID_FIXUP,
          "        self.decode_backend.update_verify_buffers_to_fill_after_draft(spec_info, cuda_graph_bs)")],
        {**_REPLAY, "router": "hybrid", "role": "prefill", "spec_mode": "prefill", "buffer": "verify buffers"}),
    "hybrid-prefill-graph-state-dropped": (
        [([_HYBRID], _PREFILL_STATE, "            pass")],
        {**_SET_UP, "router": "hybrid", "role": "prefill", "spec_mode": "prefill"}),
    # the graph set-up's condition asks for the wrong mode
    "hybrid-graph-state-mode-flipped": (
        [([_HYBRID], r"speculative_algorithm is not None and self\.spec_attn_is_prefill",
          "speculative_algorithm is not None and self.spec_attn_is_decode")],
        {**_SET_UP, "router": "hybrid", "role": "prefill", "spec_mode": "prefill"}),
    # the prefill child's graph state set up whatever the mode: in decode mode it runs in no graph,
    # and its graph buffers (its verify mask among them) are allocated for nothing
    "hybrid-prefill-graph-state-every-mode": (
        [([_HYBRID], r"get_spec\(\)\.speculative_algorithm is not None and self\.spec_attn_is_prefill",
          "get_spec().speculative_algorithm is not None")],
        {**_SET_UP, "router": "hybrid", "role": "prefill", "spec_mode": "decode"}),
    "hybrid-linear-fixup-drops-cuda-graph-bs": (
        [([_LINEAR], _LINEAR_FIXUP, "spec_info=spec_info, cuda_graph_bs=None")],
        {**_REPLAY, "router": "hybrid-linear", "role": "full", "buffer": "cuda_graph_bs"}),
    "hybrid-linear-fixup-full-child-only": (
        [([_LINEAR], r"for attn_backend in self\.attn_backend_list:\n(\s*)attn_backend\.update_verify",
          r"for attn_backend in self.attn_backend_list[:1]:\n\1attn_backend.update_verify")],
        {**_REPLAY, "router": "hybrid-linear", "role": "linear", "buffer": "verify buffers"}),
}

#: the same behaviour written another way: the child chosen through a local and a helper
REFACTOR = [
    ([_HYBRID], _HYBRID_FIXUP,
     "        verify_backend = self._select_backend(ForwardMode.TARGET_VERIFY)\n"
     "        verify_backend.update_verify_buffers_to_fill_after_draft(spec_info, cuda_graph_bs)"),
    ([_HYBRID], r"get_spec\(\)\.speculative_algorithm is not None and self\.spec_attn_is_prefill",
     "get_spec().speculative_algorithm is not None\n            and self._select_backend("
     "ForwardMode.TARGET_VERIFY) is self.prefill_backend"),
    ([_LINEAR], _LINEAR_FIXUP, "spec_info, cuda_graph_bs"),
]


@pytest.mark.parametrize("alteration", ALTERATIONS)
def test_altered_router_graph_path_is_caught(sglang_target, monkeypatch, alteration):
    edits, want = ALTERATIONS[alteration]
    _swap_in(monkeypatch, edits)
    _caught(sglang_target, want)


def test_refactored_router_graph_paths_hold(sglang_target, monkeypatch):
    _swap_in(monkeypatch, REFACTOR)
    obs = PROPERTIES["routing"].check(sglang_target, CONFIG, [BATCH])
    assert {"hybrid: replay fix-up -> prefill", "hybrid: cuda-graph state -> prefill",
            "hybrid-linear: replay fix-up -> full, linear"} <= obs.classes


# -- reference: what its routers answer, changed ---------------------------------------

def _layered(change):
    target = resolve("reference")
    route = target.route
    target.route = lambda *a: change(route(*a))
    return target


def _hybrid_prefill(change):
    return lambda r: change(r) if (r.router, r.spec_mode) == ("hybrid", "prefill") else r


def test_reference_holds_with_graph_paths():
    obs = PROPERTIES["routing"].check(resolve("reference"), CONFIG, [BATCH])
    assert {"hybrid: replay fix-up -> decode", "hybrid: cuda-graph state -> prefill",
            "tbo: cuda-graph state -> primary", "dots-swa: replay fix-up -> wrapped"} <= obs.classes


@pytest.mark.parametrize("fixups,role,buffer", [
    ((), "prefill", "verify buffers"),                                           # reaches no child
    ((("decode", FIXUP_SPEC, 5),), "prefill", "verify buffers"),                # another child
    ((("prefill", FIXUP_SPEC, 5), ("prefill", FIXUP_SPEC, 5)), "prefill", "verify buffers"),  # twice
    ((("prefill", FIXUP_SPEC, 5), ("decode", FIXUP_SPEC, 5)), "decode", "verify buffers"),    # and another
    ((("prefill", object(), 5),), "prefill", "spec_info"),                        # a spec_info of its own
])
def test_reference_fixup_misrouted_is_caught(fixups, role, buffer):
    target = _layered(_hybrid_prefill(lambda r: dataclasses.replace(r, fixups=fixups)))
    _caught(target, {**_REPLAY, "router": "hybrid", "role": role, "buffer": buffer})


@pytest.mark.parametrize("states", [(("decode", 6, 24),), (("decode", 6, 24), ("prefill", 24, 6))])
def test_reference_verify_child_without_its_graph_state_is_caught(states):
    target = _layered(_hybrid_prefill(lambda r: dataclasses.replace(r, graph_states=states)))
    _caught(target, {**_SET_UP, "router": "hybrid", "role": "prefill"})


def test_reference_graph_state_for_a_child_in_no_graph_is_caught():
    # verification on the decode child: the prefill child runs in no captured graph
    both = (("decode", 6, 24), ("prefill", 6, 24))
    target = _layered(lambda r: dataclasses.replace(r, graph_states=both)
                      if (r.router, r.spec_mode) == ("hybrid", "decode") else r)
    _caught(target, {**_SET_UP, "router": "hybrid", "role": "prefill", "spec_mode": "decode"})
