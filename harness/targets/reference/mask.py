"""The embedded model's verify mask: a preallocated buffer and the layout it was sized for."""

from __future__ import annotations

import msgspec
import torch

from vmfuzz.harness.model.layouts import TreeMaskMode


class VerifyMask(msgspec.Struct, frozen=True):
    """A preallocated verify mask: the buffer and the layout it was sized for.

    Frozen for the reason SGLang's is: ``max_bs`` must never go stale against
    ``buffer``; resizing means a new struct.
    """

    buffer: torch.Tensor
    mode: TreeMaskMode
    max_bs: int
    is_read: bool = True
