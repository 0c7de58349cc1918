"""FlashAttention's topk > 1 target-verify metadata, driven with stand-ins.

``FlashAttentionBackend`` is made by its own ``__init__`` over the stand-in
target model runner the allocation sites use (``backend_init.model_runner``),
with the server-wide config it reads bound for the call, its module imported
with the CUDA-only extensions stubbed (``allocation._with_extensions_stubbed``;
``__init__`` imports ``sgl_kernel.flash_attn`` itself, stubbed the same way
while it runs). So what ``__init__`` derives -- topk, the draft width, page
size, context length, the request-to-token table it reads -- is SGLang's own.
Its request-to-token table is the stand-in one of ``model.fa3_reads``: a
distinct KV slot per (pool slot, token).

Then SGLang's ``init_forward_metadata`` runs for an eager TARGET_VERIFY batch
whose spec info carries the step's mask. Everything it does there is torch on
the host: the prefix pass's metadata, and the expand pass's, extracted from the
mask (per (request, node) row: how many tree nodes it sees, and a page table
with those nodes' slots first). The reader's view is both (``Fa3Verify``).

Not driven: the cuda-graph path (``init_forward_metadata_out_graph`` and its
replay through ``_apply_cuda_graph_metadata``), which keeps the expand metadata
in buffers set up by ``init_cuda_graph_state``; page sizes other than 1; the
sliding-window and local-attention variants.
"""

from __future__ import annotations

import functools
import sys
from types import SimpleNamespace

import torch

from harness.model.allocation import ServerNumbers
from harness.model.config import Batch, Config
from harness.model.errors import OutOfStep
from harness.model.fa3_reads import Fa3Pass, Fa3Verify, table_slot, table_width
from harness.model.readers import pool_slots
from harness.targets.sglang.binding import bound

FA3 = "srt/layers/attention/flashattention_backend.py"
_MODULE = "sglang.srt.layers.attention.flashattention_backend"

#: What this module drives: (path under the sglang package, function, properties).
SURFACE = (
    (FA3, "FlashAttentionBackend.__init__", ("reader-agreement",)),
    (FA3, "FlashAttentionBackend.init_forward_metadata", ("reader-agreement",)),
)

NOT_DRIVEN = (
    (FA3, "FlashAttentionBackend._apply_cuda_graph_metadata",
     "the topk > 1 verify's cuda-graph replay (expand metadata in buffers init_cuda_graph_state sets up) "
     "is not driven yet; its eager init_forward_metadata is"),
)


@functools.lru_cache(maxsize=None)
def module():
    """SGLang's FlashAttention backend module, imported once with its CUDA-only extensions stubbed."""
    from harness.targets.sglang.allocation import _with_extensions_stubbed
    from harness.targets.sglang.loader import _quiet_import
    with _quiet_import():
        try:
            return _with_extensions_stubbed(_MODULE)
        except Exception as exc:  # any failure in its import chain: this reader cannot run here
            raise ImportError(f"{_MODULE}: {type(exc).__name__}: {exc}") from None


def not_driven() -> str | None:
    """Why the FA3 reader cannot run here (None: it can)."""
    try:
        mod = module()
    except ImportError as exc:
        return f"{FA3} does not import here ({exc})"
    return None if hasattr(mod, "FlashAttentionBackend") else f"{FA3} has no FlashAttentionBackend"


def _table(config: Config, pool: int, dev) -> torch.Tensor:
    """The stand-in request-to-token table: row p holds the KV slots of the request in pool slot p."""
    tokens = torch.arange(table_width(config), dtype=torch.int64)
    rows = torch.stack([torch.tensor([table_slot(p, int(t), config) for t in tokens]) for p in range(pool)])
    return rows.to(torch.int32).to(dev)


