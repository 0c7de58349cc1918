"""SGLang's DecodeCudaGraphRunner in TARGET_VERIFY, captured and replayed through the graph stand-in."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import sglang_or_skip
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.oracle import expected


def test_a_padded_replay_gives_the_eager_run_on_the_real_rows():
    target = sglang_or_skip()
    from vmfuzz.harness.targets.sglang import graph_runner as gr
    config = Config(TreeMaskMode.FULL_MASK, 4, 32, 4, 2, 2)
    heap = ShadowHeap()
    server = gr.build(config, [1, 2, 4], target.allocate(config, heap), heap)
    assert sorted(server.captures) == [1, 2, 4]
    batch = Batch((5, 7, 3))
    d = config.d
    ids = torch.arange(batch.bs * d) % 13 + 1
    loc = torch.arange(batch.bs * d) + 10000
    mask = expected(config, batch).tree_mask
    live = gr.live_batch(server, batch, mask.clone(), ids.clone(), loc.clone())
    assert gr.can_run(server, live)
    got = gr.replay(server, live)
    assert got.graph_bs == 4 and got.logits.shape[0] == batch.bs * d
    want = gr.eager(server, config, batch, gr.live_batch(server, batch, mask.clone(), ids.clone(), loc.clone()))
    assert torch.equal(got.logits, want.logits) and torch.equal(got.hidden, want.hidden)
    n = batch.bs * d
    assert got.forward.attended[:n] == want.attended and got.forward.kv_writes[:n] == want.kv_writes
    assert got.forward.kv_writes[n:] == [(0, 0)] * d  # the padded request writes the reserved slot 0 only
    assert server.space.overruns == []
    # what the graph read that another capture had since overwritten: kept, and told apart
    assert all(not s.after_captures for s in server.space.stale)


CONFIG = Config(TreeMaskMode.FULL_MASK, 4, 32, 4, 2, 2)
#: padded (3 -> 4), exact (1, 4), and one past max_bs (eager: no graph admits it)
BATCHES = [Batch((5, 7, 3)), Batch((9,)), Batch((2, 3, 4, 5)), Batch((1,) * 5)]


@pytest.mark.parametrize("name", ["graph-replay-equivalence", "padding-inert", "capture-replay-agreement"])
def test_the_graph_properties_hold_on_the_installed_sglang(sglang_target, name):
    from vmfuzz.harness.properties import PROPERTIES
    obs = PROPERTIES[name].check(sglang_target, CONFIG, BATCHES)
    assert {"not admitted by can_run_graph (eager)", "bs < max_bs", "layout FULL_MASK"} <= obs.classes
    if name != "capture-replay-agreement":
        assert {"padded replay"} <= obs.classes
    else:  # the backend metadata each capture replaces is read as captured, and said so
        assert "capture-order read: attn_backend.forward_metadata" in obs.classes


def test_a_host_value_changed_after_capture_and_read_by_the_graph_fails_capture_replay_agreement(sglang_target):
    from vmfuzz.harness.properties.graph_replay import CAPTURE_REPLAY, judge_stale_reads
    from vmfuzz.harness.properties.kit import PropertyFailure
    heap = ShadowHeap()
    session = sglang_target.graph_session(CONFIG, sglang_target.allocate(CONFIG, heap), heap)
    batch = Batch((5, 7, 3))
    mask = expected(CONFIG, batch).tree_mask
    ids, loc = session.inputs(batch)
    session.replay(batch, mask, ids, loc)
    judge_stale_reads(session, "pristine")  # nothing the live program changed is read
    # the live program moves a host value the graph body reads (its capture batch's token counts)
    captured = session.captured_view(4)
    captured.global_num_tokens_cpu = [99]
    got = session.replay(batch, mask, ids, loc)
    [stale] = [s for s in session.stale if s.after_captures and s.read]
    assert (stale.path, stale.read, stale.at_capture, stale.at_replay) == (
        "forward_batch.global_num_tokens_cpu", True, None, ("list", (99,)))
    with pytest.raises(PropertyFailure) as failed:
        judge_stale_reads(session, "altered")
    assert (failed.value.origin.cell, failed.value.origin.buffer) == (CAPTURE_REPLAY, stale.path)
    assert got.graph_bs == 4 and captured.global_num_tokens_cpu == [99]  # the live value is back


def test_a_server_of_another_layout_is_judged_on_the_mask_the_verify_graph_reads(sglang_target):
    """The Triton verify graph reads a full mask whatever layout the case was drawn in (the search's
    boundary corpus hands QLEN_ONLY cases to every property): judged, not a raise of the harness's making."""
    from vmfuzz.harness.properties import PROPERTIES
    qlen = Config(TreeMaskMode.QLEN_ONLY, 1, 2, 2, 1, 1)
    obs = PROPERTIES["graph-replay-equivalence"].check(sglang_target, qlen, [Batch((2,)), Batch((2, 2))])
    assert {"layout FULL_MASK", "exact replay", "not admitted by can_run_graph (eager)"} <= obs.classes
