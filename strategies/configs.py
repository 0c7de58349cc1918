"""Allocation configs: only the combinations a server can actually start with."""

from __future__ import annotations

import msgspec
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from vmfuzz.harness.model.config import CALL_SITES, Config, num_candidates, site_takes
from vmfuzz.harness.model.layouts import PREALLOCATED_LAYOUTS, TreeMaskMode
from vmfuzz.strategies._cached import BOOLEANS, edgy_integers, sampled_from
from vmfuzz.strategies._validate import check_range


def _layouts(layouts) -> tuple[TreeMaskMode, ...]:
    if layouts is None:
        return PREALLOCATED_LAYOUTS
    try:
        out = tuple(TreeMaskMode.parse(m) if isinstance(m, str) else TreeMaskMode(m) for m in layouts)
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(f"layouts={layouts!r}: {exc}") from None
    bad = [m.name for m in out if m not in PREALLOCATED_LAYOUTS]
    if bad or not out:
        raise InvalidArgument(f"layouts={layouts!r}: pick from FULL_MASK, QLEN_ONLY "
                              f"(bit-packed masks are never preallocated)")
    return out


def _call_sites(call_sites) -> tuple[str, ...]:
    if call_sites is None:
        return CALL_SITES
    if isinstance(call_sites, str) or not all(isinstance(c, str) for c in call_sites):
        raise InvalidArgument(f"call_sites={call_sites!r} must be a sequence of names from {', '.join(CALL_SITES)}")
    out = tuple(call_sites)
    bad = [c for c in out if c not in CALL_SITES]
    if bad or not out:
        raise InvalidArgument(f"call_sites={call_sites!r}: pick from {', '.join(CALL_SITES)}")
    return out


def _draw_site(draw, sites: tuple[str, ...], config: Config) -> Config | None:
    """One of ``sites`` that can run ``config`` (the chain branch only takes chains); shrinks to the first."""
    usable = tuple(c for c in sites if site_takes(c, config))
    if not usable:
        return None
    site = draw(sampled_from(usable))
    return config if site == config.call_site else msgspec.structs.replace(config, call_site=site)


def configs(*, layouts=None, max_bs=(1, 8), max_context_len=(1, 64), num_draft_tokens=(2, 8),
            topk=(1, 4), spec_steps=(1, 4), read=None, call_sites=None) -> st.SearchStrategy[Config]:
    """Consistent drafting configs (num_draft_tokens >= 2).

    Each numeric argument is an int or an inclusive ``(lo, hi)`` pair. ``layouts``
    is a subset of ``("FULL_MASK", "QLEN_ONLY")``; ``read`` pins ``is_read``
    (an unread mask is always QLEN_ONLY, as SGLang allocates it). ``call_sites``
    is a subset of ``vmfuzz.harness.model.config.CALL_SITES`` (default: all); "chain" is
    drawn only for a config of the chain writer's shape.

    >>> configs(max_bs=(1, 4), layouts=["FULL_MASK"]).example()  # doctest: +SKIP
    Config(mode=<TreeMaskMode.FULL_MASK: 0>, max_bs=2, max_context_len=37, ...)
    """
    modes = _layouts(layouts)
    bs_lo, bs_hi = check_range("max_bs", max_bs, low=1)
    ctx_lo, ctx_hi = check_range("max_context_len", max_context_len, low=1)
    d_lo, d_hi = check_range("num_draft_tokens", num_draft_tokens, low=2)
    k_lo, k_hi = check_range("topk", topk, low=1)
    s_lo, s_hi = check_range("spec_steps", spec_steps, low=1)
    if read is not None and not isinstance(read, bool):
        raise InvalidArgument(f"read={read!r} must be None, True or False")
    if read is False and TreeMaskMode.QLEN_ONLY not in modes:
        raise InvalidArgument("read=False needs QLEN_ONLY among the layouts (unread masks are QLEN_ONLY)")
    if d_lo - 1 > num_candidates(k_hi, s_hi):
        raise InvalidArgument(f"num_draft_tokens={num_draft_tokens!r} needs more candidates than "
                              f"topk={topk!r} x spec_steps={spec_steps!r} can draft")
    sites = _call_sites(call_sites)

    @st.composite
    def build(draw) -> Config:
        # Every number is weighted to its edges (edgy_integers): uniform draws
        # over production ranges all but never reach the top of a range or a
        # power-of-two boundary, where sizing and tiling bugs sit.
        k = draw(edgy_integers(k_lo, k_hi))
        steps = draw(edgy_integers(s_lo, s_hi))
        d_top = min(d_hi, 1 + num_candidates(k, steps))
        assume(d_top >= d_lo)
        d = draw(edgy_integers(d_lo, d_top))
        mode = draw(sampled_from(modes))
        if mode == TreeMaskMode.FULL_MASK:
            is_read = True
        elif read is None:
            is_read = not draw(BOOLEANS)  # booleans shrink to False: shrink toward a read mask
        else:
            is_read = read
        config = Config(mode, draw(edgy_integers(bs_lo, bs_hi)), draw(edgy_integers(ctx_lo, ctx_hi)), d, k, steps, is_read)
        config = _draw_site(draw, sites, config)
        assume(config is not None)
        return config

    @st.composite
    def corner(draw) -> Config:
        # The production corner: every size at the top of its range at once
        # (largest capture size, context, draft width, tree), a configuration
        # a server really runs and that independent edge draws reach together
        # only one time in hundreds.
        mode = draw(sampled_from(modes))
        is_read = True if mode == TreeMaskMode.FULL_MASK else (read if read is not None else not draw(BOOLEANS))
        d = min(d_hi, 1 + num_candidates(k_hi, s_hi))
        config = _draw_site(draw, sites, Config(mode, bs_hi, ctx_hi, d, k_hi, s_hi, is_read))
        assume(config is not None)
        return config

    # One draw in four: build() first, so shrinking leaves the corner.
    return st.one_of(build(), build(), build(), corner())


