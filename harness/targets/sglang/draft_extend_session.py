"""One server's draft-extend cuda graphs, for the graph-path properties (the drivers run them).

``DraftExtendSession(config, heap, runner)`` builds one runner of ``RUNNERS``
(SGLang's EAGLE v2 draft-extend runner, or the multi-layer multi-step one with
the Triton or the native ``prepare``), captured at every captured bs. Each
step is a live batch after a verify: its window's token ids, KV slots and
target hidden states are made here (slots distinct, step-unique, never 0:
slot 0 is where padding writes), its accept lengths drawn from its lengths.
``replay`` runs it through the graphs, optionally over padded rows poisoned
with what a previous, larger step leaves; ``eager`` runs it as the worker's
eager path does. What the graph stand-in recorded (stale reads, overruns) is
handed through.
"""

from __future__ import annotations

import torch

from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.targets.sglang import draft_extend_runner, multi_layer_runner
from vmfuzz.harness.targets.sglang.graph_session import RunnerView, captured_sizes

#: the runners a session drives, by the name the properties' sub-checks use
RUNNERS = ("draft extend", "multi-layer draft extend", "multi-layer draft extend, native prepare")

#: the static buffers a step writes, by the axis their padded rows are cut on (what a poison may
#: stand for: content an earlier step leaves there; the constant ones are never rewritten)
PADDED_ROWS = {"input_ids": "tokens", "positions": "tokens", "out_cache_loc": "tokens", "hidden_states": "tokens",
               "seq_lens": "requests", "seq_lens_cpu": "requests", "req_pool_indices": "requests",
               "select_index": "requests", "num_correct_drafts": "requests", "num_accept_tokens": "requests",
               "extend_seq_lens": "requests"}
#: buffers the multi-layer runner never rewrites after allocation (constant per server)
_CONSTANT_MULTI = ("extend_seq_lens",)


def not_driven(config: Config, runner: str) -> str | None:
    """Why ``runner`` is not driven for ``config``'s server, or None."""
    if runner != RUNNERS[0] and (config.topk != 1 or config.spec_steps < 1 or config.d != config.spec_steps + 1):
        return "the multi-layer worker drafts topk-1 chains (d = steps + 1)"
    return None


class DraftExtendSession(RunnerView):
    """One draft-extend runner of a server, its graphs captured at every captured bs."""

    def __init__(self, config: Config, heap: ShadowHeap, runner: str = RUNNERS[0], window: int = 0):
        self.config, self.runner_name = config, runner
        sizes = captured_sizes(config.max_bs)
        if runner == RUNNERS[0]:
            self.driver = draft_extend_runner
            self.server = draft_extend_runner.build(config, sizes, heap, window=window)
            self.server.width = config.d
        else:
            self.driver = multi_layer_runner
            kind = "native" if runner.endswith("native prepare") else "triton"
            self.server = multi_layer_runner.build(config, sizes, heap, prepare_kind=kind)
        self.width = self.server.width
        self.capture_bs = sorted(self.server.runner.capture_bs)
        self.steps = 0

    def inputs(self, batch: Batch) -> dict:
        """This step's window: token ids in [1, 13], KV slots distinct, step-unique and never 0, target
        hidden rows, accept lengths in [1, d] from the lengths, and the rows ``select_index`` picks."""
        w, n = self.width, batch.bs * self.width
        self.steps += 1
        k = self.steps
        accept = [1 + (s + 3 * b + k) % self.config.d for b, s in enumerate(batch.seq_lens)]
        return {"ids": (torch.arange(n, dtype=torch.long) * 5 + k) % 13 + 1,
                "loc": torch.arange(n, dtype=torch.long) + 100000 * k,
                "hidden": (torch.arange(n * 4, dtype=torch.float64).reshape(n, 4) * 7 + k) % 23,
                "accept": accept,
                "select": torch.tensor([b * w + a - 1 for b, a in enumerate(accept)], dtype=torch.long)}

    def live(self, batch: Batch, x: dict):
        make = (draft_extend_runner.live_batch if self.driver is draft_extend_runner
                else multi_layer_runner.multi_layer_batch)
        return make(self.server, batch, x["ids"], x["loc"], x["hidden"], x["accept"])

    def can_run(self, batch: Batch, x: dict) -> bool:
        return self.driver.can_run(self.server, self.live(batch, x))

    def replay(self, batch: Batch, x: dict, poison: dict[str, torch.Tensor] | None = None):
        """The batch through the graphs (a list of steps); ``poison``: buffer name -> values written over
        its rows past the batch's first, as a previous, larger step would have left them."""
        fb = self.live(batch, x)
        for name, values in (poison or {}).items():
            buf = getattr(self.buffers, name, None)
            if buf is None or (self.driver is multi_layer_runner and name in _CONSTANT_MULTI):
                continue
            start = batch.bs * (self.width if PADDED_ROWS[name] == "tokens" else 1)
            tail = buf[start:start + values.shape[0]]
            tail.copy_(values[:tail.shape[0]].to(buf.dtype).reshape(tail.shape))
        if self.driver is draft_extend_runner:
            return draft_extend_runner.replay(self.server, fb, x["select"])
        return multi_layer_runner.replay(self.server, fb)

    def eager(self, batch: Batch, x: dict):
        return self.driver.eager(self.server, self.live(batch, x), x["select"].clone())

    def poison(self, batch: Batch, x: dict) -> dict[str, torch.Tensor]:
        """What a previous, larger step leaves in the padded rows: this batch's own KV slots, lengths at
        the context limit, a live request's pool row, stale counts and picks inside each row's window,
        token ids and positions no padding would hold, huge hidden states."""
        c, w = self.config, self.width
        rows, tokens = c.max_bs, c.max_bs * w
        loc = x["loc"]
        live_row = int(self.live(batch, x).req_pool_indices[0])
        i = torch.arange(rows)
        return {"out_cache_loc": loc.repeat(tokens // max(1, loc.numel()) + 1)[:tokens],
                "input_ids": torch.full((tokens,), 12), "positions": torch.full((tokens,), c.max_context_len + w),
                "hidden_states": torch.full((tokens, 4), 1e6, dtype=torch.float64),
                "seq_lens": torch.full((rows,), c.max_context_len), "seq_lens_cpu": torch.full((rows,), c.max_context_len),
                "req_pool_indices": torch.full((rows,), live_row), "select_index": i * w + (i % w),
                "num_correct_drafts": i % w, "num_accept_tokens": i % w + 1, "extend_seq_lens": torch.full((rows,), w)}
