"""One server's draft-decode cuda graphs, for the graph-path properties (``draft_graph_runner`` drives them).

``DraftSession`` builds the runner once (captured at every captured bs), then
for each batch of sequence lengths makes the live draft batch (candidate
scores, token ids inside the vocabulary, hidden states, and KV slots read from
each request's ``req_to_token`` row, none 0: slot 0 is where padding writes),
replays it through ``execute`` (optionally over padded rows poisoned first) and
drafts it eagerly for comparison.
"""

from __future__ import annotations

from dataclasses import fields, replace

import torch

from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.draft_graph import DraftShape, chain_column, footprints, window_slot
from vmfuzz.harness.targets.sglang.draft_graph_runner import (
    Drafted, build, can_run, eager, live_batch, modules, replay)
from vmfuzz.harness.targets.sglang.draft_model import HIDDEN, VOCAB
from vmfuzz.harness.targets.sglang.graph_session import RunnerView, captured_sizes

#: the runner's per-request and per-branch static buffers, and how many cells one request has in each
#: (per request; ``k``: per branch; ``kn``: per branch and step)
PADDED_ROWS = {"seq_lens": "1", "seq_lens_cpu": "1", "req_pool_indices": "1", "topk_p": "k", "topk_index": "k",
               "hidden_states": "h", "positions": "k", "out_cache_loc": "kn"}


def window_not_driven() -> str | None:
    """Why a draft model's window layers are not driven on this SGLang (None: they are). vmfuzz judges
    their reads through the per-step window rail the multi-step draft backend builds (0.5.23's
    ``_fill_window_rail``); a release whose backend has none (0.5.22) lays window reads out otherwise."""
    backend = getattr(modules().triton, "TritonMultiStepDraftBackend", None)
    if backend is not None and hasattr(backend, "_fill_window_rail"):
        return None
    return ("this SGLang's Triton multi-step draft backend builds no per-step window rail, which vmfuzz's "
            "window reads follow")


def seeded_not_driven() -> str | None:
    """Why seeded draft sampling is not driven on this SGLang (None: it is): the runner keeps no per-request
    seed among its static buffers (0.5.22's draft steps draw from the device's generator, unseeded)."""
    buffers = getattr(modules().runner, "EagleDraftInputBuffers", None)
    if buffers is not None and "sampling_seed" in {f.name for f in fields(buffers)}:
        return None
    return "this SGLang's draft runner keeps no sampling seed among its buffers: its draft steps sample unseeded"


