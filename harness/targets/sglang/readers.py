"""SGLang's mask readers, driven with stand-ins: the Triton backend's mask_indptr and metadata.

Triton attention (``TritonAttnBackend``): the instance is made by its own
``__init__`` over a stand-in model runner (a request pool the size of the
largest batch), the server-wide config it reads bound for the call, then given
what its cuda-graph set-up would: a redzoned cuda-graph KV-index buffer, and
the verify mask the call site wrote into; its KV-index translator is replaced
by one whose gather writes each request's slots from a stand-in
request-to-token table (``kv_ids.GathersKvSlots``). So what ``__init__`` derives
is SGLang's own, wherever it now sets it and however the class stores it. Then
SGLang's own methods run: ``init_forward_metadata`` for an eager TARGET_VERIFY
batch, and ``init_forward_metadata_out_graph`` twice for the cuda graph, once
capturing (a placeholder mask for max_bs requests at the fill length, as the
graph runner passes) and once replaying the real batch, which copies the step's
mask into the backend's buffer and refills the indptrs and KV indices in place.
The reader's view is what the metadata then holds: qo_indptr, kv_indptr,
kv_indices, max_extend_len, mask_indptr and the mask.

A replay runs in the smallest captured graph that holds the batch
(``readers.captured_bs``), padded up with requests at the fill length.

FlashInfer's verify plan and packing: ``flashinfer``.
"""

from __future__ import annotations

import contextlib
import functools
from types import SimpleNamespace

import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode, logical_size
from vmfuzz.harness.model.readers import (ReaderView, WindowView, capture_seq_len, captured_bs, kv_slot_table,
                                          pool_slots, stale_kv_indices)
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.kv_ids import KV_GATHER, GathersFromTable, GathersKvSlots
from vmfuzz.harness.targets.sglang.loader import _quiet_import
from vmfuzz.harness.targets.sglang.reach import patches_everywhere
from vmfuzz.harness.targets.sglang.seams import call_method, unset_by_harness
from vmfuzz.harness.targets.sglang.stand_in import StandIn, watch_unset

TRITON_FILE = "srt/layers/attention/triton_backend.py"

#: What this module drives: (path under the sglang package, function, properties).
SURFACE = (
    ("srt/layers/attention/triton_backend.py", "TritonAttnBackend.init_forward_metadata", ("reader-agreement",)),
    ("srt/layers/attention/triton_backend.py", "TritonAttnBackend.init_forward_metadata_out_graph",
     ("reader-agreement",)),
    ("srt/layers/attention/triton_backend.py", "TritonAttnBackend._apply_cuda_graph_metadata", ("reader-agreement",)),
    ("srt/layers/attention/triton_backend.py", "TritonAttnBackend._update_target_verify_buffers",
     ("reader-agreement",)),
    ("srt/layers/attention/triton_backend.py", "TritonAttnBackend._build_cuda_graph_forward_metadata",
     ("reader-agreement",)),
    ("srt/layers/attention/triton_backend.py", "TritonAttnBackend._fill_kv_indptr_and_indices",
     ("reader-agreement",)),
    ("srt/layers/attention/triton_backend.py", "TritonAttnBackend._init_forward_metadata_out_graph",
     ("reader-agreement",)),
    ("srt/layers/attention/triton_backend.py", "update_sliding_window_buffer", ("reader-agreement",)),
)

_MODULES = {
    "triton_backend": "sglang.srt.layers.attention.triton_backend",
    "flashinfer_backend": "sglang.srt.layers.attention.flashinfer_backend",
    "eagle_info": "sglang.srt.speculative.eagle_info",
    "forward_info": "sglang.srt.model_executor.forward_batch_info",
}


@functools.lru_cache(maxsize=None)
def modules() -> SimpleNamespace:
    """SGLang's reader modules, imported on first use (the core properties never need them)."""
    from vmfuzz.harness.targets.sglang.imports import sglang_module
    with _quiet_import():
        # each failure as imports.decide says: not in this release, SGLang's own raise, or out of step
        found = {key: sglang_module(name) for key, name in _MODULES.items()}
    return SimpleNamespace(**found)


def _seq_lens(batch: Batch, dev) -> torch.Tensor:
    return torch.tensor(batch.seq_lens, dtype=torch.long, device=dev)


# -- Triton attention --------------------------------------------------------------

