"""The embedded model of SGLang's fixed design: no SGLang needed.

Allocation for the captured max_bs, ``fits(bs) = bs <= max_bs``, the wrapper's
fill rules and per-batch fallback, the trivial (d = 1) path, and a torch tree
kernel that computes addresses the way the device kernel does (block start,
row stride) -- deliberately *not* the oracle's way, so the two can disagree.
"""

from __future__ import annotations

import msgspec
import torch

import harness
from harness import readers
from harness.config import Batch, Config
from harness.kernel_call import KernelCall, aux_reach, guarded_write
from harness.layouts import TreeMaskMode, logical_size
from harness.outputs import StepOutput
from harness.shadow import ShadowHeap
from harness.trees import tree_tensors


class VerifyMask(msgspec.Struct, frozen=True):
    """A preallocated verify mask: the buffer and the layout it was sized for.

    Frozen for the reason SGLang's is: ``max_bs`` must never go stale against
    ``buffer``; resizing means a new struct.
    """

    buffer: torch.Tensor
    mode: TreeMaskMode
    max_bs: int
    is_read: bool = True


def reusable_buffer(target, mask, bs: int):
    """The call-site decision: the preallocated buffer if this batch fits, else None.

    This is the only place the embedded model decides between reuse and fallback.
    """
    if mask is not None and target.fits(mask, bs):
        return mask.buffer
    return None


class ReferenceTarget:
    name = "reference"

    # -- seams ---------------------------------------------------------------
    def numel(self, mode: TreeMaskMode, bs: int, d: int, max_context_len: int) -> int:
        if mode == TreeMaskMode.QLEN_ONLY:
            return bs * d * d
        if mode == TreeMaskMode.FULL_MASK:
            return bs * d * (max_context_len + d)
        raise ValueError(f"{mode.name} is not preallocated")

    def fits(self, mask: VerifyMask, bs: int) -> bool:
        # numel is bs * per-request cells, and per-request cells are fixed at
        # allocation (FULL_MASK's already span max_context_len): max_bs bounds it.
        return bs <= mask.max_bs

    def fill_prefix(self, mask: VerifyMask, reused: bool) -> bool:
        return mask.is_read

    def kernel(self, call: KernelCall) -> None:
        _tree_kernel(call)

    # -- composite -----------------------------------------------------------
    def allocate(self, config: Config, heap: ShadowHeap | None) -> VerifyMask:
        n = self.numel(config.mode, config.max_bs, config.d, config.max_context_len)
        if heap is None:
            buffer = torch.empty(n, dtype=torch.bool, device="meta")
        else:
            buffer = heap.alloc("tree_mask", n, torch.bool)
        return VerifyMask(buffer, config.mode, config.max_bs, config.is_read)

    def verify(self, mask, config: Config, batch: Batch, heap: ShadowHeap) -> StepOutput:
        buf = reusable_buffer(self, mask, batch.bs)
        if config.trivial:
            return self._trivial(buf, batch, heap)
        d, bs = config.d, batch.bs
        mode = mask.mode if mask is not None else config.mode
        fill = self.fill_prefix(mask, buf is not None) if mask is not None else True
        if mode == TreeMaskMode.QLEN_ONLY:
            fill = True
        if buf is not None:
            tree_mask = buf
            if fill:
                tree_mask.fill_(True)
        else:
            n = logical_size(mode, batch.seq_lens, d)
            tree_mask = heap.alloc("tree_mask", n, torch.bool, fill=True if fill else None)
        sel, par = tree_tensors(config, batch, heap.device)
        zone = aux_reach(d)  # wide enough that guarded_write uses these in place
        call = KernelCall(
            parent_list=par, top_scores_index=sel,
            seq_lens=torch.tensor(batch.seq_lens, dtype=torch.long, device=heap.device),
            tree_mask=tree_mask,
            positions=heap.alloc("positions", bs * d, torch.long, redzone_cells=zone),
            retrieve_index=heap.alloc("retrieve_index", (bs, d), torch.long, fill=-1, redzone_cells=zone),
            retrieve_next_token=heap.alloc("retrieve_next_token", (bs, d), torch.long, fill=-1,
                                           redzone_cells=zone),
            retrieve_next_sibling=heap.alloc("retrieve_next_sibling", (bs, d), torch.long, fill=-1,
                                             redzone_cells=zone),
            topk=config.topk, spec_steps=config.spec_steps, d=d, mode=mode, heap=heap,
        )
        guarded_write(self.kernel, call, list(batch.seq_lens))
        return StepOutput(call.tree_mask, call.positions, call.retrieve_index,
                          call.retrieve_next_token, call.retrieve_next_sibling, reused=buf is not None)

    def _trivial(self, buf, batch: Batch, heap: ShadowHeap) -> StepOutput:
        bs = batch.bs
        if buf is not None:
            # Every position of a one-node tree is visible: all-True is right in either layout.
            buf.fill_(True)
            custom_mask = buf
        else:
            custom_mask = heap.alloc("tree_mask", sum(batch.seq_lens) + bs, torch.bool, fill=True)
        dev = heap.device
        return StepOutput(
            custom_mask,
            torch.tensor(batch.seq_lens, dtype=torch.long, device=dev),
            torch.arange(bs, dtype=torch.long, device=dev).view(bs, 1),
            torch.full((bs, 1), -1, dtype=torch.long, device=dev),
            torch.full((bs, 1), -1, dtype=torch.long, device=dev),
            reused=buf is not None,
        )

    # -- readers (harness.readers; seams of reader-agreement and packed-mask) --
    def read_eager(self, config: Config, batch: Batch, step: StepOutput):
        return readers.model_read_eager(config, batch, step.tree_mask)

    def read_replay(self, mask: VerifyMask, config: Config, batch: Batch, step: StepOutput):
        return readers.model_read_replay(mask, config, batch, step.tree_mask, step.reused)

    def pack_mask(self, config: Config, batch: Batch, step_mask: torch.Tensor, buffer: torch.Tensor):
        return readers.model_pack(config, batch, step_mask, buffer)

    def versions(self) -> dict[str, str]:
        return {"reference": harness.__version__, "torch": torch.__version__}


