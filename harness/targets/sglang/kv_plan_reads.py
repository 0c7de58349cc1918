"""The reads of one iteration's plan on a translating pool, through SGLang's own code.

A translating pool's readers never see virtual ids: a plan (``KVLocPlan``) hands each
reader its sub-pool's physical ids, either as a page table built once per iteration
(``KVIndexTranslator.read_table``, ``KVLocPlan.read_table``) or as the token stream a
paged wrapper plans over (``KVIndexTranslator.pack_read_stream``: gathered and
translated straight into the stream before any table exists, packed from the table
once one does, through ``read_source``). This module drives, for the full and the
sliding-window sub-pools in turn: the stream before a table, the table itself (one
row past the batch, the padding lane a captured graph reads), and the stream again
from it (its lanes' program count sized by SGLang from the length sum). Then the same
for a second reader of the plan, as a later depth of a multi-layer draft reads it:
same rows, same full sub-pool, but window layers routed to a sliding-window sub-pool
of its own (another page table), which must be read through its own table, not the
plan's runner's.

Reads index pages, so their ``req_to_token`` is page-aligned as a real paged pool's is:
column ``c`` of row ``r`` holds virtual slot ``P + r·W + c`` (``W``: the row width
rounded up to whole pages; page 0 is the pool's padding page). The page tables are
the driver's (``kv_translation.page_tables``); what each read must be is the
meaning's, judged by the property (``properties.kv_locations``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from vmfuzz.harness.guard.shadow import ShadowHeap

_PROP = ("kv-location-soundness",)
_TRANSLATOR, _PLAN = "srt/mem_cache/kv_index_translator.py", "srt/mem_cache/kv_loc_plan.py"
#: What this module drives, for ``vmfuzz surface`` and the gate.
SURFACE: tuple = tuple((_TRANSLATOR, f"KVIndexTranslator.{fn}", _PROP) for fn in (
    "read_source", "read_table", "_plan_table", "pack_read_stream", "build_iteration_table", "_reads_translated",
    "copy_page_table",
)) + tuple((_PLAN, f"KVLocPlan.{fn}", _PROP) for fn in (
    "has_read_table", "read_table", "_read_space", "is_read_by", "is_translated_for",
)) + tuple(("kernels/ops/kvcache/kv_read_table.py", fn, _PROP) for fn in (
    "build_kv_read_table", "build_kv_read_table_packed",
))


#: what a plan's readers are handed it through, on the translator: the calls this module makes
READS = ("plan", "read_source", "read_table", "pack_read_stream", "copy_page_table")


def absent(sg) -> str | None:
    """Why this SGLang has no iteration plan for a reader to read (None: it has one): no
    ``sglang.srt.mem_cache.kv_loc_plan`` module at all (0.5.21 reads through the translator itself,
    without a plan). Then "plan reads" judges nothing of this code. A release with the module has a
    plan, whatever its translator's methods are called: ``not_driven`` says what vmfuzz cannot find."""
    if sg.IdSpaceKind is None:
        return "no sglang.srt.mem_cache.kv_loc_plan: its translator reads without an iteration plan"
    return None


def not_driven(sg) -> str | None:
    """Why this SGLang's plan, which it has, is not read here (None: it is): a reader call it lacks."""
    if sg.translator is None:
        return "a kv_loc_plan module but no sglang.srt.mem_cache.kv_index_translator"
    lacks = [n for n in READS if not hasattr(sg.translator.KVIndexTranslator, n)]
    return f"KVIndexTranslator has no {', '.join(lacks)} for the plan's readers" if lacks else None


