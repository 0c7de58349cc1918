"""The embedded model of the mask's readers (Triton's mask_indptr, FlashInfer's packing).

Written from the layout's meaning: request b reads d rows of s_b + d columns,
the requests one after another. Readers only read read masks, so the model --
like the servers that run these readers -- works in FULL_MASK.
"""

from __future__ import annotations

import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode, logical_size
from vmfuzz.harness.model.readers import (PackedView, PackRefused, PlanRead, ReaderView, WindowView, capture_seq_len,
                                   captured_bs, kv_slot, plan_kv_span, pool_slots)


def _rows_per_request(batch: Batch, d: int, device) -> torch.Tensor:
    """Cells of each request's block: d rows of its prefix plus the d draft columns."""
    seq = torch.tensor(batch.seq_lens, dtype=torch.long, device=device)
    return d * (seq + d)


def _indptr(lengths: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(lengths.numel() + 1, dtype=torch.long, device=lengths.device)
    out[1:] = torch.cumsum(lengths, 0)
    return out


def _window(config: Config, seq: torch.Tensor, size: int) -> WindowView:
    """A sliding-window layer reads each request's last ``size`` prefix tokens (all, if fewer), from the mask
    column of the first of them."""
    lens = seq.clamp(max=size)
    slots = pool_slots(seq.numel())
    ids = [kv_slot(slots[b], t, config.max_context_len)
           for b, (s, n) in enumerate(zip(seq.tolist(), lens.tolist())) for t in range(s - n, s)]
    return WindowView(size, _indptr(lens), torch.tensor(ids, dtype=torch.int64, device=seq.device), seq - lens)


def _view(config: Config, batch: Batch, mask: torch.Tensor, rows: int | None = None,
          window: int | None = None) -> ReaderView:
    """The metadata for ``batch``, padded to ``rows`` requests at the fill length for a replay.

    Every request, padding too, reads d query rows, its own prefix tokens' KV
    slots and d x (s + d) mask cells, one request after another; on a server
    with a sliding ``window``, also the window of its prefix.
    """
    d, dev, real = config.d, mask.device, batch.bs
    padded = Batch(tuple(batch.seq_lens) + (capture_seq_len(config),) * ((rows or real) - real))
    seq = torch.tensor(padded.seq_lens, dtype=torch.long, device=dev)
    kv_indptr = _indptr(seq)
    slots = pool_slots(padded.bs)
    kv_indices = torch.tensor([kv_slot(slots[b], t, config.max_context_len)
                               for b, s in enumerate(padded.seq_lens) for t in range(s)], dtype=torch.int64,
                              device=dev)
    return ReaderView(mask, _indptr(_rows_per_request(padded, d, dev)), rows,
                      qo_indptr=_indptr(torch.full((padded.bs,), d, dtype=torch.long, device=dev)),
                      kv_indptr=kv_indptr, kv_indices=kv_indices, max_extend_len=d,
                      window=None if window is None else _window(config, seq, window))


def model_read_eager(config: Config, batch: Batch, step_mask: torch.Tensor, window: int | None = None) -> ReaderView:
    """Eager verify reads the step's own mask where it lies."""
    return _view(config, batch, step_mask, window=window)


def model_read_replay(mask, config: Config, batch: Batch, step_mask: torch.Tensor, reused: bool,
                      window: int | None = None) -> ReaderView:
    """Capture, the step, then replay, which copies the step's mask into the preallocated buffer."""
    buffer = mask.buffer
    # Capture left a placeholder mask of ones for max_bs requests at the fill length.
    placeholder = logical_size(TreeMaskMode.FULL_MASK, [capture_seq_len(config)] * mask.max_bs, config.d)
    buffer[:placeholder].fill_(True)
    if reused:
        buffer.copy_(step_mask.to(buffer.device).view(buffer.shape))  # the step wrote into the buffer itself
    else:
        n = step_mask.numel()
        buffer[:n].copy_(step_mask.to(buffer.device).view(-1))
    return _view(config, batch, buffer, captured_bs(batch.bs, mask.max_bs), window)


def model_pack(config: Config, batch: Batch, step_mask: torch.Tensor, buffer: torch.Tensor) -> PackedView:
    """Bit-pack each request's rows into whole bytes, LSB first, requests back to back."""
    d, dev = config.d, buffer.device
    cells = _rows_per_request(batch, d, dev)
    nbytes = torch.div(cells + 7, 8, rounding_mode="floor")
    starts = _indptr(nbytes)
    if int(starts[-1]) > buffer.numel():
        raise PackRefused(f"packed mask needs {int(starts[-1])} bytes, the buffer holds {buffer.numel()}")
    src = _indptr(cells)
    flat = step_mask.reshape(-1).to(dev)
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.long, device=dev)
    for b in range(batch.bs):
        n, lo = int(cells[b]), int(src[b])
        bits = torch.zeros(int(nbytes[b]) * 8, dtype=torch.long, device=dev)
        bits[:n] = flat[lo:lo + n].view(torch.uint8).long()
        packed = (bits.view(-1, 8) * weights).sum(1).to(torch.uint8)
        buffer[int(starts[b]):int(starts[b + 1])] = packed
    return PackedView(buffer, starts, plan=_model_plan(config, batch, step_mask, dev))


def _model_plan(config: Config, batch: Batch, step_mask: torch.Tensor, dev) -> list[PlanRead]:
    """What the model hands FlashInfer's plan: each request's d query rows, its prefix and draft tokens' KV."""
    d = config.d
    kv_lens = torch.tensor(batch.seq_lens, dtype=torch.int32, device=dev) + d
    kv_indptr = _indptr(kv_lens).to(torch.int32)
    slots = pool_slots(batch.bs)
    kv_indices = torch.tensor([kv_slot(slots[b], t, plan_kv_span(config)) for b in range(batch.bs)
                               for t in range(int(kv_lens[b]))], dtype=torch.int32, device=dev)
    arrays = {"qo_indptr": torch.arange(0, (batch.bs + 1) * d, d, dtype=torch.int32, device=dev),
              "kv_indptr": kv_indptr, "kv_lens": kv_lens, "kv_indices": kv_indices,
              "kv_last_page_len": torch.ones(batch.bs, dtype=torch.int32, device=dev), "custom_mask": step_mask}
    return [PlanRead("model plan", name, name, values) for name, values in arrays.items()]


class ModelServerReader:
    """The readers over one server's life: graphs captured once over the mask every step reuses.

    The model's readers keep no offsets between batches, so a batch reads here
    what it reads fresh; a target whose backend keeps state must agree with it.
    """

    def __init__(self, mask, config: Config, pool: int):
        self.mask, self.config = mask, config
        placeholder = logical_size(TreeMaskMode.FULL_MASK, [capture_seq_len(config)] * mask.max_bs, config.d)
        mask.buffer[:placeholder].fill_(True)  # the captures' placeholder, written once at start-up

    def eager(self, batch: Batch, step) -> ReaderView:
        return model_read_eager(self.config, batch, step.tree_mask)

    def replay(self, batch: Batch, step) -> ReaderView:
        buffer = self.mask.buffer
        if not step.reused:
            n = step.tree_mask.numel()
            buffer[:n].copy_(step.tree_mask.to(buffer.device).view(-1))
        return _view(self.config, batch, buffer, captured_bs(batch.bs, self.mask.max_bs))
