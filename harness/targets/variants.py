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

from harness.layouts import TreeMaskMode
from harness.readers import capture_seq_len


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


def _eager_indptr_without_draft_span(read_eager):
    def read_eager_short(config, batch, step):
        # mask_indptr steps by d * s_b: the d draft columns of each row are forgotten,
        # so every later request reads from inside an earlier one's block.
        view = read_eager(config, batch, step)
        d = config.d
        view.indptr = view.indptr - d * d * torch.arange(view.indptr.numel(), device=view.indptr.device)
        return view
    return read_eager_short


def _replay_stale_indptr(read_replay):
    def read_replay_stale(mask, config, batch, step):
        # Replay leaves mask_indptr as capture filled it: every request at the fill length.
        view = read_replay(mask, config, batch, step)
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


CATALOGUE: dict[str, Variant] = {v.name: v for v in (
    Variant("pr33127", "capacity check skips FULL_MASK: an eager batch past max_bs reuses the buffer "
            "(the regression fixed by SGLang PR #33127)", "fits", _pr33127),
    Variant("fits-off-by-one", "capacity check admits max_bs + 1 requests (bs <= max_bs + 1)",
            "fits", _fits_off_by_one),
    Variant("full-no-draft-span", "FULL_MASK sizing forgets the draft columns: d*max_context_len per "
            "request instead of d*(max_context_len + d)", "numel", _full_without_draft_span),
    Variant("unfilled-prefix", "a reused FULL_MASK buffer's prefix columns are not refilled, so "
            "the previous step's cells leak into this one", "fill_prefix", _unfilled_prefix),
    Variant("row-offset", "tree kernel row offset error: every row is written d cells past its start",
            "kernel", _row_offset),
    Variant("eager-indptr-no-draft-span", "Triton eager verify's mask_indptr steps by d*s_b, forgetting the "
            "draft columns: later requests read inside earlier blocks", "read_eager",
            _eager_indptr_without_draft_span),
    Variant("replay-stale-indptr", "Triton cuda-graph replay keeps the capture's mask_indptr (every request "
            "at the fill length) instead of refilling it for the batch", "read_replay", _replay_stale_indptr),
    Variant("pack-msb-first", "verify-mask packing puts each byte's first cell in its top bit, not bit 0",
            "pack_mask", _pack_msb_first),
)}