def _stubbing_missing(call, tries: int = 4):
    """``call()``, with each CUDA-only extension module it imports stubbed for the call, then unstubbed."""
    from harness.targets.sglang.allocation import _stub_module
    added: list[str] = []
    try:
        for _ in range(tries):
            try:
                return call()
            except ModuleNotFoundError as exc:
                if not exc.name or exc.name.startswith("sglang") or exc.name in sys.modules:
                    raise
                added.append(exc.name)
                sys.modules[exc.name] = _stub_module(exc.name)
        raise ImportError(f"FlashAttentionBackend.__init__ still misses modules after stubbing {added}")
    finally:
        for name in added:
            sys.modules.pop(name, None)


def backend(config: Config, pool: int, dev):
    """A ``FlashAttentionBackend`` made by its own ``__init__`` for a server with ``config``'s numbers,
    a dense MHA model at page size 1 and a request pool ``pool`` deep."""
    from harness.targets.sglang import backend_init

    mod = module()
    numbers = ServerNumbers(pool, config.max_context_len, config.d, config.topk, config.spec_steps)
    # The allocation sites' stand-in server (its arguments where ModelRunner carries them), with
    # the KV cache dtype FA3 picks its kernel by and a request table of distinct slots.
    runner = backend_init.model_runner(numbers, dev)
    runner.kv_cache_dtype_str = "bfloat16"
    runner.req_to_token_pool = SimpleNamespace(size=pool, req_to_token=_table(config, pool, dev))
    context = backend_init.lookups_bound(mod, mod.FlashAttentionBackend, numbers)
    try:
        with bound(*context):
            return _stubbing_missing(lambda: mod.FlashAttentionBackend(runner))
    except AttributeError as exc:
        if isinstance(getattr(exc, "obj", None), SimpleNamespace):
            raise OutOfStep("FlashAttentionBackend.__init__", FA3,
                            f"reads {exc.name!r} from a stand-in vmfuzz built: {exc}") from None
        raise


def _pass(meta) -> Fa3Pass:
    return Fa3Pass(meta.cache_seqlens_int32, meta.cu_seqlens_q, meta.cu_seqlens_k, meta.page_table,
                   meta.max_seq_len_q)


def read_verify(config: Config, batch: Batch, step) -> Fa3Verify:
    """``FlashAttentionBackend.init_forward_metadata`` for an eager topk > 1 TARGET_VERIFY batch
    over the step's mask; requests sit in pool slots ``readers.pool_slots``."""
    mod = module()
    dev = step.tree_mask.device
    be = backend(config, max(config.max_bs, batch.bs), dev)
    seq_lens = torch.tensor(batch.seq_lens, dtype=torch.int64, device=dev)
    forward_batch = SimpleNamespace(
        batch_size=batch.bs, forward_mode=mod.ForwardMode.TARGET_VERIFY, seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.cpu(), seq_lens_sum=int(seq_lens.sum()),
        req_pool_indices=torch.tensor(pool_slots(batch.bs), dtype=torch.int64, device=dev),
        spec_info=SimpleNamespace(custom_mask=step.tree_mask, positions=step.positions),
        out_cache_loc=None, encoder_lens=None, kv_loc_plan=None)
    try:
        be.init_forward_metadata(forward_batch)
    except AttributeError as exc:
        if getattr(exc, "obj", None) is forward_batch or getattr(exc, "obj", None) is forward_batch.spec_info:
            raise OutOfStep("FlashAttentionBackend.init_forward_metadata", FA3,
                            f"reads {exc.name!r} of the forward batch, which vmfuzz's stand-in lacks") from None
        raise
    expand = getattr(be, "forward_metadata_spec_decode_expand", None)
    if expand is None:
        raise OutOfStep("FlashAttentionBackend.init_forward_metadata", FA3,
                        "a topk > 1 TARGET_VERIFY batch left no expand metadata (forward_metadata_spec_decode_expand)"
                        ", where vmfuzz reads the tree's per-node KV")
    return Fa3Verify(_pass(be.forward_metadata), _pass(expand))
