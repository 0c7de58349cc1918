"""FlashAttention's target-verify metadata, driven with stand-ins, eager and in cuda-graph replay.

A topk > 1 verify is split in a prefix pass and an expand pass read off the
mask; a chain (topk 1) is one causal pass over each request's prefix and its d
draft tokens, reading no mask.

``FlashAttentionBackend`` is made by its own ``__init__`` over the stand-in
target model runner the allocation sites use (``backend_init.model_runner``),
with the server-wide config it reads bound for the call, its module imported
with the CUDA-only extensions stubbed (``backend_init.import_with_extensions_stubbed``;
``__init__`` imports ``sgl_kernel.flash_attn`` itself, a stub again while it
runs). So what ``__init__`` derives -- topk, the draft width, page size,
context length, the request-to-token table it reads -- is SGLang's own. Its
request-to-token table is the stand-in one of ``model.fa3_reads``: a distinct
KV slot per (pool slot, token), each request's slots starting on a page.

Each read is for a server of a given page size (the judge asks for 1 and a
larger one). At a page size above 1 the eager path turns the prefix pass's
table of slots into one of pages (its strided gather), the replay's Triton
page-table kernel writes pages, and the expand pass keeps KV slots.

Eager (``read_verify``): SGLang's ``init_forward_metadata`` runs for a
TARGET_VERIFY batch whose spec info carries the step's mask. Everything it does
there is torch on the host: the prefix pass's metadata, and the expand pass's,
extracted from the mask (per (request, node) row: how many tree nodes it sees,
and a page table with those nodes' slots first). The reader's view is both
(``Fa3Verify``).

Cuda-graph replay (``read_replay``): the backend's own ``init_cuda_graph_state``
(max_bs) sets up the graph buffers, ``init_forward_metadata_out_graph`` captures
the graph the batch replays in (``readers.captured_bs``, requests at the fill
length, as the graph runner passes them) and then replays the batch padded up
to it: ``_apply_cuda_graph_metadata`` refills those buffers in place, the prefix
page table through SGLang's Triton page-table kernel. The view is the metadata
the capture bound, which is what the captured graph reads, padding rows too.

A windowed server (``window``: every layer a sliding window of that many tokens)
adds, at topk > 1, the merged pass its windowed layers read: one row per
(request, draft node) over its prefix and then the tree nodes it sees
(``swa_spec_metadata``), filled eagerly and refilled in place on a replay. It
needs pages of one token (SGLang asserts it).

A ragged chain verify (``verify_lens``: request b verifies only its first v_b
draft tokens) carries SGLang's own ``RaggedVerifyLayout`` on its spec info; the
eager path derives the causal pass from it. On a replay the live batch's layout
rides on the padded batch, and SGLang pads it to the graph itself
(``padded_to_bucket``): the graph's token count is the batch's tokens and d for
each padding request, a tier of a server whose captured token counts include it,
so each padding request verifies d tokens, as on a chain's replay.

Not driven: local attention, and a separate sliding-window KV pool.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch

from vmfuzz.harness.model.allocation import ServerNumbers
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.model.fa3_reads import Fa3Pass, Fa3Verify, swa_slot, table_slot, table_width
from vmfuzz.harness.model.layouts import TreeMaskMode, logical_size
from vmfuzz.harness.model.readers import capture_seq_len, captured_bs, pool_slots
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.seams import call_method, call_with
from vmfuzz.harness.targets.sglang.stand_in import StandIn

FA3 = "srt/layers/attention/flashattention_backend.py"
_MODULE = "sglang.srt.layers.attention.flashattention_backend"
#: where SGLang keeps the ragged verify layout (a chain batch whose requests verify different counts)
RAGGED = "sglang.srt.speculative.ragged_verify"

#: What this module drives: (path under the sglang package, function, properties).
SURFACE = (
    (FA3, "FlashAttentionBackend.__init__", ("reader-agreement",)),
    (FA3, "FlashAttentionBackend.init_forward_metadata", ("reader-agreement",)),
    (FA3, "FlashAttentionBackend.init_cuda_graph_state", ("reader-agreement",)),
    (FA3, "FlashAttentionBackend.init_forward_metadata_out_graph", ("reader-agreement",)),
    (FA3, "FlashAttentionBackend._bind_metadata_buffers", ("reader-agreement",)),
    (FA3, "FlashAttentionBackend._apply_cuda_graph_metadata", ("reader-agreement",)),
)


@functools.lru_cache(maxsize=None)
def module():
    """SGLang's FlashAttention backend module, imported once with its CUDA-only extensions stubbed."""
    from vmfuzz.harness.targets.sglang.backend_init import import_with_extensions_stubbed
    from vmfuzz.harness.targets.sglang.imports import sglang_module
    from vmfuzz.harness.targets.sglang.loader import _quiet_import
    with _quiet_import():
        # each failure as imports.decide says: not in this release, SGLang's own raise, or out of step
        return sglang_module(_MODULE, import_with_extensions_stubbed)


