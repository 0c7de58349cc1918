"""The draft model forward a captured draft-extend graph runs, standing in: it records what it is handed.

A draft-extend forward runs every token of each request's window (``d`` of
them, ``d + front`` on the multi-layer runner) over the request's prefix. Per
token this stand-in reads the Triton backend's extend metadata through the
forward context, as SGLang's attention layers do: the request's query rows
(``qo_indptr``, and only the first ``max_extend_len`` of them, as the extend
kernel's grid covers no more) and its prefix KV slots (``kv_indptr`` /
``kv_indices``); a row sees its prefix and the rows before it in its own
window. Where the backend has a sliding window its window layers also read the
request's window rail (``window_kv_indptr``/``window_kv_indices``, and the
prefix position ``window_kv_offsets`` says the window starts at). It writes the token's KV at its ``out_cache_loc`` slot and computes a
hidden state that is a deterministic function of what it read and of the
target hidden state it was handed (``spec_info.hidden_states``), exact in
float64.

The logits side is SGLang's own: ``LogitsMetadata.from_forward_batch`` and
``LogitsProcessor``'s row pruning (``_get_pruned_states``, the
``select_index`` rows the graph keeps before the lm_head) and hidden-state
choice (``_get_hidden_states_to_store``); only the lm_head is a stand-in. So
the rows a graph prunes to are the rows SGLang picks, recorded.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from vmfuzz.harness.guard.graph import GraphSpace
from vmfuzz.harness.targets.sglang.graph_model import HIDDEN, VOCAB, _prefix_content

_MOD = 1 << 31


@functools.lru_cache(maxsize=None)
def _sglang():
    from vmfuzz.harness.targets.sglang.imports import sglang_module
    return (sglang_module("sglang.srt.model_executor.forward_context"),
            sglang_module("sglang.srt.layers.logits_processor"))


@dataclass
class ExtendRow:
    """What attention was handed for one token of a draft-extend window."""

    request: int
    row: int  # the token's place in its request's window
    prefix_slots: tuple[int, ...]
    #: a window layer's: the prefix slots its window rail names, and the prefix position the window starts at
    window_slots: tuple[int, ...] = ()
    window_start: int = 0


@dataclass
class ExtendForward:
    """One call of the draft model: inputs, what attention got, KV writes, what it returned."""

    input_ids: list[int]
    positions: list[int]
    attended: list[ExtendRow]
    kv_writes: list[tuple[int, int]]  # (slot, value) in write order
    hidden: torch.Tensor  # (tokens, HIDDEN) float64, every token
    logits: torch.Tensor  # what the logits processor returned (pruned rows, or every token)
    kept_hidden: torch.Tensor | None  # the hidden states it returned
    selected: list[int] | None  # the rows select_index pruning kept (None: no pruning)


def _lm_head(states: torch.Tensor) -> torch.Tensor:
    return (states[:, :1] * (torch.arange(VOCAB, dtype=torch.float64) + 1) % 9973).to(torch.float32)


def _window_rail(meta, b: int) -> tuple[tuple[int, ...], int]:
    """Request ``b``'s window rail as a window layer reads it (its slots through the window indptr, the
    position its window starts at); nothing where the metadata holds no rail (no window layers)."""
    ptr, ids, offsets = (getattr(meta, f, None) for f in ("window_kv_indptr", "window_kv_indices",
                                                           "window_kv_offsets"))
    if ids is None or ptr is None or b + 1 >= ptr.numel():
        return (), 0
    lo, hi = int(ptr[b]), int(ptr[b + 1])
    start = int(offsets[b]) if offsets is not None and b < offsets.numel() else 0
    return tuple(ids[lo:hi].tolist()), start


class DraftExtendModel:
    """The draft model forward, standing in (see the module doc).

    In a graph (the batch carries ``next_token_logits_buffer``) its outputs go to fixed memory:
    the logits into that buffer, the hidden states into a static buffer per token count."""

    def __init__(self, space: GraphSpace):
        self.space = space
        self.calls: list[ExtendForward] = []
        self._hidden: dict[tuple, torch.Tensor] = {}
        self.shared_experts_config = None
        self._processor = None

    def _attend(self, meta, n: int):
        qo, kv_ptr = meta.qo_indptr.tolist(), meta.kv_indptr.tolist()
        width = meta.max_extend_len
        attended: list[ExtendRow | None] = [None] * n
        for b in range(len(qo) - 1):
            slots = tuple(meta.kv_indices[kv_ptr[b]:kv_ptr[b + 1]].tolist())
            window, start = _window_rail(meta, b)
            for j in range(min(qo[b + 1] - qo[b], width)):
                if 0 <= qo[b] + j < n:
                    attended[qo[b] + j] = ExtendRow(b, j, slots, window, start)
        return attended

    def forward(self, input_ids, positions, forward_batch, **kwargs):
        forward_context, logits_module = _sglang()
        meta = forward_context.get_attn_backend().forward_metadata
        ids, pos = input_ids.tolist(), positions.tolist()
        n = len(ids)
        loc = forward_batch.out_cache_loc.tolist()
        target = forward_batch.spec_info.hidden_states
        carried = target[:n, 0].to(torch.float64).tolist() if target is not None else [0.0] * n
        attended = self._attend(meta, n)
        writes = [(int(loc[i]), ids[i] * 1000 + pos[i]) for i in range(n)]
        values, running = [], {}
        for i in range(n):
            a = attended[i]
            if a is None:  # no query row of the kernel's grid covers it: attention never ran for it
                values.append(-1.0)
                continue
            acc = sum(_prefix_content(s) for s in a.prefix_slots) + running.get(a.request, 0)
            acc += 3 * sum(_prefix_content(s) for s in a.window_slots) + 5 * a.window_start
            running[a.request] = running.get(a.request, 0) + ids[i] * 1000 + pos[i]
            values.append(float((acc * 1000003 + ids[i] * 7919 + pos[i] + int(carried[i]) * 31) % _MOD))
        v = torch.tensor(values, dtype=torch.float64).reshape(n, 1)
        hidden = v + torch.arange(HIDDEN, dtype=torch.float64)
        logits, kept, selected = self._logits(forward_batch, hidden)
        kept_out, logits_out = kept, logits
        buffer = forward_batch.next_token_logits_buffer
        if buffer is not None:  # in a graph: the same memory every run
            logits_out = buffer[:logits.shape[0]]
            logits_out.copy_(logits[:, :logits_out.shape[1]])
            if kept is not None:
                key = tuple(kept.shape)
                h = self._hidden.get(key)
                if h is None:
                    h = self._hidden[key] = self.space.static(f"draft-hidden{list(key)}",
                                                              torch.zeros(key, dtype=torch.float64))
                h.copy_(kept)
                kept_out = h
        self.calls.append(ExtendForward(ids, pos, [a or ExtendRow(-1, -1, ()) for a in attended], writes,
                                        hidden.clone(), logits.clone(),
                                        None if kept is None else kept.clone(), selected))
        return logits_module.LogitsProcessorOutput(next_token_logits=logits_out, hidden_states=kept_out)

    def _logits(self, forward_batch, hidden: torch.Tensor):
        """SGLang's logits processor on ``hidden``: its metadata, its row pruning, its hidden-state choice."""
        _, lp = _sglang()
        meta = lp.LogitsMetadata.from_forward_batch(forward_batch)
        if self._processor is None:
            self._processor = object.__new__(lp.LogitsProcessor)
        proc = self._processor
        pruned, pruned_before_norm, aux_pruned, sample, _, _ = lp.LogitsProcessor._get_pruned_states(
            proc, hidden, None, None, meta)
        kept = lp.LogitsProcessor._get_hidden_states_to_store(
            proc, hidden, None, None, pruned, pruned_before_norm, aux_pruned, sample, meta)
        select = meta.draft_extend_select_index
        logits = _lm_head(pruned)
        if sample is not None:
            logits = logits[sample]
        return logits, kept, (None if select is None else select.tolist())
