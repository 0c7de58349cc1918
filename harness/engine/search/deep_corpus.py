"""The deep boundary corpus: production shapes, run once per property before the search.

``boundary_cases`` keeps each case as small as its class allows; these are the
opposite, the shapes a server meets that a search reaches late or never: a tree
one node past a packed word (d = 9, d = 17 where rows pack into 8- and 16-bit
words), a captured batch of more cells than one kernel program has lanes
(bs · d past 128), a walk as deep as the draft goes (spec_steps 4, nodes at
depth 4), a captured max_bs past a byte of requests with every slot taken, and a
packed row longer than the packing kernel's block, put before a short row (work
sized by the last row instead of the longest misses the tail of the first); and,
for the graph properties, a draft-decode replay padded to its bucket with every
request drafting inside its context (a case whose draft runner is built).

Every size comes from ``ShapeConstants``: read from the code under test where
the target can (``target.shape_constants()``), else the model's own. Hypothesis
does not shrink an explicit example, so a failure here is written as it stands.
"""

from __future__ import annotations

import msgspec

from vmfuzz.harness.engine.search.cases import boundary_cases
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.model.config import Batch, Config, ConfigError, num_candidates, site_takes
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.shapes import ShapeConstants, model_constants
from vmfuzz.harness.properties import Property
from vmfuzz.harness.model.trees import deepest

#: (label, config, steps): what the summary names and what the property runs
DeepCase = tuple[str, Config, list[Batch]]


def constants_of(target) -> ShapeConstants:
    """The target's own widths, or the model's where the target cannot say."""
    read = getattr(target, "shape_constants", None)
    return read() if callable(read) else model_constants()


def case_key(config: Config, steps: list[Batch]) -> bytes:
    return msgspec.json.encode((config, steps))


def _depth(k: ShapeConstants) -> int:
    """As many draft steps as a byte has bit positions to index: 4 for 8-bit words."""
    return max(4, k.packed_widths[0].bit_length())


def _topk_for(d: int, spec_steps: int) -> int:
    """The narrowest draft that yields d - 1 candidates in spec_steps steps."""
    topk = 1
    while num_candidates(topk, spec_steps) < d - 1:
        topk += 1
    return topk