def not_driven() -> str | None:
    """Why the FA3 reader cannot run here (None: it can). Only a release without the file is a reason;
    a file that raises when imported is raised (a finding, or out of step), never "not driven"."""
    from vmfuzz.harness.targets.sglang.imports import NotInRelease
    try:
        mod = module()
    except NotInRelease as exc:
        return f"{FA3} is not in this release ({exc})"
    return None if hasattr(mod, "FlashAttentionBackend") else f"{FA3} has no FlashAttentionBackend"


def replay_not_driven(config: Config) -> str | None:
    """Why a replay of ``config``'s verify is not driven here (None: it is). A chain's capture and replay
    fill its metadata through SGLang's decode-metadata Triton kernel, whose loop bound is a scalar
    argument: Triton 3.6's interpreter under NumPy 2.4 refuses that conversion, and
    ``interpreter_speed.index_one_element`` (installed with the target) gives the value older NumPy
    gave, so every replay runs."""
    return None


def _table(config: Config, pool: int, dev, page_size: int) -> torch.Tensor:
    """The stand-in request-to-token table: row p holds the KV slots of the request in pool slot p."""
    tokens = torch.arange(table_width(config), dtype=torch.int64)
    rows = torch.stack([torch.tensor([table_slot(p, int(t), config, page_size) for t in tokens])
                        for p in range(pool)])
    return rows.to(torch.int32).to(dev)


def backend(config: Config, pool: int, dev, page_size: int = 1, window: int | None = None):
    """A ``FlashAttentionBackend`` made by its own ``__init__`` for a server with ``config``'s numbers,
    a dense MHA model (its layers windowed to ``window`` tokens, if given), KV pages of ``page_size``
    tokens and a request pool ``pool`` deep."""
    from vmfuzz.harness.targets.sglang import backend_init

    mod = module()
    numbers = ServerNumbers(pool, config.max_context_len, config.d, config.topk, config.spec_steps)
    # The allocation sites' stand-in server (its arguments where ModelRunner carries them), with
    # the KV cache dtype FA3 picks its kernel by and a request table of distinct slots.
    runner = backend_init.model_runner(numbers, dev, page_size, sliding_window_size=window)
    runner.kv_cache_dtype_str = "bfloat16"
    table = _table(config, pool, dev, page_size)
    runner.req_to_token_pool = StandIn("req_to_token_pool", FA3, size=pool, req_to_token=table)
    if window is not None:
        runner.token_to_kv_pool = _hybrid_pool(mod, int(table.max()) + 1, dev)
    context = backend_init.lookups_bound(mod, mod.FlashAttentionBackend, numbers, page_size)
    try:
        with bound(*context):
            with backend_init.extensions_stubbed_again(_MODULE):
                return call_with(mod.FlashAttentionBackend, "FlashAttentionBackend.__init__", FA3,
                                 model_runner=runner)
    except AttributeError as exc:
        if isinstance(getattr(exc, "obj", None), SimpleNamespace):
            raise OutOfStep("FlashAttentionBackend.__init__", FA3,
                            f"reads {exc.name!r} from a stand-in vmfuzz built: {exc}") from None
        raise


