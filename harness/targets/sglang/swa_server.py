"""A server whose KV pool keeps its sliding-window layers apart (SGLang's ``SWAKVPool``): the window-pool server.

A hybrid model (some layers full attention, some a sliding window of W
tokens) gets SGLang's ``SWAKVPool``: the full layers' KV in one sub-pool, the
window layers' in another, and a map from each full-pool slot to its window
slot (``full_to_swa_index_mapping``). A verify step then writes each token's
KV twice: at its ``out_cache_loc`` slot for the full layers, and at that
slot's window slot for the window layers. The Triton backend finds the window
slots through the step's KV-location plan (``kv_loc_plan``, translated once by
``KVIndexTranslator.write_ids``), and on the cuda-graph path copies them into a
buffer of its own (``_fill_cuda_graph_swa_out_cache_loc``), which the captured
forward's window layers write through. Its window layers read the last W
prefix tokens (``update_sliding_window_buffer``), their slots gathered through
the same map.

``WindowPool`` is that server's pool and ids, for the target verify runner
(``graph_runner.build(..., window_pool=True)``): SGLang's ``SWAKVPool``, made by
its own ``__init__`` with one full and one window layer, its sub-pool classes
``recorded_sub_pool`` (they record the slots asked, allocate nothing, and answer
the value width the backend's ``__init__`` asks), and a map of the
harness's (``fa3_reads.swa_slot``, the sink 0 to 0, the -1 sentinel last),
registered through the pool's own ``register_mapping``. The backend's
``__init__`` is handed the pool, so its ``use_sliding_window_kv_pool`` and the
graph buffers ``init_cuda_graph_state`` sizes for it are SGLang's decision; its
KV-index translator is SGLang's own ``KVIndexTranslator``, made by its own
``__init__`` over the pool (which id spaces it has is SGLang's decision too),
with only its gather stood in (``kv_ids.GathersKvSlots``, the map applied as
the real kernel applies ``token_mapping``). Each live batch gets its plan
from ``own_plan`` bound by ``KVLocPlan.bind`` (the plan ``ForwardBatch.init_new``
makes for a lone forward), and its write slots from a ring past every prefix
slot (``slots``), so the map stays one tensor for the server's life.

The recording model (``graph_model``) has one window layer: it reads the
window metadata (slots, and the mask column each window starts at) and writes
each token's KV at the window slot the backend's metadata holds
(``swa_out_cache_loc``), which is what the Triton backend hands the pool for a
window layer. So a replay whose window layers write another step's slots, or
read another window, differs from the eager run.

Not driven here: the unified SWA pool (``UnifiedSWATokenToKVPoolAllocator``:
virtual ids, both sub-pools' writes translated through page tables, a fused
producer's write ids); paged window pools (page size > 1, a window map per
page); DeepSeek V4's per-request window and the window ring pools; MLA or DSA
sub-pools; the write routing itself (``KVWriteLoc``, ``SWAKVPool.set_kv_buffer``:
the recording model writes where the metadata says, as the backend hands it);
the verify window's own producer (``plan_uniform_extend``: ``kv_translation``
drives it); the other backends' window write buffers (FlashInfer, FA3,
TRT-LLM, DeepSeek V4); a multi-step draft's per-step window ids.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch

from vmfuzz.harness.model.config import Config
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.model.fa3_reads import swa_slot
from vmfuzz.harness.model.readers import kv_slot_stride
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.seams import call_with
from vmfuzz.harness.targets.sglang.stand_in import StandIn

TRITON_FILE = "srt/layers/attention/triton_backend.py"
POOL_FILE = "srt/mem_cache/swa_memory_pool.py"
TRANSLATOR_FILE = "srt/mem_cache/kv_index_translator.py"
PLAN_FILE = "srt/mem_cache/kv_loc_plan.py"
_PROPS = ("graph-replay-equivalence", "padding-inert", "capture-replay-agreement")

#: What this module drives, on a window-pool server's target verify runner and its eager reference.
SURFACE = tuple((path, fn, _PROPS) for path, fn in (
    (TRITON_FILE, "TritonAttnBackend._fill_cuda_graph_swa_out_cache_loc"),
    (TRITON_FILE, "update_sliding_window_buffer"),
    (POOL_FILE, "SWAKVPool.register_mapping"), (POOL_FILE, "SWAKVPool.translate_loc_from_full_to_swa"),
    (POOL_FILE, "SWAKVPool.get_value_buffer"), (POOL_FILE, "SWAKVPool.__init__"),
    (TRANSLATOR_FILE, "KVIndexTranslator.__init__"), (TRANSLATOR_FILE, "KVIndexTranslator.space"),
    (TRANSLATOR_FILE, "KVIndexTranslator.window_kv_kind"), (TRANSLATOR_FILE, "KVIndexTranslator.write_ids"),
    (TRANSLATOR_FILE, "KVIndexTranslator.plan"), (TRANSLATOR_FILE, "KVIndexTranslator.own_plan"),
    (TRANSLATOR_FILE, "KVIndexTranslator.bind_runner_slots"),
    (PLAN_FILE, "KVLocPlan.__init__"), (PLAN_FILE, "KVLocPlan.bind"), (PLAN_FILE, "KVLocPlan.write_ids"),
    (PLAN_FILE, "KVLocPlan._window_in"), (PLAN_FILE, "KVLocPlan.is_translated_for"),
    (PLAN_FILE, "window_read_extent"), (PLAN_FILE, "pad_with_sink"),
))

NOT_DRIVEN = (
    (POOL_FILE, "SWAKVPool.set_kv_buffer", "a window layer's write is the recording model's, at the window slot "
                                           "the backend's metadata holds (as the Triton backend hands it the pool)"),
)

#: the pool's layers: layer 0 full attention, layer 1 a sliding window (SWAKVPool's ``layers_mapping``)
LAYERS = {0: (0, False), 1: (0, True)}


@functools.lru_cache(maxsize=None)
def _modules() -> SimpleNamespace:
    from vmfuzz.harness.targets.sglang.imports import sglang_module
    return SimpleNamespace(pool=sglang_module("sglang.srt.mem_cache.swa_memory_pool"),
                           translator=sglang_module("sglang.srt.mem_cache.kv_index_translator"),
                           triton=sglang_module("sglang.srt.layers.attention.triton_backend"))


def missing() -> str | None:
    """Why this SGLang has no window-pool server to drive here (None: it has)."""
    m = _modules()
    for owner, name in ((m.pool, "SWAKVPool"), (m.translator, "KVIndexTranslator"),
                        (getattr(m.translator, "KVIndexTranslator", None), "write_ids"),
                        (getattr(m.triton, "TritonAttnBackend", None), "_fill_cuda_graph_swa_out_cache_loc")):
        if getattr(owner, name, None) is None:
            return f"this SGLang has no {name} where 0.5.23 has it"
    return None


def window_size(config: Config) -> int:
    """The window the server's window layers read: half the context, so a long request's window starts
    inside its prefix and a short one's holds all of it."""
    return max(1, config.max_context_len // 2)


class _RecordedSubPool:
    """A sub-pool ``SWAKVPool``'s set-up makes: it records the slots and layers it was asked to hold and
    allocates nothing; what the backend's ``__init__`` asks of it is a value buffer's width (on meta). Its bytes
    are none: the window-pool server's KV is the recording model's."""

    post_capture_active = False
    start_layer = 0

    def __init__(self, size: int, layer_num: int, allocation_label: str = "", **_):
        self.size, self.layer_num, self.allocation_label = size, layer_num, allocation_label

    def get_kv_size_bytes(self):
        return 0, 0

    def get_value_buffer(self, layer):
        return torch.empty(1, 8, 64, device="meta")


@functools.lru_cache(maxsize=None)
def recorded_sub_pool(pool_module) -> type:
    """``_RecordedSubPool`` as the pool's default sub-pool family (SGLang's ``MHATokenToKVPool``, where the
    module has it), so the set-up's steps for that family (each sub-pool's model layer ids) run as they would."""
    base = getattr(pool_module, "MHATokenToKVPool", None)
    return type("RecordedSubPool", (_RecordedSubPool,) + ((base,) if base is not None else ()), {})


def hybrid_pool(slots: int, to_window=swa_slot):
    """SGLang's ``SWAKVPool`` over full-pool slots ``[0, slots)``, made by its own ``__init__``: one full and one
    window layer (``LAYERS``), each sub-pool a ``recorded_sub_pool`` of ``slots`` slots; the harness's map
    (``to_window`` of each full slot, the sink to the sink, the -1 sentinel last) registered through the pool's
    own ``register_mapping``."""
    m = _modules()
    full = torch.arange(slots, dtype=torch.int64)
    mapping = torch.where(full > 0, to_window(full), 0)  # the sink is the sink in both sub-pools
    # bound by name: a release whose set-up asks for what this does not hand is out of step
    pool = call_with(m.pool.SWAKVPool, "SWAKVPool.__init__", POOL_FILE, size=slots, size_swa=slots, page_size=1,
                     dtype=torch.bfloat16, head_num=8, head_dim=64,
                     full_attention_layer_ids=[g for g, (_, window) in LAYERS.items() if not window],
                     swa_attention_layer_ids=[g for g, (_, window) in LAYERS.items() if window], device="cpu",
                     full_kv_pool_class=recorded_sub_pool(m.pool), swa_kv_pool_class=recorded_sub_pool(m.pool))
    if pool.layers_mapping != LAYERS:
        # the window routing every run here rests on; a pool that maps its layers otherwise is not this server's
        raise OutOfStep("SWAKVPool.__init__", POOL_FILE, f"maps the layers {pool.layers_mapping}, not {LAYERS}")
    pool.register_mapping(torch.cat([mapping, torch.tensor([-1])]))
    return pool


def translator_over(pool, req_to_token: torch.Tensor):
    """SGLang's ``KVIndexTranslator`` over ``pool`` and ``req_to_token``, made by its own ``__init__`` on one GPU."""
    m = _modules()
    parallel = StandIn("get_parallel()", "srt/runtime_context.py", attn_dcp_size=1, dcp_enabled=False,
                       dcp_size=1, dcp_rank=0)
    with bound((m.translator, "get_parallel", lambda: parallel)):
        # bound by name: a release whose set-up asks for what this does not hand is out of step
        return call_with(m.translator.KVIndexTranslator, "KVIndexTranslator.__init__", TRANSLATOR_FILE,
                         req_to_token=req_to_token, token_to_kv_pool_allocator=None, token_to_kv_pool=pool,
                         page_size=1, device="cpu")


class WindowPool:
    """One window-pool server's pool, window and write slots; ``rows``: its deepest request row."""

    def __init__(self, config: Config, rows: int, max_tokens: int):
        self.window = window_size(config)
        # every prefix slot a read gathers lies below (stand-in table: one stride per request row)
        self.write_base = (rows + 2) * kv_slot_stride(config.max_context_len)
        self.ring = max(1 << 12, 8 * max_tokens)
        self._next = 0
        self.pool = hybrid_pool(self.write_base + self.ring)
        self.translator = self._translator()

    def _translator(self):
        return translator_over(self.pool, torch.zeros(1, 1, dtype=torch.int32))

    def backend(self, config: Config, pool_rows: int, heap, graphs: bool):
        """The Triton backend of this server (``readers.triton_backend`` with the pool and the window),
        its KV-index translator SGLang's own over the pool, the stand-in's gather in its place."""
        from vmfuzz.harness.targets.sglang.readers import triton_backend
        backend = triton_backend(None, config, pool_rows, torch.device("cpu"), heap, graphs=graphs,
                                 window=self.window, kv_pool=self.pool)
        translator = self._translator()
        translator.pack_read_stream = backend.kv_index_translator.pack_read_stream
        backend.kv_index_translator = translator
        return backend

    def adopt(self, runner, space) -> None:
        """After the runner's ``__init__``: its model runner binds the capture's batches as SGLang's does
        (``bind_runner_slots``), and the buffers the backend's graph set-up made for the window are
        redzoned static buffers of the session's ``space``."""
        from vmfuzz.harness.targets.sglang.graph_lookups import static
        runner.model_runner.kv_index_translator = self.translator
        backend = runner.attn_backend
        for name in ("cuda_graph_swa_out_cache_loc", "cuda_graph_window_kv_indices", "cuda_graph_window_kv_offsets"):
            value = getattr(backend, name, None)
            if isinstance(value, torch.Tensor) and value.numel():
                setattr(backend, name, static(space, name, value))

    def slots(self, n: int) -> torch.Tensor:
        """``n`` write slots for the next step: distinct, none 0, none a prefix slot, none of the steps
        just before (a ring of ``ring`` slots, so the map is sized once)."""
        start, self._next = self._next, (self._next + n) % self.ring
        return self.write_base + (start + torch.arange(n, dtype=torch.int64)) % self.ring

    def bind(self, forward_batch) -> None:
        """The live batch's KV-location plan, as ``ForwardBatch.init_new`` makes one for a lone forward."""
        self.translator.own_plan(forward_batch).bind(forward_batch, self.translator)


def asked(config: Config, rows: int, wanted: bool) -> tuple[WindowPool | None, str | None]:
    """(the window pool of a server of ``config`` whose request rows go up to ``rows``, or None; why one
    ``wanted`` is not driven, or None)."""
    if not wanted:
        return None, None
    why = missing()
    if why:
        return None, why
    return WindowPool(config, rows, rows * config.d), None


def with_plan(pool: WindowPool | None, forward_batch):
    """``forward_batch``, given its KV-location plan where the server's pool is a window pool."""
    if pool is not None:
        pool.bind(forward_batch)
    return forward_batch
