"""The KV-index translator's gather, standing in for the Triton backend's readers.

SGLang's target-verify metadata asks its KV-index translator to gather each
request's KV slots into ``kv_indices``; the real translator reads the request-
to-token pool, which vmfuzz does not build. The stand-in's table hands out a
distinct slot per (pool slot, token) (``vmfuzz.harness.model.readers.kv_slot``), so a
gather of the wrong request's slots, the wrong tokens, too few or too many
shows in what the reader reads or in the buffer's redzone.

Releases whose translator calls its gather ``fill_packed_read_stream`` (0.5.20,
0.5.21) are driven the same way. Releases that launch a gather kernel over a
request-to-token table themselves (0.5.19 through the translator's index-table
view, earlier ones over the backend's own table) read a stand-in table of the
same slots (``readers.kv_slot_table``), and the launch is stood in by
``GathersFromTable``, which gathers from whatever table, rows, lengths and
offsets the backend hands it, so each of those is SGLang's own.
"""

from __future__ import annotations


import inspect
from types import SimpleNamespace

import torch

from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.model.readers import kv_slot_stride, stale_kv_indices
from vmfuzz.harness.targets.sglang.seams import TranslatesNothing, bind
from vmfuzz.harness.targets.sglang.seams import _NoKvField as NO_KV_FIELD

TRANSLATOR = "srt/mem_cache/kv_index_translator.py"


class GathersKvSlots(TranslatesNothing):
    """The KV-index translator, standing in: its gather writes real, distinct KV slots.

    ``pack_read_stream`` fills request b's CSR row of ``out`` -- ``seq_lens[b]``
    ids from ``indptr[b]`` on, as SGLang's gather does -- with the slots the
    stand-in request-to-token table holds for the request in pool slot
    ``req_pool_indices[b]`` (``readers.kv_slot``), through the shadow heap: a row
    written past ``out`` lands in its redzone; a static window pool's slot map
    handed as ``token_mapping`` is applied to each id, as SGLang's gather fuses
    it. Everything else does as ``TranslatesNothing`` does.
    """

    def __init__(self, heap: ShadowHeap, max_context_len: int, table: torch.Tensor | None = None):
        super().__init__()
        self.heap, self.max_context_len = heap, max_context_len
        #: the stand-in request-to-token table (``readers.kv_slot_table``) that gathers outside this one read
        self.table = table
        #: where this gather wrote (``out``'s data pointers): a buffer it never wrote is not judged for ids
        self.gathered_into: set[int] = set()

    def pack_read_stream(self, *args, **kwargs):
        return self._stream("pack_read_stream", args, kwargs)

    def fill_packed_read_stream(self, *args, **kwargs):
        """The same gather under its name in releases before ``pack_read_stream`` (0.5.20, 0.5.21)."""
        return self._stream("fill_packed_read_stream", args, kwargs)

    def build_index_table(self, *args, **kwargs):
        """0.5.19's per-batch view of what the KV gather reads: SGLang's own method, run as on a pool
        whose ids need no translating, over the stand-in table."""
        return self._as_plain_pool("build_index_table", args, kwargs)

    def index_table_for_batch(self, *args, **kwargs):
        """0.5.19's eager path asks for the same view through this (memoized per batch): SGLang's own
        method too, over the same plain pool, its ``build_index_table`` SGLang's."""
        return self._as_plain_pool("index_table_for_batch", args, kwargs)

    def _as_plain_pool(self, method: str, args, kwargs):
        self.calls.append(method)
        fn, build = _real(self, method), _real(self, "build_index_table")
        pool = SimpleNamespace(is_translating=False, defer_read_translate=False, req_to_token=self.table,
                               _index_table_memo=None)
        pool.build_index_table = lambda *a, **k: build(pool, *a, **k)
        try:
            return fn(pool, *args, **kwargs)
        except AttributeError as exc:
            if getattr(exc, "obj", None) is pool:
                raise OutOfStep(f"KVIndexTranslator.{method}", TRANSLATOR,
                                f"reads {exc.name!r}, which the stand-in translator does not set") from None
            raise

    def _stream(self, method: str, args, kwargs) -> bool:
        self.calls.append(method)
        seam = f"KVIndexTranslator.{method}"
        got = bind(_real(self, method), seam, TRANSLATOR, self, *args, **kwargs).arguments
        missing = [n for n in ("req_pool_indices", "seq_lens", "indptr", "out") if n not in got]
        if missing:
            raise OutOfStep(seam, TRANSLATOR, f"the call names no {', '.join(missing)}")
        self.gathered_into.add(got["out"].data_ptr())
        stride = kv_slot_stride(self.max_context_len)
        # a static window pool's map fused into the gather, as SGLang's kernel applies it to each id it reads
        mapping = got.get("token_mapping")
        _gather(self.heap, got["out"], got["req_pool_indices"], got["seq_lens"], got["indptr"],
                got.get("kv_start_idx"), lambda slot, tokens: _mapped((slot + 1) * stride + tokens, mapping))
        return True  # the stand-in's slots are final ids (mapped where a map was handed)


def _mapped(ids: torch.Tensor, mapping: torch.Tensor | None) -> torch.Tensor:
    """``ids`` through a slot map (an id past its end is none: -1)."""
    if mapping is None:
        return ids
    inside = (ids >= 0) & (ids < mapping.numel())
    return torch.where(inside, mapping[ids.clamp(0, mapping.numel() - 1)], -1)