def _tree_kernel(call: KernelCall) -> None:
    """The tree kernel in torch, vectorized over (request, node).

    Addresses follow the device kernel: a request's block starts at
    ``block_start`` and its rows are ``row_stride`` apart; the kernel writes
    only the d tree columns of each row (the prefix is the wrapper's fill).
    """
    sel, par, seq = call.top_scores_index, call.parent_list, call.seq_lens
    d, topk, dev = call.d, call.topk, seq.device
    bs = seq.numel()
    # Parent node of nodes 1..d-1: 0 for the root, -1 when the parent was not selected.
    slot = torch.div(sel, topk, rounding_mode="floor")
    if par.shape[1] > 0:
        parent_cid = par.gather(1, slot.clamp(max=par.shape[1] - 1))
    else:
        parent_cid = torch.full_like(sel, -2)
    match = sel.unsqueeze(1) == parent_cid.unsqueeze(2)  # [b, child, candidate]
    found_at = match.to(torch.int8).argmax(dim=2) + 1
    parent = torch.where(slot == 0, torch.zeros_like(sel),
                         torch.where(match.any(dim=2), found_at, torch.full_like(sel, -1)))
    parent = torch.cat([torch.full((bs, 1), -1, dtype=torch.long, device=dev), parent], dim=1)

    # Walk every node up to the root (or a missing parent), at most spec_steps hops.
    visible = torch.zeros(bs, d, d, dtype=torch.bool, device=dev)
    visible[:, :, 0] = True
    cur = torch.arange(d, device=dev).expand(bs, d).clone()
    active = cur > 0
    depth = torch.zeros(bs, d, dtype=torch.long, device=dev)
    rows = torch.arange(d, device=dev).expand(bs, d)
    bidx = torch.arange(bs, device=dev).unsqueeze(1).expand(bs, d)
    for _ in range(call.spec_steps):
        if not bool(active.any()):
            break
        visible[bidx[active], rows[active], cur[active]] = True
        depth += active.long()
        nxt = parent.gather(1, cur)
        active = active & (nxt > 0)
        cur = torch.where(active, nxt, cur)

    # Cell addresses: block start + row * row_stride + (prefix) + column.
    prefix_sum = torch.cumsum(seq, 0) - seq
    mode = call.mode
    if mode == TreeMaskMode.FULL_MASK:
        start = d * prefix_sum + d * d * torch.arange(bs, device=dev)
        stride, skip = seq + d, seq
    else:
        start = d * d * torch.arange(bs, device=dev)
        stride, skip = torch.full_like(seq, d), torch.zeros_like(seq)
    x = torch.arange(d, device=dev)
    idx = (start.view(bs, 1, 1) + x.view(1, d, 1) * stride.view(bs, 1, 1)
           + skip.view(bs, 1, 1) + x.view(1, 1, d))
    call.store(call.tree_mask, idx.flatten(), visible.flatten())
    call.store(call.positions, torch.arange(bs * d, device=dev), (depth + seq.view(bs, 1)).flatten())

    flat = torch.arange(bs * d, device=dev)
    call.store(call.retrieve_index, flat, flat)
    # Children are linked in ascending order: first child, then next larger sibling.
    child = torch.arange(1, d, device=dev).expand(bs, d - 1)
    p = parent[:, 1:]
    linked = p >= 0
    same = (p.unsqueeze(2) == p.unsqueeze(1)) & linked.unsqueeze(2) & linked.unsqueeze(1)
    later = child.unsqueeze(2) < child.unsqueeze(1)
    is_first = linked & ~(same & ~later & ~torch.eye(d - 1, dtype=torch.bool, device=dev)).any(dim=2)
    sib_cand = torch.where(same & later, child.unsqueeze(1).expand(bs, d - 1, d - 1),
                           torch.full((bs, d - 1, d - 1), d, device=dev))
    next_sib = sib_cand.amin(dim=2)
    base = (torch.arange(bs, device=dev) * d).view(bs, 1)
    call.store(call.retrieve_next_token, (base + p)[is_first], child[is_first])
    has_sib = linked & (next_sib < d)
    call.store(call.retrieve_next_sibling, (base + child)[has_sib], next_sib[has_sib])
