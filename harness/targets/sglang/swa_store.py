"""Where a DeepSeek V4 layer's KV store writes the verify window in its sliding-window (SWA) pool.

DeepSeek V4's layers store each step's KV twice: into the full pool at the forward
batch's ``out_cache_loc``, and into the SWA pool at the locations the attention
backend's ``get_swa_out_cache_loc`` hands its ``store_cache``. This module drives
``store_cache`` (hence ``get_swa_out_cache_loc``) on a ``DeepseekV4AttnBackend`` made by
its own ``__init__`` (``dsv4_backend``), once per branch a CPU can take, each time on the
case's verify window (the slots SGLang's window producer handed back, ``kv_locations``):

- **translated**: no cached locations, so the store translates the window through the
  pool's full->SWA map (``translate_loc_from_full_to_swa``, over a map this driver
  registers with the pool's own ``register_mapping``);
- **cached**: the core metadata carries the locations SGLang's in-graph prep caches for this
  batch (its translation of the same window), and the store takes them;
- **stale cache**: the cached locations are a previous step's, one request longer; the store
  must translate this batch's instead;
- **deferred commit**: a ``pre_kv_store_hook`` is set (DSpark's deferred draft-KV commit,
  whose ``join`` must land its pending stores before this store writes): the hook records
  a join into the same store log;
- **late-layer tail**: the metadata carries a late-layer tail (an extend whose late layers run
  over each request's last rows), whose own cached locations the store must take;
- **request window**: the pool keeps a DeepSeek V4.1 request window (SGLang's ``RequestWindow``
  made by its own ``__init__``, over a pool factory that records the sizes it is asked for),
  and the core metadata carries the batch's window layout (SGLang's ``window_layout`` of the
  window's rows and columns, as the backend's metadata prep builds it): the store activates
  that layout and writes its workspace rows;
- **idle**: an idle forward (zero-padded ``out_cache_loc``) with a same-length cached tensor left
  from a previous step, which it must not trust: every row writes the dummy slot; and on a request
  window, under the verify's (now stale) layout: its rows write the workspace past one window of
  history, under a layout of its own (where the window has one: ``activate_idle``).

The pool's store of each call (``set_swa_key_buffer_radix_fused``) is recorded, not performed:
its buffers are FlashMLA's packed layout, which this check does not read. What each run must
write is the meaning's (``model.kv_locations``: the node's own ``req_to_token`` cell, through the
SWA page table the driver handed the pool), judged by the property.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from vmfuzz.harness.model.errors import OutOfStep

_PROP = ("kv-location-soundness",)
DSV4_FILE = "srt/layers/attention/deepseek_v4_backend.py"
_WINDOW_FILE = "srt/mem_cache/dsv41_request_window.py"
#: What this module drives, for ``vmfuzz surface`` and the gate.
SURFACE: tuple = (
    (DSV4_FILE, "DeepseekV4AttnBackend.get_swa_out_cache_loc", _PROP),
    (DSV4_FILE, "DeepseekV4AttnBackend.store_cache", _PROP),
    ("srt/mem_cache/deepseek_v4_memory_pool.py", "DeepSeekV4TokenToKVPool.translate_loc_from_full_to_swa", _PROP),
    ("srt/mem_cache/deepseek_v4_memory_pool.py", "DeepSeekV4TokenToKVPool.register_mapping", _PROP),
    (_WINDOW_FILE, "RequestWindow.activate", _PROP),
)

#: DeepSeek V4's sliding window (its config's ``sliding_window``): a request window keeps this many history rows
#: per request run ahead of the live rows
SWA_WINDOW = 128
#: the batch size the DeepSeek V4 server a case's store runs on is started for (at least the case's own)
SERVED_BS = 16
#: rows of each request a late-layer tail keeps (fewer than any window's d >= 2 when d > 2)
TAIL_ROWS = 2
#: the layer whose store is recorded
LAYER_ID = 0
#: what a stale cached tensor holds: no slot of any pool (a store that took it writes outside the pool)
STALE = -7


@dataclass
class Store:
    """One ``store_cache`` call: the rows it was asked for and what the pool's store was handed."""

    run: str
    #: per row, the (request, node) whose KV it stores; an idle row is (None, None)
    rows: list[tuple[int | None, int | None]] = field(default_factory=list)
    #: the locations ``store_cache`` handed the SWA pool's store (None: it never reached the store)
    written: list[int] | None = None
    #: the store log around it: "join" for each deferred commit joined, "store" for the store itself
    log: list[str] = field(default_factory=list)
    hook_set: bool = False
    #: request window runs: the workspace rows the pool's window holds, and whether the layout active after
    #: the store is the batch's
    workspace_rows: int = 0
    layout_active: bool | None = None
    #: request window runs: the history rows the layout keeps ahead of the live rows (one window per request run)
    history_rows: int = 0