@dataclass
class PlanReads:
    """What the plan's readers were handed, per sub-pool (``full``, ``sliding-window``), as plain lists."""

    page_size: int = 1
    row_width: int = 0  # W: a row's columns, whole pages
    pool_rows: list[int] = field(default_factory=list)  # each request's req_to_token row
    maps: dict[str, list[int]] = field(default_factory=dict)  # virtual page -> physical page (-1: not held)
    tables: dict[str, list[list[int]]] = field(default_factory=dict)  # the page table, bs + 1 rows
    streams_before: dict[str, list[int]] = field(default_factory=dict)  # the stream, no table built yet
    streams_after: dict[str, list[int]] = field(default_factory=dict)  # the stream packed from the table
    #: the read source a gather kernel is handed before this reader's table is built, resolved per token
    sources: dict[str, list[int]] = field(default_factory=dict)
    physical: dict[str, tuple[bool, bool]] = field(default_factory=dict)  # pack_read_stream's answers
    #: the page tables a captured graph reads, each filled by ``copy_page_table`` into a buffer of
    #: ``CAPTURED_LANES`` padding lanes past the batch, left stale (``STALE``) before: the plan's first
    #: table reader's (built in place), the same with no host lengths, a later reader's of the shared full
    #: sub-pool (copied), and a plan's table asked again for more rows (grown from the first build)
    captured: dict[str, list[list[int]]] = field(default_factory=dict)

    def virtual_slot(self, row: int, column: int) -> int:
        return self.page_size + row * self.row_width + column


#: padding lanes a captured page table holds past the live batch, and what a stale buffer holds before a fill
CAPTURED_LANES, STALE = 2, 0x7777