def _real(translator, method: str):
    """SGLang's own ``KVIndexTranslator.<method>``; one this release lacks is vmfuzz out of step."""
    from vmfuzz.harness.targets.sglang.imports import sglang_module
    try:
        # a translator module that raises on import is decided there (a finding, or out of step)
        real = sglang_module("sglang." + TRANSLATOR.removesuffix(".py").replace("/", "."))
        return getattr(real.KVIndexTranslator, method)
    except (ImportError, AttributeError) as exc:
        raise OutOfStep(f"KVIndexTranslator.{method}", TRANSLATOR, f"not found ({exc})") from None


class GathersFromTable:
    """Stands where releases before the translator launch their KV-id gather kernel over the table.

    ``kernel[grid](...)`` binds the call by the kernel's own parameter names and
    gathers as the kernel does -- request b's ``lens[b]`` ids from column
    ``start[b]`` of row ``rows[b]`` (row pitch: the stride it is handed) into
    ``out`` from ``indptr[b]`` on -- through the shadow heap. Ids are read from the
    table the backend passed, so a wrong table, row, stride or column shows; a
    read past the table's end yields a stale id, never a slot. A launch over a
    table other than ``table`` (one vmfuzz did not fill) writes nothing and leaves
    its buffer unjudged.
    """

    def __init__(self, kernel, translator: GathersKvSlots):
        self.translator, self.table = translator, translator.table
        self.params = list(inspect.signature(getattr(kernel, "fn", kernel)).parameters)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def _launch(self, grid, args, kwargs) -> None:
        self.translator.calls.append(KV_GATHER)
        got = dict(zip(self.params, args), **kwargs)
        names = ("req_to_token", "req_pool_indices", "lens", "kv_indptr", "kv_start_idx", "kv_indices", "stride")
        table, pool, lens, indptr, start, out, stride = [got.get(p) for p in (self.params + [""] * 7)[:7]]
        if any(isinstance(v, NO_KV_FIELD) for v in got.values()):
            return  # 0.5.19's index-table view from the no-KV translator (``TranslatesNothing``): nothing to judge
        paged = [p for p in self.params[7:] if "PAGE" in p.upper() and got.get(p, 1) != 1]
        if table is None or out is None or paged or not isinstance(stride, int):
            raise OutOfStep(KV_GATHER, "the KV-id gather kernel",
                            f"the launch does not name {', '.join(names)} as the stand-in reads them "
                            f"(parameters {self.params}{', paged' if paged else ''})")
        if self.table is None or not isinstance(table, torch.Tensor) or table.data_ptr() != self.table.data_ptr():
            return
        lanes = int(grid[0]) if isinstance(grid, tuple) else int(lens.numel())
        flat = self.table.reshape(-1).to(torch.int64)

        def read(slot: int, tokens: torch.Tensor) -> torch.Tensor:
            at = slot * stride + tokens
            ok = (at >= 0) & (at < flat.numel())
            return torch.where(ok, flat[at.clamp(0, flat.numel() - 1)], -1)

        self.translator.gathered_into.add(out.data_ptr())
        _gather(self.translator.heap, out, pool, lens[:lanes], indptr, start, read)


#: The module global releases before the translator launch the gather through.
KV_GATHER = "create_flashinfer_kv_indices_triton"


def _gather(heap: ShadowHeap, out: torch.Tensor, pool: torch.Tensor, seq_lens: torch.Tensor,
            indptr: torch.Tensor, start: torch.Tensor | None, ids_of) -> None:
    """Request b's ids (``ids_of(pool slot, token columns)``) into its CSR row of ``out``."""
    lanes = int(seq_lens.numel())
    assert pool.numel() >= lanes, f"pack_read_stream: {lanes} stream lanes, {pool.numel()} request rows"
    slots, lens, rows = pool.reshape(-1).tolist(), seq_lens.reshape(-1).tolist(), indptr.reshape(-1).tolist()
    first = [0] * lanes if start is None else start.reshape(-1).tolist()
    if heap.backing_of(out) is None:
        out.copy_(stale_kv_indices(out.numel(), out.device))  # what torch.empty left: no slot id

    def gather(t):
        buf = t["kv_indices"]
        # A launch's programs run in no set order; last first, so a row written
        # into the next one's cells is not hidden by that row's own writes.
        for b in reversed(range(lanes)):
            tokens = torch.arange(int(first[b]), int(first[b]) + max(int(lens[b]), 0), device=buf.device)
            ids = ids_of(int(slots[b]), tokens)
            heap.store(buf, int(rows[b]) + tokens - int(first[b]), ids.to(buf.dtype))

    # a gather from a start token is a sliding window's: a stray write names that buffer
    name = "kv_indices" if start is None else "window_kv_indices"
    heap.run_kernel(lambda t: gather({"kv_indices": t[name]}), {name: out}, {name: max(64, int(seq_lens.sum()))})


def translator_module():
    """SGLang's KV-index translator module, or None where this release has none."""
    import importlib.util

    from vmfuzz.harness.targets.sglang.imports import sglang_module
    name = "sglang.srt.mem_cache.kv_index_translator"
    return sglang_module(name) if importlib.util.find_spec(name) is not None else None


def static_translator(cls, table: torch.Tensor, page_size: int):
    """The KV-index translator of a static pool (reads pass through): by its own ``__init__`` where that
    takes the pools (0.5.21: no translating allocator, so it translates nothing), else assembled with no
    id spaces (0.5.23's, whose ``__init__`` asks for a server's pools)."""
    import inspect
    if "token_to_kv_pool_allocator" in inspect.signature(cls.__init__).parameters:
        translator = cls(req_to_token=table, token_to_kv_pool_allocator=None, token_to_kv_pool=None,
                         page_size=page_size, device="cpu")
    else:
        translator = object.__new__(cls)
        translator.req_to_token, translator._spaces = table, {}
    translator.bind_runner_slots = lambda fb: None
    return translator
