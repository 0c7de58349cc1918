"""The chain writer's launch: its arguments, and the guarded write around it.

SGLang writes a topk-1 chain (QLEN_ONLY, every draft step kept) with
``build_chain_tree`` instead of the tree kernel. It writes the same
``tree_mask`` (``bs * w * w`` cells, w = num_draft_tokens), and besides the
positions and retrieve arrays it fills the verify tokens, the KV-cache slots
of the draft tokens and, for M-RoPE models, three rows of positions. Every one
of those buffers is swapped for a redzoned stand-in for the launch, exactly as
``kernel_call.guarded_write`` does for the tree kernel.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from vmfuzz.harness.guard.tree_write import KernelCall
from vmfuzz.harness.guard.shadow import ShadowHeap

#: Buffers the chain writer writes, in the order it takes them.
CHAIN_MUTABLE = ("tree_mask", "positions", "retrieve", "tokens", "out_cache_loc", "mrope")


@dataclass(frozen=True)
class ChainCall:
    """One launch of the chain writer.

    ``retrieve`` is (3, bs, w): retrieve_index, retrieve_next_token and
    retrieve_next_sibling stacked, as SGLang allocates them. ``launch`` is what
    the real launch was given (grid, named arguments), for a target that
    relaunches SGLang's kernel; a model ignores it.
    """

    bonus_tokens: torch.Tensor
    draft_tokens: torch.Tensor
    seq_lens: torch.Tensor
    tree_mask: torch.Tensor
    positions: torch.Tensor
    retrieve: torch.Tensor
    tokens: torch.Tensor
    req_pool_indices: torch.Tensor | None
    req_to_token: torch.Tensor | None
    out_cache_loc: torch.Tensor | None
    mrope: torch.Tensor | None
    width: int
    heap: ShadowHeap
    launch: Any = field(default=None, compare=False)

    @property
    def bs(self) -> int:
        return self.seq_lens.numel()

    @property
    def d(self) -> int:
        return self.width

    def replace(self, **changes) -> "ChainCall":
        return dataclasses.replace(self, **changes)

    store = KernelCall.store
    shifted = KernelCall.shifted


def chain_reach(call: ChainCall) -> dict[str, int]:
    """Redzone width per buffer: the batch's shortfall against the buffer plus a block.

    A reused mask larger than the batch needs gets the spare cells of its own
    tail as slack; a short one (a capacity bug let the batch reuse it) gets a
    zone covering every cell the batch would write past it.
    """
    w, bs = call.width, call.bs
    out = {name: bs * w + 2 * w + 16 for name in CHAIN_MUTABLE}
    out["retrieve"] = 3 * bs * w + 16
    out["mrope"] = 3 * bs * w + 16
    out["tree_mask"] = max(0, bs * w * w - call.tree_mask.numel()) + w * w + 16
    return out


def guarded_chain_write(kernel: Callable[[ChainCall], None], call: ChainCall) -> None:
    tensors = {name: getattr(call, name) for name in CHAIN_MUTABLE if getattr(call, name) is not None}
    reach = chain_reach(call)
    call.heap.run_kernel(lambda standins: kernel(call.replace(**standins)), tensors,
                         {name: reach[name] for name in tensors})


@dataclass
class ChainOutput:
    """What ``build_chain_tree`` returns, on the host."""

    tree_mask: torch.Tensor
    positions: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    tokens: torch.Tensor
    out_cache_loc: torch.Tensor | None
    mrope: torch.Tensor | None
    reused: bool

    @classmethod
    def of(cls, outputs, buffer) -> "ChainOutput":
        mask, positions, ri, rnt, rns, tokens, loc, mrope = outputs
        host = lambda t: None if t is None else t.detach().to("cpu", copy=True)  # noqa: E731
        return cls(host(mask), host(positions), host(ri), host(rnt), host(rns), host(tokens), host(loc),
                   host(mrope), reused=buffer is not None and mask.data_ptr() == buffer.data_ptr())


@dataclass(frozen=True)
class ChainInputs:
    """What the draft stage and the KV pool hand the chain writer for one batch.

    Token ids and page-table entries are distinct per (request, node), so an
    output taken from the wrong row or column names where it came from.
    """

    bonus_tokens: torch.Tensor  # (bs,)
    draft_tokens: torch.Tensor  # (bs, w - 1)
    seq_lens: torch.Tensor  # (bs,)
    req_pool_indices: torch.Tensor  # (bs,): request b's row of req_to_token
    req_to_token: torch.Tensor  # (pool rows, max_context_len + w): token slot of each position


def chain_inputs(seq_lens, width: int, max_context_len: int, device) -> ChainInputs:
    bs = len(seq_lens)
    bonus = 1000 + torch.arange(bs, dtype=torch.long, device=device)
    draft = 2000 + torch.arange(bs * (width - 1), dtype=torch.long, device=device).view(bs, width - 1)
    # Requests sit in the pool in reverse order, one spare row first, so a
    # writer that indexes the table by b instead of req_pool_indices[b] differs.
    pool = 1 + torch.arange(bs - 1, -1, -1, dtype=torch.long, device=device)
    cols = max_context_len + width
    table = (100_000 * torch.arange(bs + 1, dtype=torch.int32, device=device).view(-1, 1)
             + torch.arange(cols, dtype=torch.int32, device=device).view(1, -1))
    return ChainInputs(bonus, draft, torch.tensor(list(seq_lens), dtype=torch.long, device=device), pool, table)
