"""Every property, by name: each a check that returns an ``Observation`` or raises ``PropertyFailure``.

One module per part of the mask's path:

- ``kit``: what every check is written with (Observation, PropertyFailure,
  fail, first_difference, guarded_step, ...).
- ``core``: the capacity arithmetic (soundness, liveness) and the trivial
  path; with ``shared``, the seven core properties (docs/properties.md). ``Config.call_site`` picks which of SGLang's call sites
  (eagle, chain, pp, frozen_kv_mtp) a case runs through.
- ``writers``: the chain writer ``build_chain_tree``, called directly.
- ``routers``: ``routing``, the mask a router hands to the call site.
- ``allocation``: ``allocation-soundness``, the bounds each backend allocates with.
- ``kv_locations``: ``kv-location-soundness``, the draft, verify and accept steps' KV locations.
- ``graph_replay``: the target verify cuda graph (capture, padded replay): ``graph-replay-equivalence``,
  ``padding-inert``, ``capture-replay-agreement``.
- ``readers``: the mask as attention reads it (Triton's target-verify metadata,
  judged by ``reader_metadata``; FlashInfer's bit packing).
- ``shared``: the drafting core properties judged together on one run of a
  case (each opts in with ``shared=True``; its own check is that run judging
  it alone, so a repro replays as it was found).

A property names the target seams it ``needs`` beyond the core protocol; a
target without them (a plug-in written against the core protocol) gets the
property reported as not driven, never as held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from vmfuzz.harness.model.limits import allocates
from vmfuzz.harness.properties.core import capacity_liveness, capacity_soundness, trivial_path
from vmfuzz.harness.properties.kit import Observation, PropertyFailure
from vmfuzz.harness.properties.writers import chain_writer
from vmfuzz.harness.properties.readers import packed_mask, reader_agreement


@dataclass(frozen=True)
class Property:
    name: str
    check: Callable[..., Observation]
    summary: str
    trivial: bool = False  # runs on d = 1 configs
    steps: bool = False  # takes a sequence of batches
    #: target attributes the check calls beyond the core protocol
    needs: tuple[str, ...] = ()
    #: judged on one shared run of each case with the other shared properties of its ``group``
    #: (``vmfuzz.harness.properties.shared``, ``graph_shared``): the campaign searches them together
    shared: bool = False
    #: which shared run: "drafting" (one verify run of a case) or "graph" (one build and capture of
    #: a case's cuda-graph runners)
    group: str = "drafting"
    chain: bool = False  # runs on the chain writer's configs (QLEN_ONLY, topk 1, d = spec_steps + 1)
    #: layouts its cases are drawn in (None: every preallocated layout)
    layouts: tuple[str, ...] | None = None
    #: the sub-checks it promises (``kit.ledger``): "held" needs each one judged on some case
    promises: tuple[str, ...] = ()
    #: seconds one example takes on SGLang's code on a 2-core CPU host (kernels interpreted), a shared
    #: run's being its group's: only the order lanes start searches in (vmfuzz.harness.engine.search.lanes),
    #: the heaviest first; a stale figure costs minutes, never a verdict
    cost: float = 0.05

    def applies(self, config) -> bool:
        """Are ``config``'s cases this property's? (d = 1 or not, its layouts, a chain for the chain writer)"""
        if config.trivial != self.trivial:
            return False
        if self.layouts is not None and config.mode.name not in self.layouts:
            return False
        return config.chain if self.chain else True

    @property
    def arithmetic(self) -> bool:
        """Checks by arithmetic alone (allocates on the meta device), so it runs at any size."""
        return not allocates(self.name)

    def not_driven_on(self, config) -> str | None:
        """Why one server (``config``, a deployment's) gives this property nothing to search: not
        its shape, or a buffer past MAX_BUFFER_CELLS, which is never allocated (an arithmetic
        property still runs at any size). None: it can be searched there."""
        # the trivial path runs the deployment's own layout at d = 1: only a drafting shape is judged here
        if not self.trivial and not self.applies(config):
            shape = "a topk-1 chain in QLEN_ONLY" if self.chain else f"layout {', '.join(self.layouts or ())}"
            return f"this server's config ({config.mode.name}, topk {config.topk}) is not {shape}"
        if self.arithmetic:
            return None
        from vmfuzz.harness.model.limits import MAX_BUFFER_CELLS
        from vmfuzz.harness.model.validate import buffer_cells
        cells = buffer_cells(config)
        if cells <= MAX_BUFFER_CELLS:
            return None
        return (f"the deployment's verify mask is {cells} cells, over MAX_BUFFER_CELLS ({MAX_BUFFER_CELLS}); "
                "its capacity is checked by arithmetic (capacity properties and the deployment verdict)")

    def missing(self, target) -> list[str]:
        """The seams ``target`` lacks for this property (empty: it can be driven)."""
        return [seam for seam in self.needs if not callable(getattr(target, seam, None))]


def _judged_alone(name: str):
    """A shared property's own check: the shared run, judging only it.

    The same function the shared search shrinks a finding with, so a finding's
    repro replays (and minimizes) exactly as it was found.
    """
    def check(target, config, batches, device="cpu"):
        from vmfuzz.harness.properties.shared import judge
        return judge(target, config, batches, device, (name,))
    check.__name__ = check.__qualname__ = name.replace("-", "_")
    return check


PROPERTIES: dict[str, Property] = {p.name: p for p in (
    Property("no-oob-write", _judged_alone("no-oob-write"),
             "no write leaves its buffer, reused or freshly allocated", shared=True, cost=0.11),
    Property("fallback-equivalence", _judged_alone("fallback-equivalence"),
             "reuse path == per-batch fallback over the logical region", shared=True, cost=0.11),
    Property("reference-agreement", _judged_alone("reference-agreement"),
             "outputs == oracle from ancestor sets, depths and the drafted tokens", shared=True, cost=0.11),
    Property("capacity-soundness", capacity_soundness, "fits(bs) => worst-case footprint fits the buffer",
             shared=True, cost=0.11),
    Property("capacity-liveness", capacity_liveness, "bs <= max_bs => fits(bs)", shared=True, cost=0.11),
    Property("multi-step-reuse", _judged_alone("multi-step-reuse"),
             "a reused buffer gives what a fresh one gives, step after step", steps=True, shared=True,
             cost=0.11),
    Property("trivial-path", trivial_path, "d = 1: reuse and fallback agree", trivial=True, cost=0.013),
    Property("chain-writer", chain_writer, "build_chain_tree: no write leaves its buffers; == oracle, "
             "== the tree kernel on the same chain", chain=True, needs=("chain_write", "chain_kernel"), cost=0.05),
    Property("reader-agreement", reader_agreement, "the Triton verify metadata (mask/qo/kv indptr, kv_indices, "
             "max_extend_len) gives request b exactly its own cells, query rows and KV slots (eager and cuda-graph "
             "replay, fresh and through one server's backend; on a sliding-window server also each request's window "
             "and the mask column it starts at); FA3's topk>1 prefix and per-node expand metadata gives "
             "each draft node exactly the tree nodes it may see, its topk-1 causal pass each request its prefix "
             "and draft", needs=("read_eager", "read_replay"),
             layouts=("FULL_MASK",), steps=True,
             promises=("mask cells", "qo_indptr", "kv_indptr", "kv_indices", "sliding windows", "server state"),
             cost=0.14),
    Property("packed-mask", packed_mask, "bit packing stays in its buffer and yields the mask, LSB first, "
             "where the reader looks; FlashInfer's plan is handed request b's own query rows, KV rows and KV "
             "slots", needs=("pack_mask",), layouts=("FULL_MASK",), promises=("packing", "flashinfer plan"), cost=0.06),
)}

from vmfuzz.harness.properties.allocation import allocation_soundness  # noqa: E402 - after Property
from vmfuzz.harness.properties.routers import routing  # noqa: E402
from vmfuzz.harness.properties.kv_locations import SUB_CHECKS as _KV_SUB_CHECKS  # noqa: E402
from vmfuzz.harness.properties.kv_locations import kv_location_soundness  # noqa: E402
from vmfuzz.harness.properties.graph_replay import (capture_replay_agreement, graph_replay_equivalence,  # noqa: E402
                                                    padding_inert)
from vmfuzz.harness.properties.draft_graph import graph_buffer_soundness  # noqa: E402
from vmfuzz.harness.properties.verify_graph_buffers import VERIFY as _VERIFY_BUFFERS  # noqa: E402
from vmfuzz.harness.properties.draft_extend_replay import SUB_CHECKS as _GRAPH_SUB_CHECKS  # noqa: E402
from vmfuzz.harness.properties.draft_extend_replay import with_draft_extend  # noqa: E402

PROPERTIES.update({p.name: p for p in (
    Property("routing", routing, "each router hands out its TARGET_VERIFY child's mask and reports a "
             "context covering it", needs=("route", "verify_routed"), cost=0.19),
    Property("allocation-soundness", allocation_soundness, "each allocating backend sizes the mask for "
             "the server's max_bs, context length and draft width", needs=("allocating_backends", "allocation_call"),
             cost=0.03),
    Property("kv-location-soundness", kv_location_soundness, "every KV location the draft and accept steps "
             "write lies inside its request's req_to_token row, its allocation and the pool; the accepted "
             "path's moves, accept index and bonus tokens are the meaning's", needs=("kv_locations",),
             promises=_KV_SUB_CHECKS, cost=0.1),
    Property("graph-replay-equivalence", with_draft_extend("graph-replay-equivalence", graph_replay_equivalence),
             "the target verify cuda graph, replayed at a padded bs through DecodeCudaGraphRunner.execute, and "
             "the draft-extend graphs (EAGLE v2, multi-layer), give on the real rows exactly what the eager run "
             "gives (logits, hidden states, top-k, what attention is handed, KV writes, the rows select_index "
             "keeps)", needs=("graph_session",), layouts=("FULL_MASK",), steps=True,
             promises=_GRAPH_SUB_CHECKS, cost=3.0, shared=True,
             group="graph"),
    Property("padding-inert", with_draft_extend("padding-inert", padding_inert), "padded rows of the runners' "
             "static buffers left stale before the replay change no real row, write KV only to slot 0, read no "
             "live request's KV, and no write leaves a static buffer", needs=("graph_session",),
             layouts=("FULL_MASK",), steps=True, promises=_GRAPH_SUB_CHECKS, cost=3.0, shared=True,
             group="graph"),
    Property("capture-replay-agreement", with_draft_extend("capture-replay-agreement", capture_replay_agreement),
             "what a replay hands the backend for bs B (batch size, per-request and per-token lengths it reads, the "
             "length sum, qo_indptr's stride = the captured width = eager cumsum, select_index in its row's window) "
             "agrees with the capture of B, and the replay reads no host value the live program changed after "
             "capture", needs=("graph_session",), layouts=("FULL_MASK",), steps=True,
             promises=_GRAPH_SUB_CHECKS, cost=3.0, shared=True,
             group="graph"),
    Property("graph-buffer-soundness", graph_buffer_soundness, "each static buffer of the target verify "
             "cuda graphs, as the runner's own __init__ sized them, holds what its largest captured bucket needs "
             "(d tokens a request); each of the draft-decode cuda graphs (the backend's kv_indices rows and "
             "kv_indptr included) holds what the largest admitted batch needs with every request at its longest "
             "prefix, at the server's topk and steps and page sizes 1 and 4: by the meaning's arithmetic and by "
             "the redzones at its replay", needs=("draft_graph_session",), promises=(_VERIFY_BUFFERS,), cost=1.5),
)})


def shared_group(names) -> Property:
    """One property standing for several shared ones of one group: its check judges them all on one
    run of a case (the drafting group) or one build of its runners (the graph group)."""
    from vmfuzz.harness.properties import graph_shared, shared
    names = tuple(names)
    missing = [n for n in names if n not in PROPERTIES or not PROPERTIES[n].shared]
    if missing:
        raise ValueError(f"not shared properties: {', '.join(missing)}")
    groups = {PROPERTIES[n].group for n in names}
    if len(groups) != 1:
        raise ValueError(f"not one shared group: {', '.join(names)}")
    if groups == {"graph"}:
        checks = {n: PROPERTIES[n].check for n in names}

        def check(target, config, batches, device="cpu"):
            return graph_shared.judge(target, config, batches, device, checks)
    else:
        def check(target, config, batches, device="cpu"):
            return shared.judge(target, config, batches, device, names)
    layouts = {PROPERTIES[n].layouts for n in names}
    return Property(shared.group_name(names), check,
                    "judged together on one run of each case", steps=True,
                    needs=tuple(dict.fromkeys(s for n in names for s in PROPERTIES[n].needs)),
                    layouts=layouts.pop() if len(layouts) == 1 else None,
                    cost=max(PROPERTIES[n].cost for n in names) * (len(names) if groups == {"graph"} else 1))


def sub_checks(name: str, classes) -> dict[str, str]:
    """The ledger of property ``name`` over the classes its cases reached (empty: it promises none)."""
    from vmfuzz.harness.properties.kit import ledger
    prop = PROPERTIES.get(name)
    return ledger(prop.promises, classes) if prop is not None and prop.promises else {}


def sub_checks_not_driven(name: str, classes) -> dict[str, str]:
    """The promised sub-checks of ``name`` that no case judged, and why."""
    from vmfuzz.harness.properties.kit import gaps
    return gaps(sub_checks(name, classes))


def sub_checks_absent(name: str, classes) -> dict[str, str]:
    """The promised sub-checks of ``name`` whose code this SGLang does not hold, so no promise here
    (``kit.gaps`` leaves them out), and why."""
    from vmfuzz.harness.properties.kit import DONE, gaps
    entries = sub_checks(name, classes)
    unkept = gaps(entries)
    return {k: v for k, v in entries.items() if v != DONE and k not in unkept}


def not_driven_on(names, config) -> dict[str, str]:
    """The properties among ``names`` one server (``config``) leaves not driven, with why
    (``Property.not_driven_on``), in the order given."""
    why = {n: PROPERTIES[n].not_driven_on(config) for n in names}
    return {n: w for n, w in why.items() if w}


def named(name: str) -> Property:
    """The registered property ``name``; a ValueError naming the known ones otherwise."""
    if name not in PROPERTIES:
        raise ValueError(f"unknown property {name!r} (known: {', '.join(PROPERTIES)})")
    return PROPERTIES[name]


def lookup(name: str) -> Property:
    """A registered property, or a shared group by its name (what an isolated worker is sent)."""
    from vmfuzz.harness.properties.shared import group_members
    members = group_members(name)
    return shared_group(members) if members else PROPERTIES[name]


__all__ = ["Observation", "PROPERTIES", "Property", "PropertyFailure", "lookup", "named", "shared_group"]