@contextlib.contextmanager
def _stand_in_checked(backend):
    """An attribute the backend's own code sets but the stand-in lacks is vmfuzz out of step."""
    module = modules().triton_backend
    # bound wherever the gather is held, so a launch moved into a helper of another module is stood in too
    kernel = getattr(module, KV_GATHER, None)
    gather = (patches_everywhere(kernel, GathersFromTable(kernel, backend.kv_index_translator),
                                 (module, KV_GATHER))
              if kernel is not None else [])
    try:
        with bound(*gather):
            yield
    except AttributeError as exc:
        unset_by_harness(exc, backend, type(backend), "TritonAttnBackend stand-in",
                         "srt/layers/attention/triton_backend.py")
        raise


def triton_backend(mask, config: Config, pool: int, dev, heap: ShadowHeap, graphs: bool,
                   window: int | None = None, kv_pool=None):
    """A ``TritonAttnBackend`` made by its own ``__init__`` for a server with ``config``'s numbers and a
    request pool ``pool`` deep, then given what its cuda-graph set-up would: the KV-id buffer and ``mask``.
    ``window``: its model reads a sliding window of that many tokens, so the set-up also gives it the
    window's KV-id and mask-offset buffers (redzoned, holding no slot id or offset yet). ``kv_pool``: the
    server's KV pool, where it is not one ordinary pool (``swa_server``'s window pool).

    So what ``__init__`` derives (indptr buffers, draft width, context length)
    is SGLang's own, wherever it now sets it and however the class stores it
    (``__slots__`` too). ``graphs``: it will capture cuda graphs, so its KV-index
    buffer is allocated (on ``heap``, redzoned, holding no slot id yet), as
    SGLang's is at start-up.
    """
    from vmfuzz.harness.model.allocation import ServerNumbers
    from vmfuzz.harness.targets.sglang.allocation import built_by_init

    m = modules()
    numbers = ServerNumbers(pool, config.max_context_len, config.d, config.topk, config.spec_steps)
    backend = built_by_init(m.triton_backend, m.triton_backend.TritonAttnBackend, numbers, dev,
                            sliding_window_size=window, kv_pool=kv_pool)
    max_num_tokens = config.max_bs * config.d
    kv_cells = max(1, max_num_tokens * config.max_context_len)
    # What init_cuda_graph_state would set (the KV-id buffer it sizes so, the mask it allocates).
    if graphs:
        kv_indices = heap.alloc("kv_indices", kv_cells, torch.int64, redzone_cells=config.max_context_len + 64)
        kv_indices.copy_(stale_kv_indices(kv_cells, dev))
    else:
        kv_indices = torch.zeros(kv_cells, dtype=torch.int64, device=dev)
    backend.cuda_graph_kv_indices = kv_indices
    if graphs and window:
        _window_buffers(backend, config, heap, max_num_tokens * window, dev)
    backend._verify_mask = mask
    # The stand-in runner's translator packs nothing: this one gathers distinct slots per request.
    # Releases that launch the KV gather themselves read a request-to-token table: the backend's own
    # (before the translator) or the translator's view of it (0.5.19), both the stand-in table of
    # the translator's slots (``kv_ids.GathersFromTable``).
    table = None
    if hasattr(modules().triton_backend, KV_GATHER):
        # a row past the pool's depth too: SGLang keeps pool row 0 for padding, so a driver that seats its
        # requests from row 1 (the draft extend's) reads row max_bs; a launch reading past the table reads
        # whatever memory lies beyond it
        table = kv_slot_table(max(pool, config.max_bs) + 1, config.max_context_len, dev)
        backend.req_to_token = table
    backend.kv_index_translator = GathersKvSlots(heap, config.max_context_len, table)
    # 0.5.19 keeps the captured KV-id tables in kv_read_tables (none: its view is built per batch).
    for attr in ("_translate_kv_loc", "kv_read_tables"):
        if not hasattr(backend, attr):
            setattr(backend, attr, None)
    if graphs:  # what the set-up sets that vmfuzz did not build above: a read of one is vmfuzz's gap
        watch_unset(backend, "TritonAttnBackend's cuda-graph set-up (init_cuda_graph_state)",
                    "srt/layers/attention/triton_backend.py", "init_cuda_graph_state",
                    ("cuda_graph_kv_indices", "_verify_mask", "kv_index_translator", "cuda_graph_window_kv_indices",
                     "cuda_graph_window_kv_offsets", "cuda_graph_window_num_kv_splits"))
    return backend