def chain_configs(*, max_bs=(1, 8), max_context_len=(1, 64), spec_steps=(1, 4), read=None,
                  call_sites=None) -> st.SearchStrategy[Config]:
    """Configs of the chain writer's shape: QLEN_ONLY, topk 1, num_draft_tokens = spec_steps + 1.

    That is what SGLang hands ``build_chain_tree`` (on CUDA), the most common
    EAGLE setting. ``call_sites`` as for ``configs``.
    """
    bs_lo, bs_hi = check_range("max_bs", max_bs, low=1)
    ctx_lo, ctx_hi = check_range("max_context_len", max_context_len, low=1)
    s_lo, s_hi = check_range("spec_steps", spec_steps, low=1)
    if read is not None and not isinstance(read, bool):
        raise InvalidArgument(f"read={read!r} must be None, True or False")
    sites = _call_sites(call_sites)

    @st.composite
    def build(draw) -> Config:
        steps = draw(edgy_integers(s_lo, s_hi))
        is_read = (not draw(BOOLEANS)) if read is None else read
        config = Config(TreeMaskMode.QLEN_ONLY, draw(edgy_integers(bs_lo, bs_hi)),
                        draw(edgy_integers(ctx_lo, ctx_hi)), steps + 1, 1, steps, is_read)
        return _draw_site(draw, sites, config)

    return build()


def trivial_configs(*, layouts=None, max_bs=(1, 8), max_context_len=(1, 64), read=None,
                    call_sites=None) -> st.SearchStrategy[Config]:
    """No-draft configs: num_draft_tokens 1, spec_steps 0 (the trivial verify path).

    ``call_sites`` as for ``configs``: "eagle" is the EAGLE worker's trivial
    path, "pp" the pipeline-parallel rebuild of a one-node tree.
    """
    modes = _layouts(layouts)
    sites = tuple(c for c in _call_sites(call_sites) if c not in ("chain", "frozen_kv_mtp"))
    if not sites:
        raise InvalidArgument(f"call_sites={tuple(call_sites)!r}: the chain writer and the frozen-KV MTP "
                              "worker never run a one-node tree")
    bs_lo, bs_hi = check_range("max_bs", max_bs, low=1)
    ctx_lo, ctx_hi = check_range("max_context_len", max_context_len, low=1)
    if read is not None and not isinstance(read, bool):
        raise InvalidArgument(f"read={read!r} must be None, True or False")

    @st.composite
    def build(draw) -> Config:
        mode = draw(sampled_from(modes))
        if mode == TreeMaskMode.FULL_MASK:
            is_read = True
        else:
            is_read = read if read is not None else not draw(BOOLEANS)
        config = Config(mode, draw(edgy_integers(bs_lo, bs_hi)), draw(edgy_integers(ctx_lo, ctx_hi)), 1, 1, 0, is_read)
        return _draw_site(draw, sites, config)

    return build()
