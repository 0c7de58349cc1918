"""The verify window's producer as SGLang's wrapper launches it, with its fused outputs.

``assign_extend_cache_locs_uniform_func`` gathers each request's ``d`` verify slots
from its ``req_to_token`` row. On a pool whose reads go through page tables, the same
launch also writes each slot's physical id in the full and the sliding-window
sub-pools, and (DSpark's planner) the window's positions and an anchor column. This
module drives it three ways, each through SGLang's own code:

1. **plain**, as ``eagle_prepare_for_verify`` calls it: the wrapper's Triton-device
   branch (a CUDA host's: the module's ``_is_cuda`` flag answers True for the call;
   the kernel runs in Triton's interpreter on CPU tensors);
2. **translated**, as ``KVIndexTranslator.plan_uniform_extend`` makes it on a
   translating pool: a translator with both sub-pools' page tables (``read_v2p``),
   the pool indices answering ``is_cuda`` for its one device test (``_SeenAsCuda``),
   positions and an anchor column asked for;
3. **fallback**, the wrapper's other branch (a host with no Triton device): positions
   and anchor by torch, the gather by ``assign_extend_cache_locs_func``, whose
   out-of-tree platform hook is answered with SGLang's own Triton gather
   (``assign_extend_cache_locs``), launched as its Triton-device branch launches it.

Every output is redzoned: the windows the wrapper allocates itself are handed to the
kernel as redzoned views (the kernel object is bound to a guarded launcher). The page
tables are this driver's inputs (``page_tables``); what each slot must become is the
meaning's (``model.kv_locations.physical_slot``), judged by the property.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.targets.sglang.binding import bound

#: anchor tokens the driver hands the fused launch (request b's is ``ANCHOR_BASE + b``)
ANCHOR_BASE = 9000
#: the anchor output's row width: column 0 takes the anchor, the rest must stay as they were (0)
ANCHOR_WIDTH = 3


@dataclass
class Translated:
    """What the fused launches wrote, as plain lists, and the page tables they were handed."""

    page_size: int = 1
    full_map: list[int] = field(default_factory=list)  # virtual page -> physical page (full sub-pool)
    swa_map: list[int] = field(default_factory=list)  # the sliding-window sub-pool's (-1: not held)
    plain: list[int] = field(default_factory=list)  # the wrapper's window, no translation asked
    virtual: list[int] = field(default_factory=list)  # plan_uniform_extend's virtual window
    full: list[int] = field(default_factory=list)
    swa: list[int] = field(default_factory=list)
    positions: list[list[int]] = field(default_factory=list)
    anchor_src: list[int] = field(default_factory=list)  # the anchor each request was handed
    anchors: list[list[int]] = field(default_factory=list)  # the anchor rows the launch wrote
    fallback: list[int] | None = None  # the fallback branch's window (None: it returned none)
    fallback_positions: list[list[int]] = field(default_factory=list)
    fallback_anchors: list[list[int]] = field(default_factory=list)
    #: why the fused launches were not driven (None: they were): this SGLang has part of the producer
    not_driven: str | None = None
    #: why there was nothing to drive (None: there was): this SGLang has none of the fused producer
    absent: str | None = None


def page_tables(slots: int, page_size: int) -> tuple[list[int], list[int]]:
    """(full, sliding-window) page tables for a pool of ``slots`` virtual ids: the full sub-pool holds every
    page, in reverse order; the sliding-window one holds half as many pages, shifted, every third page
    evicted (-1), so unheld pages, past the table and inside it, are both met."""
    pages = -(-(slots + 1) // page_size)
    full = [pages - 1 - q for q in range(pages)]
    held = max(1, pages // 2)
    swa = [-1 if q % 3 == 2 else (q + 1) % held for q in range(held)]
    return full, swa


class _GuardedLaunch:
    """A Triton kernel object whose launches hand its ``out`` argument (positional ``index``) to the kernel as
    a redzoned view: the window the wrapper allocated itself is redzoned like every other output."""

    def __init__(self, kernel, heap: ShadowHeap, index: int, reach: int):
        self.kernel, self.heap, self.index, self.reach = kernel, heap, index, reach

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            args = list(args)

            def run(t):
                args[self.index] = t["out"]
                self.kernel[grid](*args, **kwargs)
            self.heap.run_kernel(run, {"out": args[self.index]}, {"out": self.reach})
        return launch


def run_windows(sg, heap: ShadowHeap, table: torch.Tensor, rpi: torch.Tensor, seq_lens: torch.Tensor, d: int,
                page_size: int) -> Translated:
    """The three launches of the verify window's producer for this batch (``table``: the redzoned
    ``req_to_token``; ``rpi``: each request's row)."""
    from vmfuzz.harness.targets.sglang.call_sites import _SeenAsCuda
    cl, bs = sg.cache_locs, rpi.numel()
    out = Translated(page_size=page_size)
    out.full_map, out.swa_map = page_tables(table.numel(), page_size)
    guarded = ((cl, "assign_extend_cache_locs_uniform", _GuardedLaunch(cl.assign_extend_cache_locs_uniform, heap, 3, 4 * d)),
               (cl, "assign_extend_cache_locs", _GuardedLaunch(cl.assign_extend_cache_locs, heap, 4, 4 * d)))
    with bound(*guarded, (cl, "_is_cuda", True)):
        out.plain = _ids(cl.assign_extend_cache_locs_uniform_func(
            req_pool_indices=rpi, req_to_token=table, start_offset=seq_lens, batch_size=bs, draft_token_num=d,
            device="cpu"))
        out.absent = absent(sg)
        out.not_driven = None if out.absent else _missing(sg)
        if out.absent or out.not_driven:
            return out
        translator = translator_over(sg, table, out.full_map, out.swa_map, page_size)
        positions = heap.alloc("positions_out", (bs, d), torch.int64, fill=0, redzone_cells=4 * d)
        anchors = heap.alloc("anchor_out", (bs, ANCHOR_WIDTH), torch.int64, fill=0, redzone_cells=8)
        anchor_src = torch.arange(ANCHOR_BASE, ANCHOR_BASE + bs, dtype=torch.int64)
        plan = translator.plan_uniform_extend(
            req_pool_indices=rpi.as_subclass(_SeenAsCuda), seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(),
            width=d, positions_out=positions, anchor_src=anchor_src, anchor_out=anchors)
    kinds = sg.IdSpaceKind
    out.virtual = _ids(plan.virtual_write_ids())
    out.full = _ids(plan.write_ids(translator, kind=kinds.FULL))
    out.swa = _ids(plan.write_ids(translator, kind=kinds.SLIDING_WINDOW))
    out.positions, out.anchors, out.anchor_src = positions.tolist(), anchors.tolist(), anchor_src.tolist()
    _fallback(sg, heap, guarded, out, table, rpi, seq_lens, d, anchor_src)
    return out