def _hybrid_pool(mod, slots: int, dev):
    """SGLang's own hybrid pool class (full and sliding-window KV apart), holding only its full-to-window slot
    map (``fa3_reads.swa_slot``, the -1 sentinel last): what a windowed layer's reads are translated by."""
    cls = getattr(mod, "SWAKVPool", None)
    if cls is None:
        raise OutOfStep("FlashAttentionBackend.__init__", FA3, "its module names no SWAKVPool, the hybrid pool "
                                                              "vmfuzz's windowed server stands in for")
    pool = cls.__new__(cls)
    mapping = [swa_slot(n) for n in range(slots)] + [-1]
    vars(pool).update(swa_layer_nums=1, full_layer_nums=1, start_layer=0, page_size=1,
                      full_to_swa_index_mapping=torch.tensor(mapping, dtype=torch.int64, device=dev))
    return pool


def _pass(meta) -> Fa3Pass:
    return Fa3Pass(meta.cache_seqlens_int32, meta.cu_seqlens_q, meta.cu_seqlens_k, meta.page_table,
                   meta.max_seq_len_q)


def _verify_batch(mod, bs: int, seq_lens: list[int], custom_mask, positions, dev, ragged=None):
    """A TARGET_VERIFY forward batch of ``bs`` rows whose spec info carries ``custom_mask`` (and a ragged
    layout, which SGLang must read for a failure to be its own)."""
    lens = torch.tensor(seq_lens, dtype=torch.int64, device=dev)
    extra = {} if ragged is None else {"ragged_verify_layout": ragged}
    return StandIn(
        "ForwardBatch", FA3,
        batch_size=bs, forward_mode=mod.ForwardMode.TARGET_VERIFY, seq_lens=lens, seq_lens_cpu=lens.cpu(),
        seq_lens_sum=int(lens.sum()), positions=positions,
        req_pool_indices=torch.tensor(pool_slots(bs), dtype=torch.int64, device=dev),
        spec_info=StandIn("verify spec info", FA3, load_bearing=tuple(extra), custom_mask=custom_mask,
                          positions=positions, **extra),
        out_cache_loc=None, encoder_lens=None, kv_loc_plan=None)


def _run(call, forward_batch, what: str):
    """``call(forward_batch)``; a read of a forward-batch field the stand-in lacks is out of step."""
    try:
        call(forward_batch)
    except AttributeError as exc:
        if getattr(exc, "obj", None) is forward_batch or getattr(exc, "obj", None) is forward_batch.spec_info:
            raise OutOfStep(f"FlashAttentionBackend.{what}", FA3,
                            f"reads {exc.name!r} of the forward batch, which vmfuzz's stand-in lacks") from None
        raise


def _expand(be, what: str):
    expand = getattr(be, "forward_metadata_spec_decode_expand", None)
    if expand is None:
        raise OutOfStep(f"FlashAttentionBackend.{what}", FA3,
                        "a topk > 1 TARGET_VERIFY batch left no expand metadata (forward_metadata_spec_decode_expand)"
                        ", where vmfuzz reads the tree's per-node KV")
    return expand


def _expand_pass(be, config: Config, what: str) -> Fa3Pass | None:
    """The expand pass of a topk > 1 verify; a chain (topk 1) is one causal pass, with none."""
    return _pass(_expand(be, what)) if config.topk > 1 else None


def _window_pass(be, config: Config, window: int | None, what: str) -> Fa3Pass | None:
    """The merged pass a windowed layer reads at topk > 1 (None: no window, or a chain)."""
    if window is None or config.topk <= 1:
        return None
    merged = getattr(be.forward_metadata, "swa_spec_metadata", None)
    if merged is None:
        raise OutOfStep(f"FlashAttentionBackend.{what}", FA3,
                        f"a topk > 1 TARGET_VERIFY batch on a server windowed to {window} tokens left no "
                        "swa_spec_metadata, where vmfuzz reads the windowed layers' KV")
    return _pass(merged)


def _ragged_layout(config: Config, verify_lens: list[int], dev, graph_tokens: int | None = None):
    """SGLang's own ragged verify layout (its constructor builds the query indptr) for a chain batch whose
    request b verifies ``verify_lens[b]`` tokens, its graph bucket ``graph_tokens`` tokens (None: the full
    block); None where this release has no ragged verify."""
    from vmfuzz.harness.targets.sglang.imports import NotInRelease, sglang_module
    try:
        layouts = sglang_module(RAGGED)
    except NotInRelease:
        return None
    return layouts.RaggedVerifyLayout.from_verify_lens(
        verify_lens_cpu=verify_lens, device=dev, grid=[graph_tokens or config.d * len(verify_lens)])


