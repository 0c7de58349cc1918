"""The embedded model of each allocating backend's call to ``maybe_create_verify_mask``."""

from __future__ import annotations

import torch

from harness.model.allocation import ALLOCATING_BACKENDS, AllocationCall, ServerNumbers, reads_mask
from harness.model.layouts import TreeMaskMode
from harness.targets.reference.mask import VerifyMask


def model_allocation(target, backend: str, numbers: ServerNumbers) -> AllocationCall:
    """The embedded model of each backend's call: the server's own numbers, ``is_read`` by ``reads_mask``.

    The mask is built the way SGLang's allocator builds it (GPU default: a read
    mask is FULL_MASK, an unread one QLEN_ONLY), through ``target.numel`` so a
    sizing variant reaches it.
    """
    if backend not in ALLOCATING_BACKENDS:
        raise ValueError(f"unknown allocating backend {backend!r} (known: {', '.join(ALLOCATING_BACKENDS)})")
    is_read = reads_mask(backend, numbers.topk)
    dtype = torch.uint8 if backend == "triton" else torch.bool
    mode = TreeMaskMode.FULL_MASK if is_read else TreeMaskMode.QLEN_ONLY
    n = target.numel(mode, numbers.max_bs, numbers.num_draft_tokens, numbers.context_len)
    mask = VerifyMask(torch.empty(n, dtype=dtype, device="meta"), mode, numbers.max_bs, is_read)
    return AllocationCall(backend, numbers.max_bs, numbers.context_len, numbers.num_draft_tokens, is_read,
                          False, False, dtype, mask)
