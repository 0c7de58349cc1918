"""The embedded model of SGLang's fixed design: no SGLang needed.

Allocation for the captured max_bs, ``fits(bs) = bs <= max_bs``, the wrapper's
fill rules and per-batch fallback, the trivial (d = 1) path, and a torch tree
kernel that computes addresses the way the device kernel does (block start,
row stride) -- deliberately *not* the oracle's way, so the two can disagree.
"""

from __future__ import annotations

import torch

import vmfuzz.harness
from vmfuzz.harness.targets.reference import readers
from vmfuzz.harness.targets.reference.mask import VerifyMask
from vmfuzz.harness.guard.chain_write import ChainCall, ChainInputs, ChainOutput, guarded_chain_write
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.guard.tree_write import KernelCall, aux_reach, guarded_write
from vmfuzz.harness.model.layouts import TreeMaskMode, logical_size
from vmfuzz.harness.model.outputs import StepOutput
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.trees import draft_tokens, tree_tensors, verified_token


def reusable_buffer(target, mask, bs: int, site: str = "eagle"):
    """The call-site decision: the preallocated buffer if this batch fits, else None.

    This is the only place the embedded model decides between reuse and fallback,
    for every call site; ``site_fits`` is how the call site ``site`` asks ``fits``.
    """
    if site == "frozen_kv_mtp":
        # The frozen-KV MTP draft hands the wrapper no buffer: it always falls back.
        return None
    site_fits = getattr(target, "site_fits", None)
    if mask is not None and (site_fits(site, mask, bs) if site_fits else target.fits(mask, bs)):
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

    def site_fits(self, site: str, mask: VerifyMask, bs: int) -> bool:
        # Every call site asks the mask the same question; a variant makes one ask another.
        return self.fits(mask, bs)

    def chain_kernel(self, call: ChainCall) -> None:
        _chain_kernel(call)

    # -- composite -----------------------------------------------------------
    def allocate(self, config: Config, heap: ShadowHeap | None) -> VerifyMask:
        n = self.numel(config.mode, config.max_bs, config.d, config.max_context_len)
        if heap is None:
            buffer = torch.empty(n, dtype=torch.bool, device="meta")
        else:
            buffer = heap.alloc("tree_mask", n, torch.bool)
        return VerifyMask(buffer, config.mode, config.max_bs, config.is_read)

    def verify(self, mask, config: Config, batch: Batch, heap: ShadowHeap) -> StepOutput:
        site = config.call_site
        buf = reusable_buffer(self, mask, batch.bs, site)
        if site == "chain":
            return self._chain_site(buf, config, batch, heap)
        if config.trivial and site == "eagle":
            return self._trivial(buf, batch, heap)
        # The pp rebuild mirrors the EAGLE tail: the same wrapper, the same fill
        # rules; with no mask it takes the device's default layout, which a
        # config names as its mode.
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
        # The wrapper's verify tokens: each request's verified token, then its drafted ones as handed in.
        bonus, drafted = draft_tokens(config, batch, heap.device)
        return StepOutput(call.tree_mask, call.positions, call.retrieve_index,
                          call.retrieve_next_token, call.retrieve_next_sibling, reused=buf is not None,
                          draft_token=torch.cat([bonus.view(bs, 1), drafted], 1).flatten())

    def _chain_site(self, buf, config: Config, batch: Batch, heap: ShadowHeap) -> StepOutput:
        inputs = _chain_inputs_for(config, batch, heap.device)
        out = self.chain_write(inputs, buf, heap)
        return StepOutput(out.tree_mask, out.positions, out.retrieve_index, out.retrieve_next_token,
                          out.retrieve_next_sibling, reused=buf is not None, draft_token=out.tokens)

    def chain_write(self, inputs: ChainInputs, buffer, heap: ShadowHeap, *, with_mrope: bool = True):
        """The chain writer's entry (SGLang: ``build_chain_tree``): reuse ``buffer`` or allocate bs*w*w."""
        bs, w = inputs.draft_tokens.shape[0], inputs.draft_tokens.shape[1] + 1
        if buffer is not None and buffer.numel() < bs * w * w:
            raise AssertionError(f"chain writer: {buffer.numel()}-cell buffer for {bs * w * w} cells")
        mask = buffer if buffer is not None else heap.alloc("tree_mask", bs * w * w, torch.bool)
        zone = aux_reach(w)
        call = ChainCall(
            inputs.bonus_tokens, inputs.draft_tokens, inputs.seq_lens, mask,
            heap.alloc("positions", bs * w, torch.long, redzone_cells=zone),
            heap.alloc("retrieve", (3, bs, w), torch.long, redzone_cells=3 * bs * w + 16),
            heap.alloc("tokens", bs * w, torch.long, redzone_cells=zone),
            inputs.req_pool_indices, inputs.req_to_token,
            heap.alloc("out_cache_loc", bs * w, torch.long, redzone_cells=zone),
            heap.alloc("mrope", (3, bs * w), torch.long, redzone_cells=3 * bs * w + 16) if with_mrope else None,
            w, heap)
        if bs:
            guarded_chain_write(self.chain_kernel, call)
        r = call.retrieve
        return ChainOutput(call.tree_mask, call.positions, r[0], r[1], r[2], call.tokens, call.out_cache_loc,
                           call.mrope, reused=buffer is not None)

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
            # The one node is the verified token itself.
            draft_token=torch.tensor([verified_token(b) for b in range(bs)], dtype=torch.long, device=dev),
        )

    # -- readers (vmfuzz.harness.model.readers; seams of reader-agreement and packed-mask) --
    def read_eager(self, config: Config, batch: Batch, step: StepOutput, heap: ShadowHeap):
        return readers.model_read_eager(config, batch, step.tree_mask)

    def read_replay(self, mask: VerifyMask, config: Config, batch: Batch, step: StepOutput, heap: ShadowHeap):
        return readers.model_read_replay(mask, config, batch, step.tree_mask, step.reused)

    def read_window_eager(self, config: Config, batch: Batch, step: StepOutput, heap: ShadowHeap, window: int):
        return readers.model_read_eager(config, batch, step.tree_mask, window)

    def read_window_replay(self, mask: VerifyMask, config: Config, batch: Batch, step: StepOutput, heap: ShadowHeap,
                           window: int):
        return readers.model_read_replay(mask, config, batch, step.tree_mask, step.reused, window)

    def reader_session(self, mask: VerifyMask, config: Config, pool: int, heap: ShadowHeap):
        """The readers a server keeps for a case's batches (``readers.ModelServerReader``)."""
        return readers.ModelServerReader(mask, config, pool)

    def pack_mask(self, config: Config, batch: Batch, step_mask: torch.Tensor, buffer: torch.Tensor):
        return readers.model_pack(config, batch, step_mask, buffer)

    def shape_constants(self):
        """The model's own widths: the deep boundary corpus's sizes for the reference."""
        from vmfuzz.harness.model.shapes import model_constants
        return model_constants()

    def versions(self) -> dict[str, str]:
        return {"reference": vmfuzz.harness.__version__, "torch": torch.__version__}

    # -- routers and allocation sites (the embedded models beside this file) --
    def route(self, router: str, spec_mode: str, children: dict, context_len: int):
        """The router a server would build over ``children``: what it hands out and reports."""
        from vmfuzz.harness.model.routing import check_args
        from vmfuzz.harness.targets.reference.routing import model_route
        check_args(router, spec_mode, children)
        return model_route(router, spec_mode, children, context_len)

    def verify_routed(self, routing, config: Config, batch: Batch, heap: ShadowHeap) -> StepOutput:
        """One verify step through the call site with ``routing.backend`` as the attention backend."""
        return self.verify(routing.backend.verify_mask, config, batch, heap)

    def tbo_replay(self, config: Config, batch: Batch):
        """What TBO hands its overlap children to set up a TARGET_VERIFY cuda-graph replay."""
        from vmfuzz.harness.targets.reference.routing import model_tbo_replay
        return model_tbo_replay(config.d, batch.seq_lens)

    def allocating_backends(self) -> dict[str, str | None]:
        """Allocation sites this target drives (None) or why it cannot (a reason)."""
        from vmfuzz.harness.model.allocation import ALLOCATING_BACKENDS
        return {name: None for name in ALLOCATING_BACKENDS}

    def allocation_call(self, backend: str, numbers):
        from vmfuzz.harness.targets.reference.allocation import model_allocation
        return model_allocation(self, backend, numbers)


