"""A later pipeline stage's verify step on the CUDA-graph path: SGLang's pp rebuild feeding the stage's runner.

The stage's batches come recomposed behind the relay's back (its rows labelled for another order)
and with an unknown length sum; the runner is handed the earlier stage's hidden states (loaded
ahead, or by the forward); an idle step replays the rebuild's idle input; a batch no graph admits
runs eagerly on what the rebuild sized itself. Each is judged by the graph properties against the
batch as it means. Altered copies: a rebuild that no longer re-indexes the relay, a length bound
that forgets the batch size, a pre-loaded step whose hidden states are never refreshed, and a
registry that no longer copies them are each caught by graph-replay-equivalence; a refactor of
the re-index test is not, and the pristine copy holds.
"""

from __future__ import annotations

import msgspec
import pytest
import torch

from tests.helpers import sglang_or_skip
from tests.sglang_copies import altered_copy, failed_check_origin, run_on_copy
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.oracle import expected

CONFIG = msgspec.structs.replace(Config(TreeMaskMode.FULL_MASK, 4, 32, 4, 2, 2), call_site="pp", is_read=True)


def test_a_pipeline_stage_replays_the_rebuilt_batch_as_it_means(sglang_target):
    from vmfuzz.harness.targets.sglang import pp_stage
    heap = ShadowHeap()
    session = sglang_target.graph_session(CONFIG, sglang_target.allocate(CONFIG, heap), heap)
    assert session.pp and set(session.buffers.pp_proxy_tensors) == {"hidden_states", "residual"}
    batch = Batch((5, 7, 3))
    assert pp_stage.relay_order(batch.bs) == [1, 2, 0]  # labelled for another order: the rebuild re-indexes
    mask = expected(CONFIG, batch).tree_mask
    ids, loc = session.inputs(batch)
    spec = session.stage.verify_input(batch)
    assert torch.equal(spec.draft_token, ids) and spec.seq_lens_sum is None
    got, want = session.replay(batch, mask, ids, loc), session.eager(batch, mask, ids, loc)
    assert got.graph_bs == 4 and torch.equal(got.logits, want.logits) and session.overruns == []
    # the earlier stage's hidden states reach the graph: another step's make other logits
    other = session.eager(batch, mask, ids, loc + 1)
    assert not torch.equal(other.logits, want.logits)
    second = Batch((4, 6))  # the next step is loaded by the forward itself, the hidden states through the registry
    ids, loc = session.inputs(second)
    mask = expected(CONFIG, second).tree_mask
    assert torch.equal(session.replay(second, mask, ids, loc).logits, session.eager(second, mask, ids, loc).logits)
    idle = session.idle()
    assert idle.graph_bs == session.capture_bs[0] and idle.logits.shape[0] == 0
    assert {slot for slot, _ in idle.forward.kv_writes} == {0}


def test_the_graph_properties_judge_a_pipeline_stage_and_its_idle_step(sglang_target):
    from vmfuzz.harness.properties import shared_group
    obs = shared_group(["graph-replay-equivalence", "padding-inert", "capture-replay-agreement"]).check(
        sglang_target, CONFIG, [Batch((5, 7, 3)), Batch((9,))])
    assert {"pipeline stage: relay re-indexed by request id, length sum unknown",
            "pipeline stage: idle replay", "padded replay"} <= obs.classes


def test_a_server_of_another_call_site_is_no_pipeline_stage(sglang_target):
    config = msgspec.structs.replace(CONFIG, call_site="eagle")
    heap = ShadowHeap()
    session = sglang_target.graph_session(config, sglang_target.allocate(config, heap), heap)
    assert not session.pp and session.idle() is None and session.buffers.pp_proxy_tensors is None


MIXIN = ["srt/managers/scheduler_pp_mixin.py"]
REGISTRY = ["srt/model_executor/cuda_graph_buffer_registry.py"]
RUNNER = ["srt/model_executor/runner/decode_cuda_graph_runner.py"]
CASE = {"mode": "FULL_MASK", "max_bs": 4, "max_context_len": 32, "num_draft_tokens": 4, "topk": 2,
        "spec_steps": 2, "is_read": True, "call_site": "pp"}
#: the first step loaded ahead by the verify preparation (padded 3 -> 4), the second by the forward; the
#: third no graph admits (eager: the rebuild sizes its own mask from the length bound, 5 x 32 cells)
BATCHES = [(5, 7, 3), (4, 6), (9, 9, 9, 9, 9)]
EQUIVALENCE = "graph-replay-equivalence"

#: name -> (edits, the buffer the failure's origin names)
ALTERATIONS = {
    # the relabel test weakened to a length check: a recomposed batch verifies another request's tree
    "rebuild-reindex-by-length": (
        [(MIXIN, r"if relay\.rids != live_rids:", "if len(relay.rids) != len(live_rids):")], "logits"),
    # the unknown length sum bounded per request, not per batch: the rebuild's own mask is too short
    "rebuild-length-bound-per-request": (
        [(MIXIN, r"seq_lens_sum = bs \* self\.tp_worker\.model_runner\.model_config\.context_len",
          "seq_lens_sum = self.tp_worker.model_runner.model_config.context_len")], "tree_mask"),
    # the verify step loaded ahead without the proxy and never refreshed: the graph reads the previous
    # step's hidden states from the earlier stage
    "preloaded-proxy-never-refreshed": (
        [(RUNNER, r"pp_proxy_tensors is not None\s+and self\.buffers\.pp_proxy_tensors is not None", "False")],
        "logits"),
    # the proxy slot looked up under its slot name: a batch the forward loads never gets the hidden states
    "registry-proxy-key-misnamed": (
        [(REGISTRY, r"return None if ppx is None else ppx\.tensors\.get\(key\)",
          'return None if ppx is None else ppx.tensors.get(f"pp_proxy_tensors.{key}")')], "logits"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALTERATIONS))
def test_each_planted_bug_is_caught_by_graph_replay_equivalence(tmp_path, name):
    sglang_or_skip()
    edits, buffer = ALTERATIONS[name]
    site = altered_copy(tmp_path, edits, name)
    proc, out = _replay(site, tmp_path, EQUIVALENCE)
    assert proc.returncode == 1, out
    origin = failed_check_origin(tmp_path / "report", out)
    assert (origin["property"], origin["buffer"]) == (EQUIVALENCE, buffer), origin


@pytest.mark.slow
@pytest.mark.parametrize("prop", [EQUIVALENCE, "padding-inert", "capture-replay-agreement"])
def test_a_refactor_is_not_caught_and_the_pristine_copy_holds(tmp_path, prop):
    sglang_or_skip()
    edits = [(MIXIN, r"if relay\.rids != live_rids:", "if list(live_rids) != list(relay.rids):")] \
        if prop == EQUIVALENCE else []
    site = altered_copy(tmp_path, edits, "refactor" if edits else None)
    proc, out = _replay(site, tmp_path, prop)
    assert proc.returncode == 0 and f"held {prop}" in out, out


def _replay(site, tmp_path, prop: str):
    """``vmfuzz replay`` of the case (both batches) on the copy at ``site``, checked by ``prop`` alone."""
    import json
    repro = tmp_path / "case.json"
    repro.write_text(json.dumps({"config": CASE, "batches": [{"seq_lens": list(b)} for b in BATCHES]}))
    return run_on_copy(site, tmp_path, "replay", str(repro), "--target", "sglang", "--property", prop,
                       "--isolate", "off", "--report-dir", str(tmp_path / "report"))
