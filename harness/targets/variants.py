"""Known-bad variants: one bug class each, layered over any target with ``+NAME``.

A variant replaces one seam of a target instance (see ``protocol.Target``) with
a wrapper around the original. Because targets reach their seams through
``self``, the target's own call site -- SGLang's real one for ``sglang`` --
runs with the bug in place. The catalogue is what ``vmfuzz selftest`` and the
test suite prove every property set can catch.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch

from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.readers import capture_seq_len
from vmfuzz.harness.model.routing import Nest


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    seam: str
    #: wrap(original_seam) -> replacement seam, same signature
    wrap: Callable[[Callable], Callable]

    def layer(self, target):
        layered = copy.copy(target)
        setattr(layered, self.seam, self.wrap(getattr(target, self.seam)))
        layered.name = f"{target.name}+{self.name}"
        return layered


def _pr33127(fits):
    # The pre-#33127 policy: only QLEN_ONLY was capacity-checked, as if
    # FULL_MASK's per-request context slack also covered extra requests.
    def pre_fix_fits(mask, bs):
        return True if mask.mode == TreeMaskMode.FULL_MASK else fits(mask, bs)
    return pre_fix_fits


def _fits_off_by_one(fits):
    def fits_one_more(mask, bs):
        return fits(mask, bs - 1)
    return fits_one_more


def _fits_refuses_full(fits):
    # Over-cautious, never unsafe: a batch that fills the captured max_bs is
    # turned away, so it takes the per-batch fallback on every step.
    def fits_with_one_spare(mask, bs):
        return fits(mask, bs) and fits(mask, bs + 1)
    return fits_with_one_spare


def _full_without_draft_span(numel):
    def numel_short(mode, bs, d, max_context_len):
        if mode == TreeMaskMode.FULL_MASK:
            return bs * d * max_context_len
        return numel(mode, bs, d, max_context_len)
    return numel_short


def _unfilled_prefix(fill_prefix):
    def no_prefix_fill(mask, reused):
        if reused and mask.mode == TreeMaskMode.FULL_MASK:
            return False
        return fill_prefix(mask, reused)
    return no_prefix_fill


def _row_offset(kernel):
    def kernel_one_row_late(call):
        # Every row lands one QLEN row (d cells) after where it belongs.
        kernel(call.replace(tree_mask=call.shifted("tree_mask", call.d)))
    return kernel_one_row_late


def _pp_reuse_unchecked(site_fits):
    def pp_passes_buffer_always(site, mask, bs):
        # The pp rebuild hands the buffer over without asking fits, as if every
        # stage's batch were a captured one.
        return True if site == "pp" else site_fits(site, mask, bs)
    return pp_passes_buffer_always


def _chain_row_offset(chain_kernel):
    def chain_one_row_late(call):
        # The chain writer's mask rows land one row (w cells) after their start.
        chain_kernel(call.replace(tree_mask=call.shifted("tree_mask", call.width)))
    return chain_one_row_late


def _eager_indptr_without_draft_span(read_eager):
    def read_eager_short(config, batch, step, heap):
        # mask_indptr steps by d * s_b: the d draft columns of each row are forgotten,
        # so every later request reads from inside an earlier one's block.
        view = read_eager(config, batch, step, heap)
        d = config.d
        view.indptr = view.indptr - d * d * torch.arange(view.indptr.numel(), device=view.indptr.device)
        return view
    return read_eager_short


def _replay_stale_indptr(read_replay):
    def read_replay_stale(mask, config, batch, step, heap):
        # Replay leaves mask_indptr as capture filled it: every request at the fill length.
        view = read_replay(mask, config, batch, step, heap)
        per_request = config.d * (capture_seq_len(config) + config.d)
        view.indptr = per_request * torch.arange(view.indptr.numel(), device=view.indptr.device)
        return view
    return read_replay_stale


def _pack_msb_first(pack_mask):
    def pack_msb_first(config, batch, step_mask, buffer):
        # The right bytes in the right places, each with its bits in the opposite order.
        view = pack_mask(config, batch, step_mask, buffer)
        used = view.buffer[:int(view.indptr[batch.bs])]
        flipped = torch.zeros_like(used)
        for i in range(8):
            flipped |= ((used >> i) & 1) << (7 - i)
        used.copy_(flipped)
        return view
    return pack_msb_first


def _draft_token_off_by_one(verify):
    def verify_tokens_one_node_late(mask, config, batch, heap):
        # Node x carries node x + 1's token: the draft tokens gathered one place off.
        out = verify(mask, config, batch, heap)
        if out.draft_token is not None:
            out.draft_token = torch.roll(out.draft_token, -1)
        return out
    return verify_tokens_one_node_late


CATALOGUE: dict[str, Variant] = {v.name: v for v in (
    Variant("pr33127", "capacity check skips FULL_MASK: an eager batch past max_bs reuses the buffer "
            "(the regression fixed by SGLang PR #33127)", "fits", _pr33127),
    Variant("fits-off-by-one", "capacity check admits max_bs + 1 requests (bs <= max_bs + 1)",
            "fits", _fits_off_by_one),
    Variant("fits-refuses-full", "capacity check refuses a batch of exactly max_bs requests (bs < max_bs): "
            "safe, but that batch allocates per batch every step", "fits", _fits_refuses_full),
    Variant("full-no-draft-span", "FULL_MASK sizing forgets the draft columns: d*max_context_len per "
            "request instead of d*(max_context_len + d)", "numel", _full_without_draft_span),
    Variant("unfilled-prefix", "a reused FULL_MASK buffer's prefix columns are not refilled, so "
            "the previous step's cells leak into this one", "fill_prefix", _unfilled_prefix),
    Variant("row-offset", "tree kernel row offset error: every row is written d cells past its start",
            "kernel", _row_offset),
    Variant("pp-reuse-unchecked", "the pipeline-parallel rebuild passes the preallocated buffer without "
            "asking fits: an eager batch past max_bs writes past it", "site_fits", _pp_reuse_unchecked),
    Variant("chain-row-offset", "chain writer row offset error: every mask row is written w cells past "
            "its start", "chain_kernel", _chain_row_offset),
    Variant("eager-indptr-no-draft-span", "Triton eager verify's mask_indptr steps by d*s_b, forgetting the "
            "draft columns: later requests read inside earlier blocks", "read_eager",
            _eager_indptr_without_draft_span),
    Variant("replay-stale-indptr", "Triton cuda-graph replay keeps the capture's mask_indptr (every request "
            "at the fill length) instead of refilling it for the batch", "read_replay", _replay_stale_indptr),
    Variant("pack-msb-first", "verify-mask packing puts each byte's first cell in its top bit, not bit 0",
            "pack_mask", _pack_msb_first),
    Variant("draft-token-off-by-one", "the verify input's draft tokens are one node off: node x carries "
            "node x + 1's token", "verify", _draft_token_off_by_one),
)}


# -- routers (seam ``route``) and allocation sites (seam ``allocation_call``) --------

def _handing_out(routing, mask, max_context_len=None):
    """The router's answer with another mask or context: the call site gets a backend that says so."""
    import dataclasses
    from types import SimpleNamespace

    ctx = routing.max_context_len if max_context_len is None else max_context_len
    backend = SimpleNamespace(verify_mask=mask, max_context_len=ctx)
    return dataclasses.replace(routing, backend=backend, verify_mask=mask, max_context_len=ctx)