def _chain_inputs_for(config: Config, batch: Batch, device) -> ChainInputs:
    from vmfuzz.harness.guard.chain_write import chain_inputs
    return chain_inputs(batch.seq_lens, config.d, config.max_context_len, device)


def _chain_kernel(call: ChainCall) -> None:
    """The chain writer in torch: node x of a chain sees the root and nodes 1..x.

    Cell addresses follow the QLEN_ONLY layout (block b at b*w*w, rows w apart);
    the retrieve planes are bs*w cells apart, as SGLang stacks them.
    """
    bs, w, dev = call.bs, call.width, call.seq_lens.device
    b = torch.arange(bs, device=dev).view(bs, 1)
    x = torch.arange(w, device=dev).view(1, w)
    node = (b * w + x).flatten()  # flat (request, node) index
    pos = (call.seq_lens.view(bs, 1) + x).flatten()  # a chain node's depth is its index
    call.store(call.tokens, node, torch.cat([call.bonus_tokens.view(bs, 1), call.draft_tokens], 1).flatten())
    call.store(call.positions, node, pos)
    plane = bs * w
    call.store(call.retrieve, node, node)
    call.store(call.retrieve, plane + node, torch.where(x + 1 < w, x + 1, -1).expand(bs, w).flatten())
    call.store(call.retrieve, 2 * plane + node, -1)
    if call.out_cache_loc is not None:
        rows = call.req_pool_indices.view(bs, 1).expand(bs, w).flatten()
        call.store(call.out_cache_loc, node, call.req_to_token[rows, pos].long())
    if call.mrope is not None:
        for axis in range(3):
            call.store(call.mrope, axis * plane + node, pos)
    row, col = torch.meshgrid(torch.arange(w, device=dev), torch.arange(w, device=dev), indexing="ij")
    cells = (b.view(bs, 1, 1) * w * w + row * w + col).flatten()
    call.store(call.tree_mask, cells, (col <= row).expand(bs, w, w).flatten())


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
    # d = 1 (the pp rebuild's one-node tree) has no candidates to search.
    found_at = match.to(torch.int8).argmax(dim=2) + 1 if sel.shape[1] else torch.zeros_like(sel)
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
    next_sib = sib_cand.amin(dim=2) if d > 1 else torch.full((bs, 0), d, device=dev)
    base = (torch.arange(bs, device=dev) * d).view(bs, 1)
    call.store(call.retrieve_next_token, (base + p)[is_first], child[is_first])
    has_sib = linked & (next_sib < d)
    call.store(call.retrieve_next_sibling, (base + child)[has_sib], next_sib[has_sib])
