"""The mask's readers: where attention finds request b's rows after the writer is done.

The writer lays the verify mask out in one place (``layouts``); attention reads it
through its own index arithmetic. Two readers of SGLang 0.5.23 (DESIGN.md 1b):

- the Triton attention backend walks a FULL_MASK through ``mask_indptr``, request
  b's rows being ``mask[indptr[b]:indptr[b+1]]``, in its eager target-verify
  metadata and in its cuda-graph replay, where the step's mask is first copied
  into the backend's own preallocated buffer;
- FlashInfer's cuda-graph verify packs the mask to bits (row b's kv_len_b * d
  cells, LSB first, at byte ``packed_indptr[b]``) into its preallocated
  custom-mask buffer, refusing on the host a batch whose total does not fit.

This module holds what every target hands back from those seams and the
embedded model of the readers (used by ``reference``), written from that meaning:
request b reads d rows of s_b + d columns, the requests one after another.
Readers only read read masks, so the model -- like the servers that run these
readers -- works in FULL_MASK.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.config import Batch, Config
from harness.layouts import TreeMaskMode, logical_size


@dataclass
class ReaderView:
    """What one reader reads: request b's cells are ``mask[indptr[b]:indptr[b+1]]``."""

    mask: torch.Tensor
    indptr: torch.Tensor  # at least bs + 1 cell offsets into ``mask``
    #: the graph's batch size when a replay padded the batch up to it (None: eager)
    captured_bs: int | None = None


@dataclass
class PackedView:
    """A bit-packed mask: request b's bytes start at ``buffer[indptr[b]]``."""

    buffer: torch.Tensor  # uint8, the whole preallocated packed buffer
    indptr: torch.Tensor  # bs + 1 byte offsets, as the reader will read them


class PackRefused(AssertionError):
    """The packer's host-side check refused a batch whose packed mask does not fit.

    An AssertionError because that is what SGLang's check raises; a target's
    ``pack_mask`` refuses with an AssertionError of either kind.
    """


def reader_config(config: Config) -> Config:
    """The config a reader sees: the same deployment with its mask read, in FULL_MASK.

    Both readers exist only for read masks on CUDA, where SGLang's default read
    layout is FULL_MASK; a QLEN_ONLY case is run in the layout the readers meet.
    """
    if config.mode == TreeMaskMode.FULL_MASK and config.is_read:
        return config
    return Config(TreeMaskMode.FULL_MASK, config.max_bs, config.max_context_len, config.num_draft_tokens,
                  config.topk, config.spec_steps, True)


def capture_seq_len(config: Config) -> int:
    """seq_len of every request while a cuda graph is captured (SGLang fills 1).

    Capped at the context limit: a deployment whose context is shorter than
    the fill could not have captured at all.
    """
    return min(1, config.max_context_len)


def captured_bs(bs: int, max_bs: int) -> int:
    """The captured graph a batch of ``bs`` replays in: the smallest captured size >= bs.

    Modelled on a typical capture list (1, 2, 4, 8, ... and max_bs itself); a
    replay pads the batch up to it with requests at the fill length.
    """
    size = 1
    while size < bs:
        size *= 2
    return min(size, max_bs)


# -- the embedded model --------------------------------------------------------

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
