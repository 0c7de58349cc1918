"""The model forward a captured target verify graph runs, standing in: it records what it is handed.

Per token it reads the attention metadata the backend holds (through the
forward context, as SGLang's attention layers do): which prefix KV slots its
request's ``kv_indptr``/``kv_indices`` give it and which of them and of the
draft tokens its ``custom_mask`` row (found through ``mask_indptr``) lets it
see. It writes the token's KV at its ``out_cache_loc`` slot, and hands back
hidden states and logits that are a deterministic function of what it read,
exact in float64. So a replay that feeds a token the wrong slots, the wrong
mask row, the wrong id or position gives a different number than the eager
run of the same batch. On a server with window layers (``swa_server``) it is
also one window layer: it reads the window metadata (each request's window
slots and the mask column its window starts at) and writes the token's KV at
the window slot the metadata holds (``swa_out_cache_loc``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from vmfuzz.harness.guard.graph import GraphSpace


@functools.lru_cache(maxsize=None)
def _sglang():
    from vmfuzz.harness.targets.sglang.imports import sglang_module
    return (sglang_module("sglang.srt.model_executor.forward_context"),
            sglang_module("sglang.srt.layers.logits_processor"))


#: width of the stand-in model's hidden states and vocabulary: small, every value exact in float64
HIDDEN, VOCAB = 4, 16
_MOD = 1 << 31


def _prefix_content(slot: int) -> int:
    """What a prefix KV slot holds: a number only that slot has."""
    return (slot * 2654435761 + 12345) % 1000003


@dataclass
class Attended:
    """What attention was handed for one token: its request's row, and what the mask let it see."""

    request: int
    row: int  # the token's place in its request's draft
    prefix_slots: tuple[int, ...]
    draft_seen: tuple[int, ...]
    window_seen: tuple[int, ...] = ()  # the window layer's: the window slots the mask row shows


def _carried(pp_proxy_tensors, n: int) -> list[int]:
    """What each token's earlier pipeline stage handed on (its proxy hidden state, summed), 0 without one."""
    if pp_proxy_tensors is None:
        return [0] * n
    hidden = pp_proxy_tensors["hidden_states"][:n].to(torch.float64)
    return [int(v) % _MOD for v in hidden.sum(dim=-1).tolist()]


def _window(meta):
    """The window layer's metadata as lists (indptr, slots, each request's first mask column), or None
    where the backend built none (a server without window layers)."""
    ptr, slots, offsets = (getattr(meta, f, None) for f in ("window_kv_indptr", "window_kv_indices",
                                                             "window_kv_offsets"))
    if ptr is None or slots is None or offsets is None:
        return None
    ptr = ptr.tolist()
    return ptr, slots[:max(0, max(ptr))].tolist(), offsets.tolist()  # a graph's buffer: only what the rows name


def _window_seen(window, b: int, row: list) -> tuple[int, ...]:
    """The window slots request ``b``'s mask ``row`` shows: window token k sits in mask column offset + k."""
    if window is None or b + 1 >= len(window[0]) or b >= len(window[2]):
        return ()  # no window metadata for this request: it reads none, which the eager run's rows show
    ptr, slots, offsets = window
    # a column off the row (a wrong offset) shows nothing: the set read then differs from the eager run's
    return tuple(s for k, s in enumerate(slots[ptr[b]:ptr[b + 1]]) if 0 <= offsets[b] + k < len(row)
                 and row[offsets[b] + k])


@dataclass
class Forward:
    """One call of the model: its tokens' inputs, what attention got, the KV it wrote, what it returned."""

    input_ids: list[int]
    positions: list[int]
    attended: list[Attended]
    kv_writes: list[tuple[int, int]]  # (slot, value) in write order
    hidden: torch.Tensor  # (tokens, HIDDEN) float64
    logits: torch.Tensor  # (tokens, VOCAB) float32
    window_writes: list[tuple[int, int]] = field(default_factory=list)  # the window layer's (slot, value)