def _router_handing(router_kind: str, role: str):
    def wrap(route):
        def misrouted(router, spec_mode, children, context_len):
            routing = route(router, spec_mode, children, context_len)
            if router != router_kind:
                return routing
            child = children[role]
            if isinstance(child, Nest):  # the wrong child is itself a router: what it hands out
                return _handing_out(routing, misrouted(child.router, spec_mode, child.children,
                                                       context_len).verify_mask)
            return _handing_out(routing, child.verify_mask)
        return misrouted
    return wrap


def _router_short_context(route):
    def short(router, spec_mode, children, context_len):
        routing = route(router, spec_mode, children, context_len)
        return _handing_out(routing, routing.verify_mask, max_context_len=context_len // 2)
    return short


def _allocating(**change):
    """An allocation site passing other bounds; the mask is then the size those bounds give."""
    def wrap(allocation_call):
        def altered(backend, numbers):
            import dataclasses

            import torch

            from vmfuzz.harness.model.layouts import worst_case_size
            from vmfuzz.harness.targets.sglang.structs import replaced

            call = allocation_call(backend, numbers)
            call = dataclasses.replace(call, **{k: f(call) for k, f in change.items()})
            if call.mask is not None:
                n = worst_case_size(call.mask.mode, call.max_bs, call.num_draft_tokens, call.max_context_len)
                call.mask = replaced(
                    call.mask, "VerifyMask", "srt/layers/attention/verify_mask.py", max_bs=call.max_bs,
                    buffer=torch.empty(n, dtype=call.mask.buffer.dtype, device="meta"))
            return call
        return altered
    return wrap


CATALOGUE.update({v.name: v for v in (
    Variant("hybrid-decode-mask", "HybridAttnBackend hands out the decode child's mask even when "
            "speculative_attention_mode is prefill and the prefill child runs TARGET_VERIFY (#32920's routing)",
            "route", _router_handing("hybrid", "decode")),
    Variant("tbo-child-mask", "TboAttnBackend hands out its first overlap child's mask instead of the primary's",
            "route", _router_handing("tbo", "tbo-child-0")),
    Variant("linear-child-mask", "HybridLinearAttnBackend hands out the linear-attention child's mask "
            "instead of the full-attention child's", "route", _router_handing("hybrid-linear", "linear")),
    Variant("router-short-context", "a router reports half the model's context length as max_context_len "
            "(the class #32690 fixed): a FULL_MASK fallback sized from it is too short",
            "route", _router_short_context),
    Variant("alloc-max-bs-short", "an allocating backend sizes the mask for max_bs - 1 instead of the "
            "captured max_bs", "allocation_call", _allocating(max_bs=lambda c: c.max_bs - 1)),
    Variant("alloc-wrong-d", "an allocating backend sizes the mask for num_draft_tokens - 1 draft rows "
            "(the step count instead of the draft width)", "allocation_call",
            _allocating(num_draft_tokens=lambda c: c.num_draft_tokens - 1)),
)})


def _dflash_through(router_kind: str, role: str):
    """DFlash's verify-mask policy resolving ``router_kind`` to ``role`` whatever the mode."""
    def wrap(route):
        def resolved_elsewhere(router, spec_mode, children, context_len):
            import dataclasses

            routing = route(router, spec_mode, children, context_len)
            return routing if router != router_kind else dataclasses.replace(routing, dflash_resolves=role)
        return resolved_elsewhere
    return wrap


CATALOGUE.update({v.name: v for v in (
    Variant("dflash-policy-prefill", "DFlash's verify-mask policy resolves HybridAttnBackend through its "
            "prefill child even when speculative_attention_mode is decode: the custom-mask decision is made "
            "for a backend that does not run TARGET_VERIFY", "route", _dflash_through("hybrid", "prefill")),
)})
