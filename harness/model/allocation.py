"""Allocation sites: the attention backends that preallocate the verify mask.

Each allocating backend calls ``maybe_create_verify_mask`` in its cuda-graph
set-up with its own bounds (docs/sglang-target.md, allocation sites). The mask is sized once, for
what the server was started with, so those bounds must cover what it runs: the
captured max_bs, the model's context length and the draft width
(``num_draft_tokens``); and ``is_read`` must say whether the backend's verify
attention actually reads the mask, because an unread mask is allocated in the
QLEN_ONLY layout a reader of FULL_MASK rows would misread.

This module holds the server's numbers, the record of one allocation call, and
the embedded model of each backend's call; the ``sglang`` target drives the
backends' real set-up code instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


#: The backends that call ``maybe_create_verify_mask`` (SGLang 0.5.23), by the
#: name this harness uses, with the ``--attention-backend`` names that build them.
ALLOCATING_BACKENDS: dict[str, tuple[str, ...]] = {
    "triton": ("triton",),
    "flashattention": ("fa3", "fa4"),
    "flashmla": ("flashmla",),
    "trtllm_mla": ("trtllm_mla",),
    "deepseek_v4": ("dsv4", "compressed"),
    "qwen_sparse": ("qsa",),
    # DeepSeek-V4 on ROCm: ``dsv4`` there builds this one instead
    "deepseek_v4_hip_radix": (),
}

#: Every ``--attention-backend`` SGLang 0.5.23 accepts; the rest own no verify
#: mask, so a verify step on them always takes the per-batch fallback.
SERVER_BACKENDS: tuple[str, ...] = (
    "triton", "torch_native", "flex_attention", "dsa", "nsa", "qsa", "dsv4", "compressed", "fa3", "fa4",
    "flashinfer", "llada2_cfg_flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla",
    "trtllm_mha", "hpc_ops", "minicpm_flashattn", "minicpm_flashinfer", "aiter", "wave", "intel_amx",
    "ascend", "intel_xpu",
)


def allocating_backend(server_name: str) -> str | None:
    """The allocation site a ``--attention-backend`` name builds, None when it allocates no mask."""
    for name, server_names in ALLOCATING_BACKENDS.items():
        if server_name in server_names:
            return name
    return None


def reads_mask(backend: str, topk: int) -> bool:
    """Does this backend's target-verify attention read the tree mask?

    triton always does; flashattention only for trees (topk > 1: a chain is
    causal, no mask needed; both its metadata paths extract the mask only then).
    The others run verify kernels that take no mask: flashmla handles every
    target-verify metadata branch itself with FlashMLA's kernel and never falls
    through to its FlashInfer-MLA parent's mask read; trtllm_mla excludes
    target verify from every parent dispatch and runs the trtllm-gen kernel;
    the DeepSeek-V4 backends' verify metadata never extracts the mask; the Qwen
    sparse backend verifies chains only (topk 1), through its sparse kernels.
    """
    if backend == "triton":
        return True
    if backend == "flashattention":
        return topk > 1
    return False


class AllocatorChose(Exception):
    """SGLang's allocator, asked for the server's verify mask, returned none or another layout.

    The harness never builds a mask of its own in its place: the call site would
    then reuse a buffer SGLang never hands out. The property that asked for the
    mask judges the choice (``vmfuzz.harness.properties.kit.allocated``).
    """

    def __init__(self, got: str | None, want: str, call: str):
        self.got, self.want, self.call = got, want, call
        made = "no mask" if got is None else f"a {got} mask"
        super().__init__(f"{call} returned {made}, where this server's verify mask is {want}")


#: The Triton backend's per-request index pointers, allocated once by its ``__init__`` for every batch
#: the request pool can hold (and read at TARGET_VERIFY beside the mask): bs + 1 offsets for up to
#: pool-size requests, so each needs pool + 1 entries whatever the code under test computes.
TRITON_INDPTRS = ("kv_indptr", "qo_indptr", "mask_indptr")
TRITON_INIT = "TritonAttnBackend.__init__"


def indptr_entries(pool: int) -> int:
    """Entries a per-request index pointer needs for a request pool ``pool`` deep."""
    return pool + 1


@dataclass(frozen=True)
class ServerNumbers:
    """What a server is started with that the mask must cover."""

    max_bs: int  # captured (cuda-graph) max batch size
    context_len: int  # the model's context length
    num_draft_tokens: int
    topk: int
    spec_steps: int

    @classmethod
    def of(cls, config) -> "ServerNumbers":
        return cls(config.max_bs, config.max_context_len, config.num_draft_tokens, config.topk, config.spec_steps)


@dataclass
class AllocationCall:
    """The arguments one backend passed to ``maybe_create_verify_mask``, and what it got."""

    backend: str
    max_bs: int
    max_context_len: int
    num_draft_tokens: Any
    is_read: bool
    is_draft_runner: bool
    skip_prefill: bool
    dtype: torch.dtype
    #: the VerifyMask the call produced (buffer on the meta device), None: no mask
    mask: Any

    def describe(self) -> str:
        return (f"max_bs={self.max_bs}, max_context_len={self.max_context_len}, "
                f"num_draft_tokens={self.num_draft_tokens}, is_read={self.is_read}")