class RecordingModel:
    """The model forward, standing in: attention read from the backend's metadata, outputs from what it read.

    A graph body writes its outputs into fixed memory: at capture this model
    allocates its output buffers (static, redzoned) once per token count and
    writes into them on every run, as a graph's pool tensors keep their
    addresses; an eager call (no ``next_token_logits_buffer``) gets fresh ones.
    """

    def __init__(self, space: GraphSpace, d: int):
        self.space, self.d = space, d
        self.calls: list[Forward] = []
        self._hidden: dict[int, torch.Tensor] = {}
        self.shared_experts_config = None

    def forward(self, input_ids, positions, forward_batch, pp_proxy_tensors=None, **kwargs):
        """``pp_proxy_tensors``: a later pipeline stage's input, the earlier stage's hidden states per
        token (the runner hands them only to a forward whose signature names them)."""
        forward_context, logits_module = _sglang()
        meta = forward_context.get_attn_backend().forward_metadata
        ids, pos = input_ids.tolist(), positions.tolist()
        n = len(ids)
        qo, kv_ptr = meta.qo_indptr.tolist(), meta.kv_indptr.tolist()
        kv_idx, mask, mask_ptr = meta.kv_indices, meta.custom_mask, meta.mask_indptr.tolist()
        loc = forward_batch.out_cache_loc.tolist()
        d = self.d
        attended, values = [], []
        draft_val = [ids[i] * 1000 + pos[i] for i in range(n)]
        writes = [(int(loc[i]), draft_val[i]) for i in range(n)]
        window = _window(meta)
        swa_loc = getattr(meta, "swa_out_cache_loc", None)
        window_writes = [] if swa_loc is None else [(int(s), draft_val[i]) for i, s in enumerate(swa_loc[:n].tolist())]
        for b in range(len(qo) - 1):
            plen = kv_ptr[b + 1] - kv_ptr[b]
            slots = kv_idx[kv_ptr[b]:kv_ptr[b + 1]].tolist()
            for j in range(qo[b + 1] - qo[b]):
                row = mask[mask_ptr[b] + j * (plen + d): mask_ptr[b] + (j + 1) * (plen + d)].tolist()
                seen_prefix = tuple(s for s, v in zip(slots, row[:plen]) if v)
                seen_draft = tuple(k for k, v in enumerate(row[plen:plen + d]) if v)
                attended.append(Attended(b, j, seen_prefix, seen_draft, _window_seen(window, b, row)))
        carried = _carried(pp_proxy_tensors, n)
        for i in range(n):
            a = attended[i] if i < len(attended) else Attended(-1, -1, (), ())
            base = qo[a.request] if a.request >= 0 else 0
            acc = sum(_prefix_content(s) for s in a.prefix_slots)
            acc += sum(draft_val[base + k] for k in a.draft_seen if base + k < n)
            acc += 3 * sum(_prefix_content(s) for s in a.window_seen)
            values.append((acc * 1000003 + ids[i] * 7919 + pos[i] + carried[i] * 104729) % _MOD)
        v = torch.tensor(values, dtype=torch.float64).reshape(n, 1)
        hidden = v + torch.arange(HIDDEN, dtype=torch.float64)
        logits = (v * (torch.arange(VOCAB, dtype=torch.float64) + 1) % 9973).to(torch.float32)
        out_logits = forward_batch.next_token_logits_buffer
        if out_logits is not None:  # in a graph: the same memory every run
            out_logits = out_logits[:n]
            out_logits.copy_(logits[:, :out_logits.shape[1]] if out_logits.shape[1] <= VOCAB else
                             torch.nn.functional.pad(logits, (0, out_logits.shape[1] - VOCAB)))
            h = self._hidden.get(n)
            if h is None:
                h = self._hidden[n] = self.space.static(f"hidden[{n}]", torch.zeros(n, HIDDEN, dtype=torch.float64))
            h.copy_(hidden)
            out_hidden = h
        else:
            out_logits, out_hidden = logits, hidden
        self.calls.append(Forward(ids, pos, attended, writes, hidden.clone(), logits.clone(), window_writes))
        return logits_module.LogitsProcessorOutput(next_token_logits=out_logits, hidden_states=out_hidden)
