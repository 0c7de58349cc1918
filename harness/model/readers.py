"""The mask's readers: where attention finds request b's rows after the writer is done.

The writer lays the verify mask out in one place (``layouts``); attention reads it
through its own index arithmetic. Two readers of SGLang 0.5.23 (docs/sglang-target.md, readers):

- the Triton attention backend walks a FULL_MASK through ``mask_indptr``, request
  b's rows being ``mask[indptr[b]:indptr[b+1]]``, in its eager target-verify
  metadata and in its cuda-graph replay, where the step's mask is first copied
  into the backend's own preallocated buffer;
- FlashInfer's cuda-graph verify packs the mask to bits (row b's kv_len_b * d
  cells, LSB first, at byte ``packed_indptr[b]``) into its preallocated
  custom-mask buffer, refusing on the host a batch whose total does not fit.

This module holds what every target hands back from those seams; the embedded
model of the readers is ``harness.targets.reference.readers``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.model.config import Config
from harness.model.layouts import TreeMaskMode


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
