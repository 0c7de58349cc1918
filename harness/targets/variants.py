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

from harness.layouts import TreeMaskMode


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
)}