def run_reads(sg, heap: ShadowHeap, rows: int, row_width: int, rpi: torch.Tensor, seq_lens: torch.Tensor,
              d: int, page_size: int) -> PlanReads:
    """A plan over this batch's verify window (``d`` columns past each length) on a page-aligned
    translating pool of ``rows`` rows at least ``row_width`` wide, and each sub-pool's reads of it."""
    from vmfuzz.harness.targets.sglang.kv_translation import page_tables, translator_over
    width = -(-row_width // page_size) * page_size
    out = PlanReads(page_size=page_size, row_width=width, pool_rows=[int(v) for v in rpi])
    aligned = heap.alloc("aligned req_to_token", (rows, width), torch.int32, redzone_cells=4 * width + 64)
    aligned.copy_(page_size + torch.arange(rows * width, dtype=torch.int32).view(rows, width))
    full_map, swa_map = page_tables(page_size + rows * width, page_size)
    # a pool's read table covers every virtual page (-1 where the sub-pool holds none), as SGLang sizes it
    swa_map = swa_map + [-1] * (len(full_map) - len(swa_map))
    out.maps = {"full": full_map, "sliding-window": swa_map}
    # the second reader's sliding-window sub-pool: the same pages held, mapped elsewhere
    other_map = [-1 if q < 0 else len(full_map) - 1 - q for q in swa_map]
    out.maps["another reader's sliding-window"] = other_map
    translator = translator_over(sg, aligned, full_map, swa_map, page_size)
    other = translator_over(sg, aligned, full_map, other_map, page_size, swa_key="another reader's swa")
    other._spaces[sg.IdSpaceKind.FULL] = translator._spaces[sg.IdSpaceKind.FULL]  # one full sub-pool
    for t in (translator, other):
        t.device = "cpu"
        t._rows = torch.arange(rows, dtype=torch.int64)  # a translating pool's row ids (its __init__'s)
    bs = rpi.numel()
    window = torch.stack([aligned[int(r), int(s): int(s) + d] for r, s in zip(rpi, seq_lens)]).to(torch.int64)
    plan = translator.plan(req_pool_indices=rpi, seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(),
                           write_virtual=window.reshape(-1), read_extent=d)
    indptr = torch.zeros(bs + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(seq_lens, 0)
    total = int(indptr[-1])
    kinds = sg.IdSpaceKind
    # SGLang sizes the stream's programs from the length sum where its packing takes one (0.5.23 on)
    sizes = inspect.signature(sg.translator.KVIndexTranslator.pack_read_stream).parameters
    for name, reader, kind in (("full", translator, kinds.FULL), ("sliding-window", translator, kinds.SLIDING_WINDOW),
                               ("another reader's sliding-window", other, kinds.SLIDING_WINDOW)):
        answers = []
        src = reader.read_source(plan, req_pool_indices=rpi, bs=bs, kind=kind)
        out.sources[name] = [resolved(src, b, c, page_size) for b, s in enumerate(seq_lens.tolist()) for c in range(s)]
        for when in ("before", "after"):
            blocks = {}
            if when == "after":
                table = reader.read_table(plan, kind=kind, rows=bs + 1)
                out.tables[name] = table.ids.tolist()
                blocks = {k: v for k, v in (("num_token_blocks", None), ("kv_lens_sum", total)) if k in sizes}
            stream = heap.alloc(f"{name} read stream {when} the table", (max(total, 1),), torch.int32, fill=-1,
                                redzone_cells=64)
            answers.append(bool(reader.pack_read_stream(plan, req_pool_indices=rpi, seq_lens=seq_lens,
                                                        indptr=indptr, out=stream, kind=kind, **blocks)))
            (out.streams_before if when == "before" else out.streams_after)[name] = stream[:total].tolist()
        out.physical[name] = (answers[0], answers[1])
    _captured(sg, heap, out, translator, other, rpi, seq_lens, d, width // page_size)
    return out


def _captured(sg, heap: ShadowHeap, out: PlanReads, translator, other, rpi, seq_lens, d: int, row_pages: int) -> None:
    """The plan's page tables as a captured graph's buffers get them (``copy_page_table``), and a table asked
    again for more rows: fresh plans over the same window, so each is the plan's first build."""
    kinds, bs = sg.IdSpaceKind, rpi.numel()
    lanes = bs + CAPTURED_LANES

    def buffer(label: str):
        return heap.alloc(f"{label} captured page table", (lanes, row_pages), torch.int32, fill=STALE,
                          redzone_cells=4 * row_pages)

    def plan(host: bool):
        return translator.plan(req_pool_indices=rpi, seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone() if host else None,
                               write_virtual=None, read_extent=d)
    for name, kind in (("full", kinds.FULL), ("sliding-window", kinds.SLIDING_WINDOW)):
        shared = plan(host=True)
        first = buffer(name)
        translator.copy_page_table(shared, out=first, kind=kind)
        out.captured[f"{name}, built in place"] = first.tolist()
        hostless = buffer(f"{name} hostless")
        translator.copy_page_table(plan(host=False), out=hostless, kind=kind)
        out.captured[f"{name}, no host lengths"] = hostless.tolist()
        if kind == kinds.FULL:  # a later reader of the one full sub-pool copies the table the first one built
            later = buffer("another reader's full")
            other.copy_page_table(shared, out=later, kind=kind)
            out.captured["full, another reader's copy"] = later.tolist()
        grown = plan(host=True)
        translator.read_table(grown, kind=kind, rows=bs)
        out.captured[f"{name}, grown by {CAPTURED_LANES} rows"] = \
            translator.read_table(grown, kind=kind, rows=lanes).ids.tolist()


def resolved(src, b: int, j: int, page_size: int) -> int:
    """Token ``j`` of lane ``b`` as a gather kernel reads it from ``src``, by ``KVIndexTable``'s stated
    contract: the entry covering ``j`` in the lane's row, expanded to its token when it names a page,
    then through ``v2p`` (by pages; a negative id or an unheld page is the padding page 0)."""
    flat = src.ids.reshape(-1)
    entry = int(flat[int(src.row_ids[b]) * src.row_stride + j // src.entry_page_size])
    token = entry * src.entry_page_size + j % src.entry_page_size if src.entry_page_size > 1 else entry
    if src.v2p is None:
        return token
    page = int(src.v2p[token // page_size]) if token >= 0 else 0
    return max(page, 0) * page_size + token % page_size
