"""What a search draws: each property's case strategy, the boundary corpus run before it,
and the shape a case reached.
"""

from __future__ import annotations

from functools import lru_cache, partial

from hypothesis import strategies as st

from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.model.config import Batch, Config, site_takes
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import Property
from vmfuzz.strategies import batches, chain_configs, configs, step_sequences, trivial_configs


def cases(prop: Property, bounds: Bounds) -> st.SearchStrategy[tuple[Config, list[Batch]]]:
    if prop.trivial:
        cfgs = trivial_configs(max_bs=(1, bounds.max_bs), max_context_len=(1, bounds.max_context_len),
                               call_sites=[c for c in bounds.call_sites if c not in ("chain", "frozen_kv_mtp")]
                               or ["eagle"])
    elif prop.chain:
        cfgs = chain_configs(max_bs=(1, bounds.max_bs), max_context_len=(1, bounds.max_context_len),
                             spec_steps=(1, max(1, min(bounds.spec_steps, bounds.num_draft_tokens - 1))),
                             call_sites=bounds.call_sites)
    else:
        cfgs = configs(layouts=prop.layouts, max_bs=(1, bounds.max_bs), max_context_len=(1, bounds.max_context_len),
                       num_draft_tokens=(2, bounds.num_draft_tokens), topk=(1, bounds.topk),
                       spec_steps=(1, bounds.spec_steps), call_sites=bounds.call_sites)

    # One case strategy per config, built once: flatmap calls this for every example.
    @lru_cache(maxsize=8192)
    def with_batches(config: Config):
        if prop.steps:
            steps = step_sequences(config, overshoot=bounds.overshoot)
        else:
            steps = batches(config, overshoot=bounds.overshoot).map(lambda b: [b])
        # partial, not a lambda: Hypothesis prints a lambda's source (``(config, bs)``),
        # which hides the config's fields in a failure report
        return steps.map(partial(_case, config))

    return cfgs.flatmap(with_batches)


def _case(config: Config, steps: list[Batch]) -> tuple[Config, list[Batch]]:
    return config, steps


def boundary_cases(prop: Property, bounds: Bounds) -> list[tuple[Config, list[Batch]]]:
    """A seed corpus run before the search: each layout at the capacity boundary.

    Hypothesis starts from minimal examples and then mutates their tails, so its
    first dozen cases share one config; the boundary classes of
    docs/properties.md (bs = max_bs, bs = max_bs + 1, every request at the context limit,
    both layouts) are too important to wait for. The cases are as small as the
    classes allow (max_bs 1, d 2, two prefix columns), because Hypothesis does
    not shrink an explicit example: a failure here is written as it stands.
    """
    c = min(2, bounds.max_context_len)  # two prefix columns: stale cells differ from a fill
    shape = (1, 1, 0) if prop.trivial else (2, 1, 1)
    out = []
    for mode in (TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY):
        if prop.chain and mode != TreeMaskMode.QLEN_ONLY:
            continue
        # Every call site meets the boundary: (2, 1, 1) in QLEN_ONLY is a chain,
        # so the chain branch does too. The default call site keeps its place first.
        for site in ("eagle", "pp", "chain", "frozen_kv_mtp"):
            config = Config(mode, 1, c, *shape, True, site)
            if (not site_takes(site, config) or site != "eagle" and prop.chain
                    or site not in bounds.call_sites):
                continue
            at, past = Batch((c,)), Batch((c, c))
            if prop.steps:
                out.append((config, [at, past]))  # a captured step leaves its cells, then an eager one
            else:
                out.extend([(config, [past]), (config, [at])])
    return out


def note_reached(into: dict, shape: dict) -> None:
    for k, v in shape.items():
        into[k] = max(into.get(k, v), v)


def case_shape(config: Config, steps: list[Batch]) -> dict:
    return {"d": config.d, "topk": config.topk, "spec_steps": config.spec_steps, "max_bs": config.max_bs,
            "max_context_len": config.max_context_len, "bs": max((b.bs for b in steps), default=0)}


def bs_ratio_bucket(bs: int, max_bs: int) -> str:
    """Where a batch sits against the captured max_bs: the axis the regression lives on."""
    r = bs / max_bs
    if bs == max_bs:
        return "= 1"
    if r < 0.5:
        return "< 0.5"
    if r < 1:
        return "0.5-1"
    if r <= 1.5:
        return "1-1.5"
    if r <= 2:
        return "1.5-2"
    return "> 2"
