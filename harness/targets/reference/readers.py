"""The embedded model of the mask's readers (Triton's mask_indptr, FlashInfer's packing).

Written from the layout's meaning: request b reads d rows of s_b + d columns,
the requests one after another. Readers only read read masks, so the model --
like the servers that run these readers -- works in FULL_MASK.
"""

from __future__ import annotations

import torch

from harness.model.config import Batch, Config
from harness.model.layouts import TreeMaskMode, logical_size
from harness.model.readers import PackedView, PackRefused, ReaderView, capture_seq_len, captured_bs


def _rows_per_request(batch: Batch, d: int, device) -> torch.Tensor:
    """Cells of each request's block: d rows of its prefix plus the d draft columns."""
    seq = torch.tensor(batch.seq_lens, dtype=torch.long, device=device)
    return d * (seq + d)


def _indptr(lengths: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(lengths.numel() + 1, dtype=torch.long, device=lengths.device)
    out[1:] = torch.cumsum(lengths, 0)
    return out


def model_read_eager(config: Config, batch: Batch, step_mask: torch.Tensor) -> ReaderView:
    """Eager verify reads the step's own mask where it lies."""
    return ReaderView(step_mask, _indptr(_rows_per_request(batch, config.d, step_mask.device)))


def model_read_replay(mask, config: Config, batch: Batch, step_mask: torch.Tensor, reused: bool) -> ReaderView:
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
    return ReaderView(buffer, _indptr(_rows_per_request(batch, config.d, buffer.device)),
                      captured_bs(batch.bs, mask.max_bs))


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
    return PackedView(buffer, starts)


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
        return ReaderView(buffer, _indptr(_rows_per_request(batch, self.config.d, buffer.device)),
                          captured_bs(batch.bs, self.mask.max_bs))
