"""SGLang's DecodeCudaGraphRunner in TARGET_VERIFY, captured and replayed through the graph stand-in."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import sglang_or_skip
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.oracle import expected


@pytest.mark.slow
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