def read_verify(config: Config, batch: Batch, step, page_size: int = 1, window: int | None = None,
                verify_lens: list[int] | None = None) -> Fa3Verify:
    """``FlashAttentionBackend.init_forward_metadata`` for an eager TARGET_VERIFY batch (topk > 1: two passes)
    over the step's mask, on a server of ``page_size`` tokens a page whose layers are windowed to
    ``window`` tokens (None: full attention); requests sit in pool slots ``readers.pool_slots``. A chain
    with ``verify_lens`` is a ragged verify: request b verifies only its first ``verify_lens[b]`` tokens."""
    mod = module()
    dev = step.tree_mask.device
    be = backend(config, max(config.max_bs, batch.bs), dev, page_size, window)
    layout = None if verify_lens is None or config.topk > 1 else _ragged_layout(config, verify_lens, dev)
    _run(be.init_forward_metadata,
         _verify_batch(mod, batch.bs, list(batch.seq_lens), step.tree_mask, step.positions, dev, layout),
         "init_forward_metadata")
    return Fa3Verify(_pass(be.forward_metadata), _expand_pass(be, config, "init_forward_metadata"),
                     window=_window_pass(be, config, window, "init_forward_metadata"),
                     verify_lens=None if layout is None else tuple(verify_lens))


def read_replay(config: Config, batch: Batch, step, page_size: int = 1, window: int | None = None,
                verify_lens: list[int] | None = None) -> Fa3Verify:
    """The batch (bs <= max_bs) through a cuda graph: buffers set up for ``config.max_bs``, the graph of
    ``readers.captured_bs`` rows captured, then replayed with the batch padded up to it by requests
    at the fill length, rows in pool slots ``readers.pool_slots`` of the padded batch. The view is
    the metadata the capture bound (what the graph reads), padding rows included; the server's KV
    pages hold ``page_size`` tokens, its layers are windowed to ``window`` tokens (None: full). A chain
    with ``verify_lens`` is a ragged verify, each padding request verifying d tokens."""
    mod = module()
    dev = step.tree_mask.device
    be = backend(config, config.max_bs, dev, page_size, window)
    graph_bs, fill = captured_bs(batch.bs, config.max_bs), capture_seq_len(config)
    call_method(be, "init_cuda_graph_state", max_bs=config.max_bs, max_num_tokens=config.max_bs * config.d)
    # The graph runner's capture-time batch: every row at the fill length, an all-ones mask.
    placeholder = torch.ones(logical_size(TreeMaskMode.FULL_MASK, [fill] * graph_bs, config.d),
                             dtype=torch.bool, device=dev)
    blank = torch.zeros(graph_bs * config.d, dtype=torch.int64, device=dev)
    capture = "init_forward_metadata_out_graph"
    _run(lambda fb: call_method(be, capture, forward_batch=fb, in_capture=True),
         _verify_batch(mod, graph_bs, [fill] * graph_bs, placeholder, blank, dev), capture)
    bound_meta, expand = be.forward_metadata, _expand_pass(be, config, capture)
    merged = _window_pass(be, config, window, capture)
    pad = graph_bs - batch.bs
    seq_lens = list(batch.seq_lens) + [fill] * pad
    layout = None if verify_lens is None or config.topk > 1 else _ragged_layout(
        config, verify_lens, dev, graph_tokens=sum(verify_lens) + pad * config.d)
    raised = None
    try:
        _run(lambda fb: call_method(be, capture, forward_batch=fb, in_capture=False),
             _verify_batch(mod, graph_bs, seq_lens, step.tree_mask, step.positions, dev, layout),
             "_apply_cuda_graph_metadata")
    except OutOfStep:
        raise
    except Exception as exc:  # judged by what the capture bound first (Fa3Verify.raised)
        raised = exc
    return Fa3Verify(_pass(bound_meta), expand, graph_bs=graph_bs, raised=raised, window=merged,
                     verify_lens=None if layout is None else (*verify_lens, *[config.d] * pad))
