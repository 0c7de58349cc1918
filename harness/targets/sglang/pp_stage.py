"""A later pipeline stage's verify step on the graph path: SGLang's pp rebuild feeding the stage's runner.

On a pipeline-parallel server every stage rebuilds the verify input from the
relayed draft tree (``Scheduler._pp_spec_rebuild_verify_input``) and runs its
layers through its own decode cuda-graph runner; a later stage is handed the
earlier one's hidden states as ``PPProxyTensors``, which its graphs read from
static buffers. The stage here is the last of ``PP_SIZE``, and its steps are
the ones an overlap scheduler hands it: the batch was recomposed since the
relay's rows were labelled (they come rotated by one request, so the rebuild
re-indexes them by request id), and its length sum is unknown (``seq_lens_sum``
None: the rebuild sizes the tree kernel itself). An idle step (no request)
takes the rebuild's idle input.
"""

from __future__ import annotations

import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.targets.sglang import call_sites
from vmfuzz.harness.targets.sglang.graph_model import HIDDEN
from vmfuzz.harness.targets.sglang.stand_in import StandIn

#: the server's pipeline stages (the runner driven is the last one's)
PP_SIZE = 2
_GRAPH_PROPS = ("graph-replay-equivalence", "padding-inert", "capture-replay-agreement")

#: What this module drives: (path under the sglang package, function, properties).
SURFACE = (
    ("srt/managers/scheduler_pp_mixin.py", "Scheduler._pp_spec_rebuild_verify_input", _GRAPH_PROPS),
    ("srt/speculative/pp_spec_relay.py", "PPSpecRelayInput.reindex", _GRAPH_PROPS),
    ("srt/speculative/eagle_info.py", "EagleVerifyInput.create_idle_input", _GRAPH_PROPS),
)
_MIXIN = "srt/managers/scheduler_pp_mixin.py"


def relay_order(bs: int) -> list[int]:
    """The order the relay's rows come in: the batch's, rotated by one request."""
    return list(range(1, bs)) + [0]


class Stage:
    """The last stage's verify steps on a server of ``config``: ``verify_input`` and ``idle_input``
    rebuilt by SGLang inside ``routed()`` (the pp call site's seams), ``proxy`` what the earlier
    stage hands on. ``verify_mask``: the stage's backend's (the rebuild writes into it)."""

    def __init__(self, sg, verify_mask, config: Config, routed):
        self.sg, self.verify_mask, self.config, self.routed = sg, verify_mask, config, routed

    def verify_input(self, batch: Batch):
        """The verify input for ``batch``, rebuilt from a relay labelled for another order, the batch's
        length sum unknown."""
        forward_batch, worker, chain = call_sites.stand_ins(self.sg, self.verify_mask, self.config, batch, "cpu")
        forward_batch.seq_lens_sum = None
        with self.routed():
            return call_sites.pp_rebuild(self.sg, forward_batch, worker, chain, self.config, batch, "cpu",
                                         relay_order(batch.bs))

    def idle_input(self):
        """The rebuild's verify input for an idle step (no request)."""
        backend = StandIn("attention backend's verify_mask", _MIXIN, verify_mask=self.verify_mask,
                          max_context_len=self.config.max_context_len)
        worker = StandIn("target worker", _MIXIN, model_runner=StandIn("model runner", _MIXIN, attn_backend=backend))
        forward_batch = StandIn("ScheduleBatch", "srt/managers/schedule_batch.py",
                                forward_mode=self.sg.forward_info.ForwardMode.IDLE, batch_size=lambda: 0, reqs=[],
                                seq_lens=torch.empty(0, dtype=torch.long), seq_lens_sum=0, spec_info=None)
        with self.routed():
            return call_sites.pp_call(self.sg, forward_batch, worker, self.config, "cpu")

    def proxy(self, loc: torch.Tensor):
        """What the earlier stage hands this one for tokens whose KV slots are ``loc``: hidden states and
        residuals unique to each token and step (slots are step-unique), exact in float32."""
        n = loc.numel()
        base = (loc.to(torch.float64) % 4099).view(n, 1) + torch.arange(HIDDEN, dtype=torch.float64)
        return self.sg.forward_info.PPProxyTensors({"hidden_states": base.to(torch.float32),
                                                    "residual": (base * 3 % 1021).to(torch.float32)})