def _shapes(prop: Property, k: ShapeConstants) -> list[tuple[str, int, int, int, tuple[int, ...], str]]:
    """(label, d, max_bs, max_context_len, seq_lens, layout) per deep case of ``prop``'s kind.

    Two cases, each as small as its classes allow (the Triton interpreter pays per
    program and per node): a full captured batch one node past the first packed
    word, and a long row before a short one one node past the second.
    """
    w0 = k.packed_widths[0]
    w1 = k.packed_widths[1] if len(k.packed_widths) > 1 else 2 * w0
    d = 1 if prop.trivial else w0 + 1
    # max_bs past a byte of requests, and (drafting) more cells than one program has lanes
    # (the chain writer's cost grows with bs * spec_steps: it keeps to a byte of requests; the
    # lanes are crossed by the tree writer's cases)
    max_bs = w0 + 1 if d == 1 or prop.chain else max(w0 + 1, -(-(k.lanes + 1) // d))
    lens = tuple(2 if b % 2 == 0 else 1 for b in range(max_bs))  # mixed, not all at the limit
    what = "no draft, " if d == 1 else f"d={d} past {w0}-bit rows, "
    cells = "" if d == 1 else f" (bs*d={max_bs * d}{' > %d lanes' % k.lanes if max_bs * d > k.lanes else ''})"
    out = [(f"{what}bs=max_bs={max_bs}{cells}", d, max_bs, 2, lens, "QLEN_ONLY")]
    d = 1 if prop.trivial else w1 + 1
    # The longest row packs to a few bits past the kernel's block (its tail needs a second
    # program) and past 255 bytes (its offsets need more than a uint8).
    long = k.long_row_bits // d - d + 1
    out.append((f"long row before short: d={d}{'' if d == 1 else f' past {w1}-bit rows'}, seq_lens ({long}, 1), "
                f"a {d * (long + d)}-bit packed row past {k.long_row_bits} bits (pack block {k.pack_block_bits})", d, 2, long,
                (long, 1), "FULL_MASK"))
    # A property that runs each case through every router kind pays the case once per router:
    # it takes the cheapest (two requests), or the first would outlast a gate's example timeout.
    return out[1:] if "verify_routed" in prop.needs else out


def _mode(prop: Property, chosen: str) -> TreeMaskMode:
    """The case's own layout where the property takes it, else the one it does."""
    if prop.chain:
        return TreeMaskMode.QLEN_ONLY
    if prop.layouts is None or chosen in prop.layouts:
        return TreeMaskMode[chosen]
    return TreeMaskMode[prop.layouts[0]]


def _padded_draft_case(prop: Property, bounds, site: str) -> list[DeepCase]:
    """A graph property's draft-decode runner replayed padded, every request drafting inside its context:
    a tree of topk 2 and 3 steps, bs 3 in the graph captured at 4. The draft runner is built for one case
    in ``DRAFT_SHARE`` (chosen by the config) and pads only a bs between captured sizes, so a search meets
    its padded rows late or never. The context is the first from 16 up whose config is chosen and whose
    draft model has window layers on an unpaged server (``draft_window``, ``draft_page_size``): a topk > 1
    branch's window reads then take the unpaged chain slots, the form a search reaches in one case in
    sixteen; failing that, the first chosen at all."""
    from vmfuzz.harness.properties.draft_graph import draft_judged, draft_page_size, draft_window
    if "graph_session" not in prop.needs or "eagle" not in bounds.call_sites:
        return []
    lens = (5, 7, 3)
    chosen = [c for c in (Config(TreeMaskMode.FULL_MASK, 4, ctx, 6, 2, 3, True, site) for ctx in range(16, 128))
              if draft_judged(c) is None and prop.applies(c)]
    windowed = [c for c in chosen if draft_window(c) and draft_page_size(c) == 1]
    if not chosen:
        return []
    config = (windowed or chosen)[0]
    window = f", window {draft_window(config)}" if draft_window(config) else ""
    return [(f"padded draft replay: topk 2, 3 steps, bs 3 in the graph of 4, context {config.max_context_len}"
             f"{window} [FULL_MASK]", config, [Batch(lens)])]


def _padded_multi_layer_case(prop: Property, bounds, site: str) -> list[DeepCase]:
    """The graph properties' multi-layer draft-extend runners replayed padded: they are judged only on a
    topk-1 chain with d = steps + 1, and pad only a bs between captured sizes, so a search meets their
    padded rows (what the prepare kernel writes past the raw rows) late or never: a chain of 2 steps, bs 3
    in the graph captured at 4, context 32."""
    if "graph_session" not in prop.needs or "eagle" not in bounds.call_sites:
        return []
    config = Config(TreeMaskMode.FULL_MASK, 4, 32, 3, 1, 2, True, site)
    if not prop.applies(config):
        return []
    return [("padded multi-layer draft extend: topk 1, 2 steps, bs 3 in the graph of 4, context 32 [FULL_MASK]",
             config, [Batch((5, 7, 3))])]


#: a DSpark target's steps: bs 1 four times (its glue warmed up and captured, then staged from its own
#: tensors and taken, and from the step before's and rejected), a padded bs 3 (its stage thrown away), bs 4
_DSPARK_STEPS = ((9,), (10,), (11,), (12,), (1, 2, 3), (6, 7, 8, 9))


#: the DSpark wiring each graph property's case is drawn on (``graph_glue.session_options``): a search draws
#: the two others one case in eight and sixteen of its DSpark ones, so a gate would leave the runner's
#: replay of a captured glue graph with no view, and a DeepSeek V4 target's stages (none an early variant,
#: each thrown away and none found by its load), unrun
_DSPARK_WIRING = {"graph-replay-equivalence": ("skip view",), "padding-inert": ("DeepSeek V4",),
                  "capture-replay-agreement": (True, "request window")}
_DSPARK_SAID = {True: "its early verify metadata staged and taken", "skip view": (
    "its early verify metadata staged and taken, its captured glue graphs replayed with no view"),
                "DeepSeek V4": "DeepSeek V4's (no candidate variants): every stage thrown away",
                "request window": "its pool keeps a request window: glue declined, nothing staged"}


def _dspark_case(prop: Property, bounds, site: str) -> list[DeepCase]:
    """A graph property's case on a DSpark target's server (``graph_glue.dspark``), whose early verify
    metadata a load takes only after its key's glue graph was captured on earlier steps of the same bs: a
    search's few multi-step cases of one bs on such a server almost never stage one that is taken, so a
    gate would leave the stage, take and discard of ``EarlyVerifyMetadata`` unrun. Its wirings are the
    property's in ``_DSPARK_WIRING`` (the plain one elsewhere), each at the first context from 24 up that draws it;
    a shared run of several properties (a gate's) gets one case for each of its members' wirings."""
    from vmfuzz.harness.properties.graph_glue import dspark, session_options
    from vmfuzz.harness.properties.shared import group_members
    if "graph_session" not in prop.needs or site != "eagle":
        return []
    lens = max(len(s) for s in _DSPARK_STEPS)
    wirings = dict.fromkeys(w for name in group_members(prop.name) or (prop.name,)
                            for w in _DSPARK_WIRING.get(name, (True,)))
    out = []
    for wiring in wirings:
        configs = (Config(TreeMaskMode.FULL_MASK, lens, ctx, 4, 2, 2, True, site) for ctx in range(24, 1024))
        config = next((c for c in configs if dspark(c) and session_options(c)["dspark"] == wiring
                       and prop.applies(c)), None)
        if config is not None:
            out.append((f"DSpark target: {_DSPARK_SAID[wiring]}, bs 1 x4, 3 (padded), 4, context "
                        f"{config.max_context_len} [FULL_MASK]", config, [Batch(s) for s in _DSPARK_STEPS]))
    return out


def _seeded_draft_case(prop: Property, bounds, site: str) -> list[DeepCase]:
    """The graph properties' draft-decode runner on a server that samples its drafts under seeds
    (``draft_seeded``: a chain server with rejection sampling and deterministic inference, whose replay
    copies each request's seed into its graph), which a search meets in one chain case in eight at best: a
    chain of 3 steps, two requests, the first context from 16 up whose config has its draft runner built,
    seeded, with no window layers (the cheapest such server: about a second of build and replay)."""
    from vmfuzz.harness.properties.draft_graph import draft_judged, draft_seeded, draft_window
    if "graph_session" not in prop.needs or "eagle" not in bounds.call_sites:
        return []
    chosen = [c for c in (Config(TreeMaskMode.FULL_MASK, 2, ctx, 4, 1, 3, True, site) for ctx in range(16, 128))
              if draft_judged(c) is None and draft_seeded(c) and not draft_window(c) and prop.applies(c)]
    if not chosen:
        return []
    return [(f"seeded draft replay: topk 1, 3 steps, rejection sampling, context {chosen[0].max_context_len} "
             "[FULL_MASK]", chosen[0], [Batch((5, 9))])]


def deep_cases(prop: Property, bounds, k: ShapeConstants) -> list[DeepCase]:
    site = "eagle" if "eagle" in bounds.call_sites else bounds.call_sites[0]
    out = []
    for label, d, max_bs, ctx, lens, layout in _shapes(prop, k):
        steps = d - 1 if prop.chain else (0 if d == 1 else _depth(k))
        topk = 1 if prop.chain or d == 1 else _topk_for(d, steps)
        mode = _mode(prop, layout)
        config = Config(mode, max_bs, ctx, d, topk, steps, True, site)
        try:
            config.validate()
        except ConfigError:
            continue
        if not prop.applies(config) or not site_takes(site, config):
            continue
        trees = None if d == 1 or prop.chain else (deepest(topk, steps, d),) * len(lens)
        first = Batch(lens, trees)
        # a stepping property meets the short row first on its next step (one step of a full batch:
        # a second would double the case's cost for no class it lacks)
        batches = [first, Batch(lens[::-1], trees)] if prop.steps and lens[0] > lens[-1] else [first]
        out.append((f"{label}, spec_steps={steps} [{mode.name}]", config, batches))
    return (out + _padded_draft_case(prop, bounds, site) + _padded_multi_layer_case(prop, bounds, site)
            + _seeded_draft_case(prop, bounds, site) + _dspark_case(prop, bounds, site))


def fixed_cases(target, prop: Property, bounds: Bounds, strategy) -> tuple[list, dict]:
    """The cases run before the search, boundary then deep, and {case key: deep label or None}."""
    if strategy is not None:  # a deployment-scoped search keeps to its deployment: no corpus outside it
        return [], {}
    corpus = deep_cases(prop, bounds, constants_of(target))
    explicit = boundary_cases(prop, bounds) + [(c, s) for _, c, s in corpus]
    fixed = {case_key(c, s): None for c, s in explicit}
    fixed.update({case_key(c, s): label for label, c, s in corpus})
    return explicit, fixed