def _window_buffers(backend, config: Config, heap: ShadowHeap, cells: int, dev) -> None:
    """What ``init_cuda_graph_state`` gives a sliding-window backend: room for max_num_tokens windows of
    KV ids, and an offset per request. Stale (negative) until the replay writes them, so an entry the
    replay leaves unwritten is never read as right."""
    ids = heap.alloc("window_kv_indices", max(1, cells), torch.int64, redzone_cells=max(64, cells // config.d))
    ids.copy_(stale_kv_indices(ids.numel(), dev))
    offsets = heap.alloc("window_kv_offsets", config.max_bs, torch.int32, redzone_cells=64)
    offsets.fill_(-1)
    backend.cuda_graph_window_kv_indices = ids
    backend.cuda_graph_window_kv_offsets = offsets
    backend.cuda_graph_window_num_kv_splits = torch.ones(config.max_bs * config.d, dtype=torch.int32, device=dev)


def _verify_batch(m, batch_size: int, seq_lens: torch.Tensor, custom_mask, d: int, sum_known: bool = True,
                  capture: bool = False):
    """``sum_known=False``: the overlap scheduler's batch, whose ``seq_lens_sum`` it never copied to the host.

    The mask is what the reader is judged on, so outside a capture (whose metadata
    is the placeholder's) the spec info's ``custom_mask`` is load-bearing."""
    spec_info = StandIn("verify spec info's custom_mask", TRITON_FILE,
                        load_bearing=() if capture else ("custom_mask",),
                        custom_mask=custom_mask, num_tokens_per_req=d)
    return StandIn(
        "ForwardBatch", "srt/model_executor/forward_batch_info.py",
        batch_size=batch_size, forward_mode=m.forward_info.ForwardMode.TARGET_VERIFY, spec_info=spec_info,
        seq_lens=seq_lens, seq_lens_sum=int(seq_lens.sum()) if sum_known else None,
        req_pool_indices=torch.tensor(pool_slots(batch_size), dtype=torch.long, device=seq_lens.device),
        kv_loc_plan=None, encoder_lens=None, out_cache_loc=None)


def _view(meta, backend, graph_bs: int | None = None, window: int | None = None) -> ReaderView:
    """What the metadata holds; KV indices only where the gather went through the stand-in's gather.
    ``window``: the server's sliding window, whose metadata is then read (a backend that made none
    holds None there, which is judged as missing)."""
    gathered = backend.kv_index_translator.gathered_into  # the stand-in's slots are what to judge
    if window:
        ids = getattr(meta, "window_kv_indices", None)
        window = WindowView(window, getattr(meta, "window_kv_indptr", None), ids if _in(ids, gathered) else None,
                            getattr(meta, "window_kv_offsets", None))
    return ReaderView(meta.custom_mask, meta.mask_indptr, graph_bs, qo_indptr=meta.qo_indptr,
                      kv_indptr=meta.kv_indptr,
                      kv_indices=meta.kv_indices if _in(meta.kv_indices, gathered) else None,
                      max_extend_len=meta.max_extend_len, window=window or None)


def _in(t, gathered: set[int]) -> bool:
    return t is not None and t.data_ptr() in gathered


def read_eager(config: Config, batch: Batch, step, heap: ShadowHeap, window: int | None = None,
               sum_known: bool = True) -> ReaderView:
    """``TritonAttnBackend.init_forward_metadata`` for an eager TARGET_VERIFY batch (on a server whose
    model reads a sliding ``window``, if given; with ``sum_known=False``, as the overlap scheduler hands
    the batch, its total length unknown on the host)."""
    m = modules()
    dev = step.tree_mask.device
    backend = triton_backend(None, config, max(config.max_bs, batch.bs), dev, heap, graphs=False, window=window)
    with _stand_in_checked(backend):
        call_method(backend, "init_forward_metadata",
                    forward_batch=_verify_batch(m, batch.bs, _seq_lens(batch, dev), step.tree_mask, config.d,
                                                sum_known))
    return _view(backend.forward_metadata, backend, window=window)


def read_replay(mask, config: Config, batch: Batch, step, heap: ShadowHeap, window: int | None = None) -> ReaderView:
    """Capture the graph ``batch`` replays in over ``mask``, let the step write, replay the batch.

    The graph's batch size is the smallest captured size >= bs; the replay pads
    the batch up to it with requests at the fill length, as the graph runner does.
    """
    m = modules()
    buf = mask.buffer
    dev = buf.device
    graph_bs = captured_bs(batch.bs, config.max_bs)
    backend = triton_backend(mask, config, max(config.max_bs, batch.bs), dev, heap, graphs=True, window=window)
    fill = capture_seq_len(config)
    # The graph runner's capture-time mask: all ones, max_bs requests at the fill length.
    placeholder = torch.ones(logical_size(TreeMaskMode.FULL_MASK, [fill] * config.max_bs, config.d),
                             dtype=torch.bool, device=dev)
    padding = torch.full((graph_bs - batch.bs,), fill, dtype=torch.long, device=dev)
    capture = _verify_batch(m, graph_bs, torch.full((graph_bs,), fill, dtype=torch.long, device=dev),
                            placeholder, config.d, capture=True)
    with _stand_in_checked(backend):
        call_method(backend, "init_forward_metadata_out_graph", forward_batch=capture, in_capture=True)
    # The step's writes land after capture; a reused step wrote the buffer itself.
    if step.reused:
        buf.copy_(step.tree_mask.to(dev).view(buf.shape))
        custom_mask = buf
    else:
        custom_mask = step.tree_mask.to(dev)
    replay = _verify_batch(m, graph_bs, torch.cat([_seq_lens(batch, dev), padding]), custom_mask, config.d)
    with _stand_in_checked(backend):
        call_method(backend, "init_forward_metadata_out_graph", forward_batch=replay, in_capture=False)
    return _view(backend.forward_metadata, backend, graph_bs, window)


class ServerReader:
    """One ``TritonAttnBackend`` serving a case's batches in a server's order.

    The fresh readers above build a backend per batch, so its ``mask_indptr``
    starts zeroed every time; a server keeps one backend for its whole life. So
    here the graphs are captured once, largest first from max_bs down, over the
    verify mask every step then reuses, and each batch then runs eagerly and in
    the replay of its captured graph through that same backend. A graph keeps
    the metadata its capture made (views into the backend's buffers), so a
    replay is read through the metadata of the graph it replays in.
    """

    def __init__(self, mask, config: Config, pool: int, heap: ShadowHeap):
        m, dev = modules(), mask.buffer.device
        self.config, self.mask = config, mask
        # The request pool holds the largest batch the server will see, eager ones past max_bs too.
        self.backend = triton_backend(mask, config, max(pool, config.max_bs), dev, heap, graphs=True)
        fill = capture_seq_len(config)
        placeholder = torch.ones(logical_size(TreeMaskMode.FULL_MASK, [fill] * config.max_bs, config.d),
                                 dtype=torch.bool, device=dev)
        self.graphs = {}
        for graph_bs in sorted({captured_bs(n, config.max_bs) for n in range(1, config.max_bs + 1)}, reverse=True):
            capture = _verify_batch(m, graph_bs, torch.full((graph_bs,), fill, dtype=torch.long, device=dev),
                                    placeholder, config.d, capture=True)
            with _stand_in_checked(self.backend):
                call_method(self.backend, "init_forward_metadata_out_graph", forward_batch=capture, in_capture=True)
            self.graphs[graph_bs] = self.backend.forward_metadata

    def eager(self, batch: Batch, step) -> ReaderView:
        dev = step.tree_mask.device
        with _stand_in_checked(self.backend):
            call_method(self.backend, "init_forward_metadata",
                        forward_batch=_verify_batch(modules(), batch.bs, _seq_lens(batch, dev), step.tree_mask,
                                                    self.config.d))
        return _view(self.backend.forward_metadata, self.backend)

    def replay(self, batch: Batch, step) -> ReaderView:
        buf = self.mask.buffer
        dev = buf.device
        graph_bs = captured_bs(batch.bs, self.config.max_bs)
        padding = torch.full((graph_bs - batch.bs,), capture_seq_len(self.config), dtype=torch.long, device=dev)
        custom_mask = buf if step.reused else step.tree_mask.to(dev)
        replay = _verify_batch(modules(), graph_bs, torch.cat([_seq_lens(batch, dev), padding]), custom_mask,
                               self.config.d)
        with _stand_in_checked(self.backend):
            call_method(self.backend, "init_forward_metadata_out_graph", forward_batch=replay, in_capture=False)
        return _view(self.graphs[graph_bs], self.backend, graph_bs)