@dataclass
class SwaStores:
    """What DeepSeek V4's store was handed for one case."""

    page_size: int = 1
    swa_map: list[int] = field(default_factory=list)  # virtual page -> SWA physical page (-1: not held)
    swa_slots: int = 0  # the SWA pool's slots: [0, swa_slots)
    stores: list[Store] = field(default_factory=list)
    #: runs this release has no code for, and why (e.g. no pre_kv_store_hook before 0.5.23)
    absent_runs: dict[str, str] = field(default_factory=dict)
    #: why nothing was driven (None: it was): the release lacks the backend or its store
    absent: str | None = None
    not_driven: str | None = None


def absent(mod) -> str | None:
    """Why this SGLang has no DeepSeek V4 SWA store (None: it has one)."""
    if mod is None:
        return f"no {DSV4_FILE}"
    cls = getattr(mod, "DeepseekV4AttnBackend", None)
    if cls is None or not hasattr(cls, "get_swa_out_cache_loc"):
        return "DeepseekV4AttnBackend has no get_swa_out_cache_loc"
    if getattr(mod, "DSV4Metadata", None) is None:
        return "no DSV4Metadata"
    return None


def swa_page_table(slots: int, page_size: int) -> list[int]:
    """The SWA pool's page table over ``slots`` full slots (the driver's input): every third page evicted (-1),
    the others held in reverse order from SWA page 1 (page 0 is the SWA pool's padding page), so a location
    read through the wrong page, or not translated, lands elsewhere."""
    pages = -(-slots // page_size)
    held = [q for q in range(pages) if q % 3 != 2]
    table = [-1] * pages
    for j, q in enumerate(reversed(held)):
        table[q] = 1 + j
    return table


def swa_mapping(slots: int, swa_map: list[int], page_size: int) -> torch.Tensor:
    """The allocator's full->SWA map over ``slots`` full slots (the driver's input, as the page tables are the
    fused window's): each slot the same offset in the SWA page its page maps to, 0 for a page the SWA pool does
    not hold; slot 0, the pool's padding slot, the SWA pool's padding slot 0."""
    from vmfuzz.harness.model.kv_locations import physical_slot
    mapping = torch.tensor([physical_slot(v, swa_map, page_size) for v in range(slots)], dtype=torch.int64)
    mapping[0] = 0
    return mapping


class _RecordedPool:
    """A request window's pool factory: each pool it makes has the rows asked and one small KV buffer per
    layer (the window's copies are not run here; only the sizes are read)."""

    def __call__(self, rows: int, layers: int):
        return SimpleNamespace(size=rows, kv_buffer=[torch.zeros(1, dtype=torch.uint8) for _ in range(layers)],
                               kv_layout=None)


def run_stores(case, window: torch.Tensor, pool_rows: list[int], table_cells: int) -> SwaStores:
    """Each branch's store of ``case``'s verify ``window`` (``bs·d`` full-pool slots, request b's ``d`` nodes
    at ``[b·d, (b+1)·d)``; ``table_cells``: the full pool's slots, ``req_to_token``'s cells and its padding
    slot)."""
    from vmfuzz.harness.targets.sglang.imports import NotInRelease, sglang_module
    out = SwaStores(page_size=case.page_size)
    try:
        mod = sglang_module("sglang.srt.layers.attention.deepseek_v4_backend")
    except NotInRelease:
        mod = None
    out.absent = absent(mod)
    if out.absent:
        return out
    out.swa_map = swa_page_table(table_cells, case.page_size)
    out.swa_slots = (max(out.swa_map) + 1) * case.page_size
    mapping = swa_mapping(table_cells, out.swa_map, case.page_size)
    try:
        _run(mod, case, out, window, pool_rows, mapping)
    except OutOfStep as exc:
        out.stores, out.not_driven = [], f"a DeepSeek V4 server's backend is not made here: {exc}"
    return out


def _run(mod, case, out: SwaStores, window, pool_rows, mapping) -> None:
    from vmfuzz.harness.targets.sglang.imports import sglang_module
    bs, d = case.bs, case.d
    rows = [(b, x) for b in range(bs) for x in range(d)]
    backend, _ = _server(mod, _numbers(case))
    backend.token_to_kv_pool.register_mapping(mapping)
    fm = sglang_module("sglang.srt.model_executor.forward_batch_info").ForwardMode
    verify = SimpleNamespace(forward_mode=fm.TARGET_VERIFY, out_cache_loc=window)

    def metadata(swa_out_cache_loc=None, request_window_layout=None, late_layer_tail=None):
        # the two core fields the store reads; the rest of DeepSeek V4's metadata is its FlashMLA prep's (a
        # release without late-layer tails has no such field: none is handed there)
        core = SimpleNamespace(swa_out_cache_loc=swa_out_cache_loc, request_window_layout=request_window_layout)
        tail = {} if late_layer_tail is None else {"late_layer_tail": late_layer_tail}
        return mod.DSV4Metadata(core, None, **tail)

    pool = backend.token_to_kv_pool
    out.stores.append(_store(backend, "translated", verify, metadata(), rows))
    # what SGLang's in-graph prep caches for this batch: its own translation of the window
    cached = pool.translate_loc_from_full_to_swa(window).to(torch.int32)
    out.stores.append(_store(backend, "cached", verify, metadata(cached), rows))
    stale = torch.full((window.numel() + d,), STALE, dtype=torch.int32)
    out.stores.append(_store(backend, "stale cache", verify, metadata(stale), rows))
    if "pre_kv_store_hook" in vars(mod.DeepseekV4AttnBackend):
        out.stores.append(_store(backend, "deferred commit", verify, metadata(), rows, hook=True))
    else:
        out.absent_runs["deferred commit"] = "DeepseekV4AttnBackend has no pre_kv_store_hook"
    _tail(mod, fm, backend, out, window, rows, metadata, d)
    idle = SimpleNamespace(forward_mode=fm.IDLE, out_cache_loc=torch.zeros(window.numel(), dtype=torch.int64))
    out.stores.append(_store(backend, "idle", idle, metadata(cached), [(None, None)] * len(rows)))
    _request_window(mod, case, out, window, pool_rows, rows, metadata, verify)


def _numbers(case):
    from vmfuzz.harness.model.allocation import ServerNumbers
    # a DeepSeek V4 server drafts chains (its __init__ asserts topk 1): the store reads nothing of the draft's
    # shape, only the batch's window, which is the case's; one server serves every batch of up to SERVED_BS
    return ServerNumbers(max(case.bs, SERVED_BS), case.context_len, case.d, 1, case.spec_steps)


@functools.lru_cache(maxsize=64)
def _server(mod, n, rw=None):
    """The backend of a DeepSeek V4 server started with ``n`` (made once per server: a server keeps its backend
    and pool across steps), and, where ``rw`` (the request-window module) is given, its pool's request window:
    SGLang's ``RequestWindow`` over ``_RecordedPool``, a slot per request and the dummy, each slot a context plus a
    window, the workspace a server sizes before capture for its largest layouts (a verify of ``max_bs`` requests'
    windows, an idle forward of one row more)."""
    from vmfuzz.harness.targets.sglang import dsv4_backend
    from vmfuzz.harness.targets.sglang.seams import call_with
    # bound by name: a release whose window asks for what this does not hand is out of step
    window = None if rw is None else call_with(
        rw.RequestWindow, "RequestWindow.__init__", _WINDOW_FILE, _RecordedPool(), num_slots=n.max_bs + 1, layers=1,
        page_size=4, capacity=n.context_len + n.num_draft_tokens,
        workspace_rows=n.max_bs * (SWA_WINDOW + n.num_draft_tokens) + 1)
    return dsv4_backend.built_by_init(mod, mod.DeepseekV4AttnBackend, n, request_window=window), window


def _store(backend, run: str, batch, metadata, rows, hook: bool = False) -> Store:
    """``store_cache`` of one layer on ``batch`` under ``metadata``, the pool's store recorded."""
    s = Store(run=run, rows=list(rows), hook_set=hook)
    pool = backend.token_to_kv_pool

    def record(layer_id, swa_loc, cache_k):
        s.log.append("store")
        s.written = [int(v) for v in swa_loc.reshape(-1)]
    vars(pool)["set_swa_key_buffer_radix_fused"] = record
    backend.forward_metadata = metadata
    backend.pre_kv_store_hook = (lambda: s.log.append("join")) if hook else None
    try:
        backend.store_cache(LAYER_ID, torch.zeros(len(rows), 1), batch)
    finally:
        backend.pre_kv_store_hook = None
        vars(pool).pop("set_swa_key_buffer_radix_fused", None)
    return s


def _tail(mod, fm, backend, out: SwaStores, window, rows, metadata, d: int) -> None:
    """An extend of the window's ``d`` tokens per request whose late layers run over each request's last
    ``TAIL_ROWS`` rows: the tail's locations are SGLang's translation of those rows' slots."""
    tail_cls = getattr(mod, "LateLayerTail", None)
    if tail_cls is None or "late_layer_tail" not in getattr(mod.DSV4Metadata, "__dataclass_fields__", {}):
        out.absent_runs["late-layer tail"] = "no LateLayerTail in this release"
        return
    t = min(TAIL_ROWS, d)
    picked = [j for j, (b, x) in enumerate(rows) if x >= d - t]
    index = torch.tensor(picked, dtype=torch.int64)
    bs = len(rows) // d
    tail = tail_cls(token_indices=index, positions=index.clone(), extend_seq_lens=torch.full((bs,), t),
                    extend_seq_lens_cpu=[t] * bs,
                    swa_out_cache_loc=backend.token_to_kv_pool.translate_loc_from_full_to_swa(window[index]).to(
                        torch.int32))
    extend = SimpleNamespace(forward_mode=fm.EXTEND, out_cache_loc=window)
    # the full extend's cached locations are there too: the tail's rows must win over them
    full = backend.token_to_kv_pool.translate_loc_from_full_to_swa(window).to(torch.int32)
    out.stores.append(_store(backend, "late-layer tail", extend, metadata(full, late_layer_tail=tail),
                             [rows[j] for j in picked]))


def _request_window(mod, case, out: SwaStores, window, pool_rows, rows, metadata, verify) -> None:
    """The store on a pool keeping a request window, under the batch's window layout; then an idle forward of one
    row more under that same (now stale) metadata, where the window has an idle layout of its own."""
    from vmfuzz.harness.targets.sglang.imports import NotInRelease, sglang_module
    try:
        rw = sglang_module("sglang.srt.mem_cache.dsv41_request_window")
    except NotInRelease:
        out.absent_runs["request window"] = f"no {_WINDOW_FILE}"
        return
    bs, n = case.bs, len(rows)
    backend, request_window = _server(mod, _numbers(case), rw)
    # as the backend's metadata prep lays it out for a verify: each query's request row and its column
    req = torch.tensor([pool_rows[b] for b, _ in rows], dtype=torch.int64)
    pos = torch.tensor([case.seq_lens[b] + x for b, x in rows], dtype=torch.int64)
    extra = {"zero_row": request_window.zero_row} if "zero_row" in inspect.signature(rw.window_layout).parameters \
        else {}
    layout = rw.window_layout(req, pos, window=SWA_WINDOW, capacity=request_window.capacity, num_groups=bs, **extra)
    stale = metadata(request_window_layout=layout)
    s = _store(backend, "request window", verify, stale, rows)
    s.workspace_rows = request_window.workspace.size
    s.layout_active = request_window.layout is layout
    s.history_rows = bs * SWA_WINDOW
    out.stores.append(s)
    if not hasattr(request_window, "activate_idle"):
        out.absent_runs["idle on a request window"] = "RequestWindow has no activate_idle"
        return
    fm = sglang_module("sglang.srt.model_executor.forward_batch_info").ForwardMode
    idle = SimpleNamespace(forward_mode=fm.IDLE, out_cache_loc=torch.zeros(n + 1, dtype=torch.int64))
    s = _store(backend, "idle on a request window", idle, stale, [(None, None)] * (n + 1))
    s.workspace_rows = request_window.workspace.size
    # an idle forward's rows are one run of empty requests: one window of history ahead of them
    s.layout_active = request_window.layout is not layout
    s.history_rows = SWA_WINDOW
    out.stores.append(s)
