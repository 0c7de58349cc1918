"""The embedded model of each allocating backend's cuda-graph set-up, up to its verify-mask call.

A model of the backends, not of the facts ``allocation-soundness`` checks them
against (``vmfuzz.harness.model.allocation``): each backend here takes what a server
was started with the way its own ``__init__`` does (the model's context length
from the model config, the draft width from the speculative config, whether
it is a draft runner from its runner), then its ``init_cuda_graph_state(max_bs, ...)`` passes those
attributes, and its own literal ``is_read``, to the allocator. The allocator
model decides, like SGLang's, whether a mask is made and in which layout, and
sizes it through ``target.numel`` so a sizing variant reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmfuzz.harness.model.allocation import ALLOCATING_BACKENDS, AllocationCall, ServerNumbers
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.targets.reference.mask import VerifyMask


@dataclass(frozen=True)
class _Server:
    """The server-wide configuration a backend's ``__init__`` reads."""

    model_context_len: int
    speculative_num_draft_tokens: int
    speculative_eagle_topk: int
    speculative_num_steps: int
    is_draft_worker: bool = False  # the target model's runner

    @classmethod
    def started_with(cls, numbers: ServerNumbers) -> "_Server":
        return cls(numbers.context_len, numbers.num_draft_tokens, numbers.topk, numbers.spec_steps)


def _backend_state(backend: str, server: _Server) -> dict:
    """What each backend's ``__init__`` keeps for its set-up, derived its own way."""
    state = dict(is_draft_runner=server.is_draft_worker, skip_prefill=False,
                 max_context_len=server.model_context_len)
    if backend == "triton":
        state.update(num_draft_tokens=server.speculative_num_draft_tokens, is_read=True, dtype=torch.uint8)
    elif backend == "flashattention":
        # a tree's verify reads the mask; a topk-1 chain is causal and reads none
        state.update(num_draft_tokens=server.speculative_num_draft_tokens,
                     is_read=server.speculative_eagle_topk > 1, dtype=torch.bool)
    elif backend in ("flashmla", "trtllm_mla", "deepseek_v4", "deepseek_v4_hip_radix", "qwen_sparse"):
        # their verify kernels take the draft as extra query tokens and read no mask
        state.update(num_draft_tokens=server.speculative_num_draft_tokens, is_read=False, dtype=torch.bool)
    else:
        raise ValueError(f"unknown allocating backend {backend!r} (known: {', '.join(ALLOCATING_BACKENDS)})")
    return state


def _allocate(target, *, is_draft_runner: bool, skip_prefill: bool, max_bs: int, max_context_len: int,
              num_draft_tokens: int | None, is_read: bool, dtype: torch.dtype):
    """The allocator: no mask where nothing verifies; a read mask in the GPU's default layout
    (FULL_MASK), an unread one QLEN_ONLY; on the meta device, so any size is free."""
    if is_draft_runner or skip_prefill or not num_draft_tokens:
        return None
    mode = TreeMaskMode.FULL_MASK if is_read else TreeMaskMode.QLEN_ONLY
    n = target.numel(mode, max_bs, num_draft_tokens, max_context_len)
    return VerifyMask(torch.empty(n, dtype=dtype, device="meta"), mode, max_bs, is_read)


def model_allocation(target, backend: str, numbers: ServerNumbers) -> AllocationCall:
    """Backend ``backend`` of a server started with ``numbers`` sets up its graphs for the captured max_bs."""
    state = _backend_state(backend, _Server.started_with(numbers))
    max_bs = numbers.max_bs  # init_cuda_graph_state's own argument: the captured max_bs
    mask = _allocate(target, max_bs=max_bs, **state)
    return AllocationCall(backend, max_bs, state["max_context_len"], state["num_draft_tokens"], state["is_read"],
                          state["is_draft_runner"], state["skip_prefill"], state["dtype"], mask)