class DraftSession(RunnerView):
    """The draft-decode runner of a server of ``shape`` capturing up to ``max_bs``."""

    def __init__(self, shape: DraftShape, max_bs: int, heap: ShadowHeap | None = None, largest_only: bool = False):
        """``largest_only``: capture only the largest bucket; SGLang sizes every static buffer for the
        largest captured bs, so the buffers are those of the whole list, for a check that replays
        only a full bucket (one capture where a list of them costs a draft forward each)."""
        # what a release lays out otherwise is not driven, the case's server then without it: window layers
        # (no per-step window rail), seeded draft sampling (no seed among the runner's buffers)
        pieces = {"window layers": shape.window and window_not_driven(),
                  "seeded sampling": shape.seeded_sampling and seeded_not_driven()}
        self.pieces_not_driven = {piece: why for piece, why in pieces.items() if why}
        if "window layers" in self.pieces_not_driven:
            shape = replace(shape, window=0, window_pool=False)
        if "seeded sampling" in self.pieces_not_driven:
            shape = replace(shape, seeded_sampling=False)
        self.shape = shape
        sizes = captured_sizes(max_bs)
        self.server = build(shape, sizes[-1:] if largest_only else sizes, heap)
        self.capture_bs = self.server.capture_bs
        self.max_bs = self.capture_bs[-1]
        self.vocab = VOCAB  # the draft model's: a token id past it is an out-of-bounds gather

    def per_request(self, name: str) -> int:
        k, n = self.shape.topk, self.shape.steps
        return {"1": 1, "k": k, "kn": k * n, "h": HIDDEN}[PADDED_ROWS[name]]

    def slots(self, seq_lens: list[int]) -> torch.Tensor:
        """Each branch's draft KV slots, step after step: request b (pool row ``bs - b``), branch t,
        step i at the row column the meaning gives it (``chain_column``: ``s_b + t*n + i`` unpaged)."""
        k, n = self.shape.topk, self.shape.steps
        table = self.server.req_to_token
        bs = len(seq_lens)
        cols = [chain_column(self.shape, s, t, i) for s in seq_lens for t in range(k) for i in range(n)]
        rows = [bs - b for b in range(bs) for _ in range(k * n)]
        return table[rows, cols].to(torch.long)

    def inputs(self, seq_lens: list[int]):
        bs, k = len(seq_lens), self.shape.topk
        scores = torch.arange(bs * k, dtype=torch.float32).view(bs, k)
        topk_p = torch.softmax(-scores / 3, dim=-1)
        topk_index = (torch.arange(bs * k).view(bs, k) * 5 + 1) % VOCAB
        hidden = torch.arange(bs * HIDDEN, dtype=torch.float64).view(bs, HIDDEN) + 7
        return topk_p, topk_index, hidden, self.slots(seq_lens)

    def live(self, seq_lens: list[int]):
        return live_batch(self.server, list(seq_lens), *self.inputs(seq_lens))

    def can_run(self, seq_lens: list[int]) -> bool:
        return can_run(self.server, self.live(seq_lens))

    def replay(self, seq_lens: list[int], poison: dict[str, torch.Tensor] | None = None) -> Drafted:
        """``execute`` the batch; ``poison``: buffer name -> values written over its rows past the batch's
        first, as a previous, larger step (or the pool's earlier tenant) left them."""
        buffers = self.buffers
        for name, values in (poison or {}).items():
            flat = getattr(buffers, name).view(-1)
            tail = flat[len(seq_lens) * self.per_request(name):]
            tail.copy_(values.reshape(-1)[:tail.numel()].to(flat.dtype))
        return replay(self.server, self.live(seq_lens))

    def eager(self, seq_lens: list[int]) -> Drafted:
        return eager(self.server, self.live(seq_lens))

    def window_slot(self, full: int) -> int:
        """The window slot the server's hybrid pool (``shape.window_pool``) maps full slot ``full`` to."""
        return window_slot(full, self.server.req_to_token.numel() + 1)

    def pool_row(self, slot: int) -> int:
        """The ``req_to_token`` row a KV slot belongs to: the pool names each cell ``1 + row*R + column``."""
        return (slot - 1) // self.server.req_to_token.shape[1]

    def cell(self, bs: int, b: int, column: int) -> int:
        """The slot ``req_to_token`` holds at ``column`` of request ``b``'s row (pool row ``bs - b``)."""
        return int(self.server.req_to_token[bs - b, column])

    def flashinfer_plans(self, view):
        """FlashInfer's multi-step draft backend handed ``view`` (a replay's): each step's plan inputs, with the
        host-indptr option off and on (``flashinfer_draft``)."""
        from vmfuzz.harness.targets.sglang import flashinfer_draft
        from vmfuzz.harness.targets.sglang.imports import sglang_module
        module = sglang_module("sglang.srt.layers.attention.flashinfer_backend")
        return flashinfer_draft.plans(module, self.server.runner.model_runner, self.shape, self.max_bs, view)

    # -- what the graph buffers hold -----------------------------------------------------------------
    def allocated(self) -> dict[str, int]:
        """Cells each static buffer holds (``kv_indices``, ``kv_indptr``: per step row)."""
        buffers, backend = self.server.runner.buffers, self.server.backend
        out = {name: getattr(buffers, name).numel() for name in PADDED_ROWS}
        out["input_ids"] = buffers.input_ids.numel()
        out["kv_indices"] = int(backend.cuda_graph_kv_indices.shape[1])
        out["kv_indptr"] = int(backend.kv_indptr.shape[1])
        if self.shape.window and getattr(backend, "window_rail", False):
            out["window_kv_indices"] = int(backend.cuda_graph_window_kv_indices.shape[1])
            out["window_kv_indptr"] = int(backend.window_kv_indptr.shape[1])
        return out

    def needed(self, seq_lens: list[int] | None = None) -> dict[str, int]:
        return footprints(self.shape, self.max_bs, HIDDEN, seq_lens)
