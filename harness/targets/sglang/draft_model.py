"""The draft model forward a captured draft-decode graph runs, standing in: it records what it is handed.

``EagleDraftWorker.draft_forward`` calls its draft runner's ``forward`` once
per draft step but the last. This stand-in is that ``forward``. Per branch
(a request's topk candidate) it reads the attention metadata the step's
backend holds, as a kernel reads it: from the ``kv_indptr``/``kv_indices``
buffers' start addresses on (a graph's attention kernel was handed pointers,
never the slice lengths its capture's view had), so a replay that hands a
branch the wrong range of KV slots gives another number. It reads the KV it
attends to (a prefix slot holds a number only that slot has; a slot an
earlier draft step wrote holds what was written), writes the branch's KV at
its ``out_cache_loc`` slot (a window layer on a hybrid pool: at the window
slot its metadata's ``swa_out_cache_loc`` holds, recorded), and returns hidden states and logits that are a
deterministic function of what it read, exact in float64.

A token id outside ``[0, VOCAB)`` is what an embedding gather would read out of
bounds: it is recorded (``Step.out_of_vocab``), never raised, so the property
that poisoned the padded rows judges it; the computation goes on with the id
folded into the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from vmfuzz.harness.guard.graph import GraphSpace

#: the draft model's hidden width and vocabulary: small, every value exact in float64
HIDDEN, VOCAB = 4, 32
_MOD = 1 << 31


def _prefix_content(slot: int) -> int:
    """What a KV slot no draft step wrote holds: a number only that slot has."""
    return (slot * 2654435761 + 12345) % 1000003


def kernel_reads(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory from its first cell to its storage's end, as a kernel handed its address reads it."""
    flat_len = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    return torch.as_strided(t, (flat_len,), (1,), t.storage_offset())


@dataclass
class Step:
    """One draft step's model call: per branch its inputs, the KV slots attention was handed, its write."""

    step: int
    input_ids: list[int]
    positions: list[int]
    attended: list[tuple[int, ...]]
    kv_writes: list[tuple[int, int]]  # (slot, value) per branch
    hidden: torch.Tensor
    logits: torch.Tensor
    out_of_vocab: list[tuple[int, int]] = field(default_factory=list)  # (branch, id)
    #: per branch, the KV slots a window layer was handed (a model with window layers; else empty)
    window_attended: list[tuple[int, ...]] = field(default_factory=list)
    #: per branch, the slot a window layer writes its KV at, where the pool keeps window layers apart
    #: (the backend's ``swa_out_cache_loc``; else empty)
    window_writes: list[int] = field(default_factory=list)


def _window_reads(meta, n: int) -> list[tuple[int, ...]]:
    """Per branch, the slots the step's window layers read (their own indptr and indices, read as a kernel
    reads them); empty where the step's metadata holds none (no window layers)."""
    if getattr(meta, "window_kv_indices", None) is None or getattr(meta, "window_kv_indptr", None) is None:
        return []
    indptr = kernel_reads(meta.window_kv_indptr)[:n + 1].tolist()
    indices = kernel_reads(meta.window_kv_indices)
    return [tuple(indices[indptr[z]:indptr[z + 1]].tolist()) if indptr[z + 1] >= indptr[z] else ()
            for z in range(n)]


class RecordingDraftModel:
    """``draft_runner.forward``, standing in: attention read from the step backend's metadata.

    ``steps`` collects every call; ``kv`` is the KV the draft steps wrote (reset by the driver before
    each draft). In a graph the outputs live in fixed memory: one static, redzoned pair per branch
    count, written on every run, as a graph pool's tensors keep their addresses."""

    def __init__(self, space: GraphSpace, backends: list):
        self.space, self.backends = space, backends
        self.steps: list[Step] = []
        self.kv: dict[int, int] = {}
        self._outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.in_graph = False

    def forward(self, forward_batch, *args, **kwargs):
        from vmfuzz.harness.targets.sglang.graph_model import _sglang
        backend = _sglang()[0].get_attn_backend()
        # the graph's per-step backends, then the eager reference's: the step is the place in either
        step = next(i for i, b in enumerate(self.backends) if b is backend) % max(1, len(self.backends) // 2)
        meta = backend.forward_metadata
        ids = forward_batch.input_ids.tolist()
        pos = forward_batch.positions.tolist()
        loc = forward_batch.out_cache_loc.tolist()
        n = len(ids)
        indptr = kernel_reads(meta.kv_indptr)[:n + 1].tolist()
        indices = kernel_reads(meta.kv_indices)
        hidden_in = forward_batch.spec_info.hidden_states
        hidden_sum = hidden_in.sum(dim=-1).tolist() if hidden_in is not None else [0.0] * n
        attended, writes, values, oov = [], [], [], []
        for z in range(n):
            slots = tuple(indices[indptr[z]:indptr[z + 1]].tolist()) if indptr[z + 1] >= indptr[z] else ()
            attended.append(slots)
            if not 0 <= ids[z] < VOCAB:
                oov.append((z, ids[z]))
            acc = sum(self.kv.get(s, _prefix_content(s)) for s in slots)
            values.append((acc * 1000003 + (ids[z] % VOCAB) * 7919 + pos[z] * 31 + int(hidden_sum[z])) % _MOD)
        for z in range(n):
            writes.append((int(loc[z]), values[z]))
            self.kv[int(loc[z])] = values[z]
        v = torch.tensor(values, dtype=torch.float64).reshape(n, 1)
        hidden = (v % 65521) + torch.arange(HIDDEN, dtype=torch.float64)
        logits = ((v * (torch.arange(VOCAB, dtype=torch.float64) * 2 + 1)) % 97 / 8.0).to(torch.float32)
        swa_loc = getattr(meta, "swa_out_cache_loc", None)
        self.steps.append(Step(step, ids, pos, attended, writes, hidden.clone(), logits.clone(), oov,
                               _window_reads(meta, n), [] if swa_loc is None else swa_loc[:n].tolist()))
        if self.in_graph:  # a graph's outputs: the same memory every run
            out = self._outputs.get(n)
            if out is None:
                out = self._outputs[n] = (
                    self.space.static(f"draft_logits[{n}]", torch.zeros(n, VOCAB, dtype=torch.float32)),
                    self.space.static(f"draft_hidden[{n}]", torch.zeros(n, HIDDEN, dtype=torch.float64)))
            out[0].copy_(logits)
            out[1].copy_(hidden)
            logits, hidden = out
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=hidden),
                               can_run_graph=False)
