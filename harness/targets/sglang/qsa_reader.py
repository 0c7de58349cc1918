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

Cuda-graph replay (``read_replay``): the backend's own ``init_cuda_graph_state``
(max_bs) sets up the per-row graph buffers, ``init_forward_metadata_out_graph``
captures the graph the batch replays in (``readers.captured_bs`` requests at
the fill length, as the graph runner passes them) and then replays the batch
padded up to it (``num_padding``, as the runner's replay view carries it).
``_replay_cuda_graph_metadata`` takes its host path, which refills the
buffers the capture bound; its ``_replay_cuda_graph_metadata_gpu`` needs a CUDA
``QSATokenToKVPool`` and is not driven. The graph binds no token-slot table
(a dummy column): its attention gathers each row's KV from the request-to-token
table through the row's pool slot, so the view's table is that gather.

Not driven: the compressed sparse views the indexer derives (block
compression, pending-ring slots: not the verify mask's meaning).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch

from vmfuzz.harness.model.allocation import ServerNumbers
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.model.fa3_reads import table_slot, table_width
from vmfuzz.harness.model.qsa_reads import QsaVerify
from vmfuzz.harness.model.readers import capture_seq_len, captured_bs, pool_slots
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.seams import call_method, call_with
from vmfuzz.harness.targets.sglang.stand_in import StandIn

QSA = "srt/layers/attention/qwen_sparse_attn_backend.py"
_MODULE = "sglang.srt.layers.attention.qwen_sparse_attn_backend"

#: What this module drives: (path under the sglang package, function, properties).
SURFACE = (
    (QSA, "QwenSparseAttnBackend.init_forward_metadata", ("reader-agreement",)),
    (QSA, "QwenSparseAttnBackend._metadata_from_forward_batch", ("reader-agreement",)),
    (QSA, "QwenSparseAttnBackend._speculative_row_to_request", ("reader-agreement",)),
    (QSA, "QwenSparseAttnBackend.init_cuda_graph_state", ("reader-agreement",)),
    (QSA, "QwenSparseAttnBackend.init_forward_metadata_out_graph", ("reader-agreement",)),
    (QSA, "QwenSparseAttnBackend._capture_cuda_graph_metadata", ("reader-agreement",)),
    (QSA, "QwenSparseAttnBackend._replay_cuda_graph_metadata", ("reader-agreement",)),
    (QSA, "QwenSparseAttnBackend._graph_speculative_layout", ("reader-agreement",)),
)


@functools.lru_cache(maxsize=None)
def module():
    """SGLang's QSA backend module (it imports without CUDA extensions)."""
    from vmfuzz.harness.targets.sglang.imports import sglang_module
    from vmfuzz.harness.targets.sglang.loader import _quiet_import
    with _quiet_import():
        # each failure as imports.decide says: not in this release, SGLang's own raise, or out of step
        return sglang_module(_MODULE)


def not_driven(config: Config) -> str | None:
    """Why QSA's verify read is not driven for ``config`` (None: it is)."""
    if config.topk != 1:
        return "QSA verifies chains only (topk 1)"
    from vmfuzz.harness.targets.sglang.imports import NotInRelease
    try:
        mod = module()
    except NotInRelease as exc:  # only a missing file is a reason; a raising one is raised
        return f"{QSA} is not in this release ({exc})"
    return None if hasattr(mod, "QwenSparseAttnBackend") else f"{QSA} has no QwenSparseAttnBackend"


def _compress_ratio(d: int) -> int:
    """The smallest power of two >= max(4, d): QSA refuses a verify window wider than its ratio."""
    ratio = 4
    while ratio < d:
        ratio *= 2
    return ratio


def backend(config: Config, pool: int, dev):
    """A ``QwenSparseAttnBackend`` made by its own ``__init__`` for a server with ``config``'s numbers."""
    from vmfuzz.harness.targets.sglang import backend_init

    mod = module()
    cls = mod.QwenSparseAttnBackend
    numbers = ServerNumbers(pool, config.max_context_len, config.d, config.topk, config.spec_steps)
    runner = backend_init.model_runner(numbers, dev)
    ratio = _compress_ratio(config.d)
    runner.model_config.hf_text_config = StandIn("hf_text_config", QSA, num_attention_heads=8,
                                                 indexer_compress_ratio=ratio)
    runner.token_to_kv_pool = StandIn("token_to_kv_pool", QSA, start_layer=0, qsa_compressed_page_size=ratio,
                                              qsa_compress_ratio=ratio, qsa_block_topk=8)
    tokens = table_width(config)
    table = torch.tensor([[table_slot(p, t, config) for t in range(tokens)] for p in range(pool)],
                         dtype=torch.int32, device=dev)
    runner.req_to_token_pool = StandIn("req_to_token_pool", QSA, size=pool, req_to_token=table)
    with bound(*backend_init.lookups_bound(mod, cls, numbers)):
        return call_with(cls, f"{cls.__name__}.__init__", QSA, model_runner=runner), numbers


class _UnpinnedTorch:
    """``torch`` with host buffers never pinned. QSA's cuda-graph set-up pins two staging halves for
    draft extend's lengths, read only by its GPU replay (``_stage_extend_lens``); a host without CUDA
    cannot pin, and unpinned they hold the same."""

    def __getattr__(self, name):
        real = getattr(torch, name)
        if name != "zeros":
            return real

        def unpinned(*args, **kwargs):
            kwargs.pop("pin_memory", None)
            return real(*args, **kwargs)
        return unpinned


def _verify_batch(mod, config: Config, seq_lens: list[int], positions, dev, **extra) -> StandIn:
    """A chain TARGET_VERIFY forward batch of ``len(seq_lens)`` requests in pool slots ``readers.pool_slots``."""
    lens = torch.tensor(seq_lens, dtype=torch.int64, device=dev)
    rows = positions.numel()
    return StandIn(
        "ForwardBatch", QSA, forward_mode=mod.ForwardMode.TARGET_VERIFY, batch_size=len(seq_lens), seq_lens=lens,
        seq_lens_cpu=lens.cpu(), positions=positions, input_ids=torch.zeros(rows, dtype=torch.int64, device=dev),
        req_pool_indices=torch.tensor(pool_slots(len(seq_lens)), dtype=torch.int64, device=dev),
        out_cache_loc=torch.arange(rows, dtype=torch.int64, device=dev), extend_seq_lens=None,
        mrope_positions=None, spec_info=StandIn("verify spec info", QSA, topk=1, draft_token_num=config.d), **extra)


def _run(call, forward_batch, what: str) -> None:
    """``call(forward_batch)``; a read of something a stand-in lacks is out of step."""
    try:
        call(forward_batch)
    except AttributeError as exc:
        if getattr(exc, "obj", None) is forward_batch or isinstance(getattr(exc, "obj", None), SimpleNamespace):
            raise OutOfStep(f"QwenSparseAttnBackend.{what}", QSA,
                            f"reads {exc.name!r} from a stand-in vmfuzz built: {exc}") from None
        raise


def read_verify(config: Config, batch: Batch, step) -> QsaVerify:
    """``QwenSparseAttnBackend.init_forward_metadata`` for an eager chain TARGET_VERIFY batch at the
    step's positions; requests sit in pool slots ``readers.pool_slots``."""
    from vmfuzz.harness.targets.sglang import backend_init

    mod = module()
    dev = step.positions.device
    be, numbers = backend(config, max(config.max_bs, batch.bs), dev)
    forward_batch = _verify_batch(mod, config, list(batch.seq_lens), step.positions, dev)
    with bound(*backend_init.lookups_bound(mod, mod.QwenSparseAttnBackend, numbers)):
        _run(be.init_forward_metadata, forward_batch, "init_forward_metadata")
    m = be.forward_metadata
    return QsaVerify(m.sequence_lengths, m.row_req_pool_indices, m.token_slot_table)


def _graph_gather(be, owners: torch.Tensor) -> torch.Tensor:
    """Each graph row's token slots as its attention gathers them: the request-to-token table's row of the
    row's pool slot (-1 where that slot is outside the table, which the judge names first)."""
    table = be.req_to_token_pool.req_to_token
    idx = owners.long()
    inside = (idx >= 0) & (idx < table.shape[0])
    out = torch.full((idx.numel(), table.shape[1]), -1, dtype=table.dtype, device=table.device)
    out[inside] = table[idx[inside]]
    return out


def read_replay(config: Config, batch: Batch, step) -> QsaVerify:
    """The chain batch (bs <= max_bs) through a cuda graph: buffers set up for ``config.max_bs``, the graph
    of ``readers.captured_bs`` requests captured at the fill length, then replayed with the batch padded up
    to it by requests at the fill length, in pool slots ``readers.pool_slots`` of the padded batch. The
    view is the metadata the capture bound (what the graph reads), padding rows included."""
    from vmfuzz.harness.targets.sglang import backend_init

    mod = module()
    dev = step.positions.device
    be, numbers = backend(config, config.max_bs, dev)
    graph_bs, fill = captured_bs(batch.bs, config.max_bs), capture_seq_len(config)
    blank = torch.zeros(graph_bs * config.d, dtype=step.positions.dtype, device=dev)
    positions = blank.clone()
    positions[:step.positions.numel()] = step.positions.reshape(-1)
    capture = _verify_batch(mod, config, [fill] * graph_bs, blank, dev)
    replay = _verify_batch(mod, config, list(batch.seq_lens) + [fill] * (graph_bs - batch.bs), positions, dev,
                           num_padding=graph_bs - batch.bs)
    with bound(*backend_init.lookups_bound(mod, mod.QwenSparseAttnBackend, numbers)):
        with bound((mod, "torch", _UnpinnedTorch())):
            call_method(be, "init_cuda_graph_state", max_bs=config.max_bs, max_num_tokens=config.max_bs * config.d)
        _run(lambda fb: call_method(be, "init_forward_metadata_out_graph", forward_batch=fb, in_capture=True), capture,
             "init_forward_metadata_out_graph")
        captured = be.forward_metadata
        _run(lambda fb: call_method(be, "init_forward_metadata_out_graph", forward_batch=fb, in_capture=False), replay,
             "_replay_cuda_graph_metadata")
    return QsaVerify(captured.sequence_lengths, captured.row_req_pool_indices,
                     _graph_gather(be, captured.row_req_pool_indices), graph_bs=graph_bs)
