"""Qwen's sparse-attention backend's TARGET_VERIFY read, driven with stand-ins.

``QwenSparseAttnBackend`` is made by its own ``__init__`` over the stand-in
target model runner of ``backend_init`` with what QSA reads beyond it: a
model config whose indexer compress ratio admits the draft width (QSA refuses
a verify window wider than it), a KV pool carrying the QSA compression numbers
its metadata asks, and the stand-in request-to-token table of
``model.fa3_reads``. Then SGLang's eager ``init_forward_metadata`` runs for a
TARGET_VERIFY batch (chain speculation: topk 1) at the step's positions;
everything it does there is torch on the host. The view is what attention reads
per verify row: its causal length, its request's pool slot, its token slots.

Not driven: the cuda-graph path (``_replay_cuda_graph_metadata``), and the
compressed sparse views the indexer derives (block compression, not the
verify mask's meaning).
"""

from __future__ import annotations

import functools
import importlib
from types import SimpleNamespace

import torch

from harness.model.allocation import ServerNumbers
from harness.model.config import Batch, Config
from harness.model.errors import OutOfStep
from harness.model.fa3_reads import table_slot, table_width
from harness.model.qsa_reads import QsaVerify
from harness.model.readers import pool_slots
from harness.targets.sglang.binding import bound

QSA = "srt/layers/attention/qwen_sparse_attn_backend.py"
_MODULE = "sglang.srt.layers.attention.qwen_sparse_attn_backend"

#: What this module drives: (path under the sglang package, function, properties).
SURFACE = (
    (QSA, "QwenSparseAttnBackend.init_forward_metadata", ("reader-agreement",)),
    (QSA, "QwenSparseAttnBackend._metadata_from_forward_batch", ("reader-agreement",)),
    (QSA, "QwenSparseAttnBackend._speculative_row_to_request", ("reader-agreement",)),
)

NOT_DRIVEN = (
    (QSA, "QwenSparseAttnBackend._replay_cuda_graph_metadata",
     "the verify's cuda-graph replay (per-row buffers init_cuda_graph_state sets up) is not driven yet; its "
     "eager init_forward_metadata is"),
)


@functools.lru_cache(maxsize=None)
def module():
    """SGLang's QSA backend module (it imports without CUDA extensions)."""
    from harness.targets.sglang.loader import _quiet_import
    with _quiet_import():
        try:
            return importlib.import_module(_MODULE)
        except Exception as exc:  # any failure in its import chain: this reader cannot run here
            raise ImportError(f"{_MODULE}: {type(exc).__name__}: {exc}") from None


def not_driven(config: Config) -> str | None:
    """Why QSA's verify read is not driven for ``config`` (None: it is)."""
    if config.topk != 1:
        return "QSA verifies chains only (topk 1)"
    try:
        mod = module()
    except ImportError as exc:
        return f"{QSA} does not import here ({exc})"
    return None if hasattr(mod, "QwenSparseAttnBackend") else f"{QSA} has no QwenSparseAttnBackend"


def _compress_ratio(d: int) -> int:
    """The smallest power of two >= max(4, d): QSA refuses a verify window wider than its ratio."""
    ratio = 4
    while ratio < d:
        ratio *= 2
    return ratio


def backend(config: Config, pool: int, dev):
    """A ``QwenSparseAttnBackend`` made by its own ``__init__`` for a server with ``config``'s numbers."""
    from harness.targets.sglang import backend_init

    mod = module()
    cls = mod.QwenSparseAttnBackend
    numbers = ServerNumbers(pool, config.max_context_len, config.d, config.topk, config.spec_steps)
    runner = backend_init.model_runner(numbers, dev)
    ratio = _compress_ratio(config.d)
    runner.model_config.hf_text_config = SimpleNamespace(num_attention_heads=8, indexer_compress_ratio=ratio)
    runner.token_to_kv_pool = SimpleNamespace(start_layer=0, qsa_compressed_page_size=ratio,
                                              qsa_compress_ratio=ratio, qsa_block_topk=8)
    tokens = table_width(config)
    table = torch.tensor([[table_slot(p, t, config) for t in range(tokens)] for p in range(pool)],
                         dtype=torch.int32, device=dev)
    runner.req_to_token_pool = SimpleNamespace(size=pool, req_to_token=table)
    with bound(*backend_init.lookups_bound(mod, cls, numbers)):
        return cls(runner), numbers


def read_verify(config: Config, batch: Batch, step) -> QsaVerify:
    """``QwenSparseAttnBackend.init_forward_metadata`` for an eager chain TARGET_VERIFY batch at the
    step's positions; requests sit in pool slots ``readers.pool_slots``."""
    from harness.targets.sglang import backend_init

    mod = module()
    dev = step.positions.device
    be, numbers = backend(config, max(config.max_bs, batch.bs), dev)
    seq_lens = torch.tensor(batch.seq_lens, dtype=torch.int64, device=dev)
    rows = step.positions.numel()
    forward_batch = SimpleNamespace(
        forward_mode=mod.ForwardMode.TARGET_VERIFY, batch_size=batch.bs, seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.cpu(), positions=step.positions,
        req_pool_indices=torch.tensor(pool_slots(batch.bs), dtype=torch.int64, device=dev),
        out_cache_loc=torch.arange(rows, dtype=torch.int64, device=dev), extend_seq_lens=None,
        mrope_positions=None, spec_info=SimpleNamespace(topk=1, draft_token_num=config.d))
    try:
        with bound(*backend_init.lookups_bound(mod, mod.QwenSparseAttnBackend, numbers)):
            be.init_forward_metadata(forward_batch)
    except AttributeError as exc:
        if getattr(exc, "obj", None) is forward_batch or isinstance(getattr(exc, "obj", None), SimpleNamespace):
            raise OutOfStep("QwenSparseAttnBackend.init_forward_metadata", QSA,
                            f"reads {exc.name!r} from a stand-in vmfuzz built: {exc}") from None
        raise
    m = be.forward_metadata
    return QsaVerify(m.sequence_lengths, m.row_req_pool_indices, m.token_slot_table)