def _fallback(sg, heap, guarded, out: Translated, table, rpi, seq_lens, d: int, anchor_src) -> None:
    """The wrapper's branch for a host with no Triton device, its gather an out-of-tree platform's op that
    is SGLang's own Triton gather (``assign_extend_cache_locs_func`` as a Triton device runs it)."""
    cl, bs = sg.cache_locs, rpi.numel()
    real_gather = cl.assign_extend_cache_locs_func

    def platform_gather(**kwargs):
        with bound((cl, "_is_cuda", True), (cl, "_get_oot_speculative_cache_locs_fn", lambda: None)):
            return real_gather(**kwargs)
    positions = heap.alloc("fallback positions_out", (bs, d), torch.int64, fill=0, redzone_cells=4 * d)
    anchors = heap.alloc("fallback anchor_out", (bs, ANCHOR_WIDTH), torch.int64, fill=0, redzone_cells=8)
    with bound(*guarded, (cl, "_is_cuda", False), (cl, "_get_oot_speculative_cache_locs_fn", lambda: platform_gather)):
        window = cl.assign_extend_cache_locs_uniform_func(
            req_pool_indices=rpi, req_to_token=table, start_offset=seq_lens, batch_size=bs, draft_token_num=d,
            device="cpu", positions_out=positions, anchor_src=anchor_src, anchor_out=anchors)
    out.fallback = None if window is None else _ids(window)
    out.fallback_positions, out.fallback_anchors = positions.tolist(), anchors.tolist()


def translator_over(sg, table: torch.Tensor, full_map: list[int], swa_map: list[int], page_size: int,
                    swa_key: str = "swa"):
    """SGLang's ``KVIndexTranslator`` over a translating pool: both sub-pools' reads through the driver's page
    tables (made with ``object.__new__``: its own set-up builds a real pool's sub-pools). Each sub-pool's write
    map, the allocator's, stands in as the meaning's translation by the same table: the fused launch's
    outputs replace it, and where they would not, the map gives what they must."""
    from vmfuzz.harness.model.kv_locations import physical_slot
    kinds = sg.IdSpaceKind
    translator = object.__new__(sg.translator.KVIndexTranslator)
    translator.req_to_token, translator.page_size = table, page_size

    def write_map(page_map):
        def translate(ids):
            return torch.tensor([physical_slot(int(v), page_map, page_size) for v in ids.reshape(-1)],
                                dtype=torch.int64).view(ids.shape)
        return translate
    translator._spaces = {
        kind: sg.IdSpace(key=key, write=write_map(page_map), read_v2p=torch.tensor(page_map, dtype=torch.int32))
        for kind, key, page_map in ((kinds.FULL, "full", full_map), (kinds.SLIDING_WINDOW, swa_key, swa_map))}
    return translator


#: the fused outputs the verify window's producer takes where it has them
FUSED = frozenset({"full_v2p", "swa_v2p", "positions_out", "anchor_out"})


def _fused_taken(sg) -> set[str]:
    import inspect
    return FUSED & set(inspect.signature(sg.cache_locs.assign_extend_cache_locs_uniform_func).parameters)


def absent(sg) -> str | None:
    """Why this SGLang holds none of the fused producer (None: it holds some of it): no translating
    pool's ``plan_uniform_extend`` and a window producer that takes none of the fused outputs. Then the
    fused window judges nothing of this code; a release with either half has it, and ``_missing`` says
    what keeps vmfuzz from driving it."""
    planner = sg.translator is not None and hasattr(sg.translator.KVIndexTranslator, "plan_uniform_extend")
    if planner or _fused_taken(sg):
        return None
    return ("no KVIndexTranslator.plan_uniform_extend, and assign_extend_cache_locs_uniform_func takes none of "
            f"{', '.join(sorted(FUSED))}")


def _missing(sg) -> str | None:
    """Why this SGLang's verify-window producer, which it has in part, has no fused launch vmfuzz can
    drive (None: it has)."""
    if sg.translator is None or not hasattr(sg.translator.KVIndexTranslator, "plan_uniform_extend"):
        return "this SGLang has no KVIndexTranslator.plan_uniform_extend"
    have = _fused_taken(sg)
    return None if FUSED <= have else f"assign_extend_cache_locs_uniform_func takes no {sorted(FUSED - have)}"


def _ids(t) -> list[int]:
    return [] if t is None else [int(v) for v in t.reshape(-1)]
