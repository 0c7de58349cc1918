"""SGLang's draft-decode ``EAGLEDraftCudaGraphRunner``, built, captured and replayed on the CPU.

The runner is made by its own ``__init__`` (so its static buffers, its bucket
list's max, its backend's graph state and its capture are SGLang's), for a
single-GPU EAGLE server of the case's shape: ``k`` = topk, ``n`` = steps,
``C`` = context length. What it is handed:

- its draft worker: an ``EagleDraftWorker`` made with ``object.__new__`` and
  given the fields ``draft_forward`` reads (topk, steps, draft tokens, the
  topk-1 chain buffers SGLang's own ``_rebuild_topk1_chain_buffers`` builds);
  the captured body is the worker's real ``draft_forward``;
- its draft attention backend: SGLang's ``TritonMultiStepDraftBackend`` by its
  own ``__init__`` and ``init_cuda_graph_state``; the ``kv_indices`` and
  ``kv_indptr`` graph buffers are then adopted as redzoned static buffers
  (``GraphSpace.static``) and the per-step backends pointed at the adopted
  rows, as they held the originals' rows;
- the draft model forward: ``draft_model.RecordingDraftModel``;
- the KV-index translator: SGLang's own ``KVIndexTranslator`` over a static
  pool (its passthrough read source), whose ``req_to_token`` is redzoned and
  names in each cell its row and column (slot ``1 + row*R + column``);
- ``torch.cuda``'s graph names, the device module and the static-buffer
  sharing: the graph stand-in (``guard.graph``); one runner here, so
  ``share_buffers`` adopts its buffers as static instead of aliasing them.

A shape with a ``window`` is a model with window layers (``sliding_window_size``):
the backend then builds its per-step window rail (``_fill_window_rail``, the
``generate_draft_decode_window_kv_indices`` kernel), whose graph buffers are
adopted as redzoned static buffers too. Its KV is one static pool (reads pass
through) unless the shape's ``window_pool``: then it is ``swa_server``'s hybrid
pool (SGLang's ``SWAKVPool``, the harness's map) under SGLang's own
``KVIndexTranslator`` over the redzoned ``req_to_token``, so the rail's rows are
translated to window slots, each live batch carries its KV-location plan
(``own_plan``, as a lone forward's), and before a replay each step's window
write slots are refilled from its columns of the plan (``_step_writes``,
``_fill_cuda_graph_swa_out_cache_loc``), the per-step buffers adopted as
redzoned static buffers.

Pool row 0 is the reserved row padding reads; real requests sit in rows
``max_bs .. 1`` (last first). A shape's ``seeded_sampling`` is a chain server
with rejection sampling under deterministic inference: each live batch then
carries warm temperatures, the whole vocabulary and a seed per request, the
draft steps sample (SGLang's seeded draw, its hash SGLang's Triton kernel run
interpreted, ``_seed_hash``), and the runner copies the seeds into its graph's
buffer before a replay. Not driven: unseeded sampling (a graph's RNG), DP/MLP-sync
gathers, DSA seeds, mrope, canary, hot-token maps (each off in this server).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from vmfuzz.harness.guard.graph import GraphSpace
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.allocation import ServerNumbers
from vmfuzz.harness.model.draft_graph import DraftShape, window_slot
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang import swa_server
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.draft_model import HIDDEN, VOCAB, RecordingDraftModel, Step
from vmfuzz.harness.targets.sglang.kv_ids import static_translator, translator_module
from vmfuzz.harness.targets.sglang.graph_lookups import (adopt_static, answers, draft_lookups, module_set,
                                                        server_args, single_gpu_helpers)

RUNNER_FILE = "srt/speculative/eagle_draft_cuda_graph_runner.py"
TRITON_FILE = "srt/layers/attention/triton_backend.py"
PROPS = ("graph-replay-equivalence", "padding-inert", "capture-replay-agreement", "graph-buffer-soundness")

#: What this module drives: (path under the sglang package, function, properties).
SURFACE = tuple((RUNNER_FILE, fn, PROPS) for fn in (
    "EAGLEDraftCudaGraphRunner.__init__", "EAGLEDraftCudaGraphRunner._replay_graph",
    "EAGLEDraftCudaGraphRunner._cache_loc_dtype", "EAGLEDraftCudaGraphRunner._make_graph_key",
    "EAGLEDraftCudaGraphRunner._sampling_variant", "EAGLEDraftCudaGraphRunner.can_run_graph",
    "EAGLEDraftCudaGraphRunner.capture_one_shape", "EAGLEDraftCudaGraphRunner._postprocess_output_to_raw_bs",
    "EAGLEDraftCudaGraphRunner.execute",
)) + tuple((TRITON_FILE, fn, PROPS) for fn in (
    "TritonMultiStepDraftBackend.__init__", "TritonMultiStepDraftBackend.common_template",
    "TritonMultiStepDraftBackend.init_forward_metadata", "TritonMultiStepDraftBackend.init_cuda_graph_state",
    "TritonMultiStepDraftBackend.init_forward_metadata_out_graph",
    "TritonMultiStepDraftBackend.init_forward_metadata_in_graph", "TritonMultiStepDraftBackend._fill_window_rail",
)) + (
    ("srt/speculative/eagle_worker_v2.py", "EagleDraftWorker.draft_forward", PROPS),
    ("kernels/ops/speculative/cache_locs.py", "generate_draft_decode_kv_indices", PROPS),
    ("kernels/ops/speculative/cache_locs.py", "generate_draft_decode_window_kv_indices", PROPS),
    ("srt/speculative/spec_utils.py", "draft_kv_indices_buffer_width", PROPS),
    ("srt/speculative/spec_utils.py", "draft_kv_indices_used_len", PROPS),
    ("srt/speculative/eagle_utils.py", "per_step_draft_out_cache_loc", PROPS),
)

_MODULES = {
    "runner": "sglang.srt.speculative.eagle_draft_cuda_graph_runner",
    "worker": "sglang.srt.speculative.eagle_worker_v2",
    "base_worker": "sglang.srt.speculative.base_spec_worker",
    "triton": "sglang.srt.layers.attention.triton_backend",
    "spec_utils": "sglang.srt.speculative.spec_utils",
    "backend_utils": "sglang.srt.model_executor.runner_backend.utils",
    "capture_mode": "sglang.srt.model_executor.runner_utils.capture_mode",
    "forward_info": "sglang.srt.model_executor.forward_batch_info",
    "eagle_info": "sglang.srt.speculative.eagle_info",
    "spec_info": "sglang.srt.speculative.spec_info",
    "sampling": "sglang.srt.sampling.sampling_batch_info",
    "murmur": "sglang.kernels.ops.sampling.murmur_hash",
}


#: SGLang's modules this runner lives in (imported on first use)
modules = module_set(_MODULES)


@dataclass
class DraftServer:
    """A draft-decode runner captured at every captured bs, and what it was built over."""

    shape: DraftShape
    runner: object
    worker: object
    backend: object  # the TritonMultiStepDraftBackend
    eager_backend: object  # another, for the eager reference (a graph's backends keep their capture's state)
    space: GraphSpace
    model: RecordingDraftModel
    req_to_token: torch.Tensor
    capture_bs: list[int]
    replay_views: list[SimpleNamespace] = field(default_factory=list)


@dataclass
class Drafted:
    """One draft: what it returned (cut to the raw rows), the model's steps, the padded bs, the view."""

    parent_list: torch.Tensor
    top_scores_index: torch.Tensor
    draft_tokens: torch.Tensor
    steps: list[Step]
    graph_bs: int
    view: SimpleNamespace | None = None
    #: what execute raised after the backend was handed its view (judged after the view)
    raised: BaseException | None = None


def _context(shape: DraftShape, capture_bs: list[int]) -> dict:
    """The runtime-context answers: the target runner's (``graph_lookups.answers``) plus what the
    draft path asks besides (no rejection sampling, no deterministic inference, the schedule)."""
    config = SimpleNamespace(topk=shape.topk, spec_steps=shape.steps, d=shape.draft_tokens)
    out = answers(config, capture_bs)
    spec = out["get_spec"]()
    spec.speculative_use_rejection_sampling = shape.seeded_sampling
    exec_ = out["get_exec"]()
    exec_.deterministic = SimpleNamespace(enable_deterministic_inference=shape.seeded_sampling)
    schedule = SimpleNamespace(page_size=shape.page_size, max_running_requests=max(capture_bs))
    out["get_schedule"] = lambda: schedule
    helpers = single_gpu_helpers()  # 0.5.17-0.5.20 hand these the server_args
    out.update({name: helpers[name] for name in ("require_gathered_buffer", "require_mlp_tp_gather",
                                                 "require_mlp_sync", "require_attn_tp_gather",
                                                 "deployment_attn_dp_size")})
    return out


def bindings(server_or_shape, capture_bs: list[int], space: GraphSpace) -> list[tuple]:
    m = modules()
    shape = getattr(server_or_shape, "shape", server_or_shape)
    config = SimpleNamespace(topk=shape.topk, spec_steps=shape.steps, d=shape.draft_tokens)
    out = draft_lookups(config, capture_bs, space,
                        [m.runner, m.worker, m.base_worker, m.backend_utils, m.capture_mode, m.spec_utils],
                        _context(shape, capture_bs))
    out += [(m.runner, "get_batch_sizes_to_capture", lambda *a, **k: (list(capture_bs), [])),
            (m.murmur, "murmur_hash32", _seed_hash)]
    # a release that tunes nothing before its draft capture holds no tuner to answer (0.5.17-0.5.20)
    if hasattr(m.runner, "maybe_flashinfer_autotune_speculative_draft"):
        out.append((m.runner, "maybe_flashinfer_autotune_speculative_draft", lambda *a, **k: None))
    return out


def _seed_hash(seed, positions, col_indices):
    """A seeded draw's hash through SGLang's own Triton kernel (interpreted here): on CPU tensors its wrapper
    would load the CPU engine's compiled op instead (sgl_kernel: not installed, not the code under test)."""
    rows, cols, block = seed.shape[0], col_indices.shape[0], 1024
    hashed = torch.empty((rows, cols), dtype=torch.uint32)
    modules().murmur.murmur_hash32_kernel[(rows, -(-cols // block))](
        seed, positions, col_indices, hashed, rows, cols, BLOCK_SIZE=block)
    return hashed


def _pool(shape: DraftShape, heap: ShadowHeap, rows: int) -> torch.Tensor:
    """``req_to_token``: each cell names its row and column (slot ``1 + row*R + column``), redzoned."""
    width = shape.row_width
    table = heap.alloc("req_to_token", rows * width, torch.int32, redzone_cells=64).view(rows, width)
    table.copy_(torch.arange(rows * width, dtype=torch.int32).view(rows, width) + 1)
    return table


def _model_runner(shape: DraftShape, capture_bs: list[int], heap: ShadowHeap, space: GraphSpace):
    from vmfuzz.harness.targets.sglang import backend_init
    m = modules()
    numbers = ServerNumbers(max(capture_bs), shape.context_len, shape.draft_tokens, shape.topk, shape.steps)
    # row 0 for padding, then room for a batch past max_bs (which can_run_graph must refuse)
    table = _pool(shape, heap, 2 * max(capture_bs) + 2)
    slots = table.numel() + 1  # every slot a cell names (``1 + row*R + column``), and the sink
    kv_pool = swa_server.hybrid_pool(slots, lambda full: window_slot(full, slots)) if shape.window_pool else None
    runner = backend_init.model_runner(numbers, "cpu", page_size=shape.page_size,
                                       sliding_window_size=shape.window or None, kv_pool=kv_pool)
    runner.req_to_token_pool = SimpleNamespace(size=table.shape[0], req_to_token=table)
    translators = translator_module()
    if kv_pool is not None:
        runner.kv_index_translator = swa_server.translator_over(kv_pool, table)
    elif translators is not None:
        runner.kv_index_translator = static_translator(translators.KVIndexTranslator, table, shape.page_size)
    # else a release without the translator (0.5.17, 0.5.18): its backends read the pool's table themselves
    runner.server_args.speculative_draft_window_size = None
    # the graph settings 0.5.17-0.5.20's runner set-up reads off server_args, where the backend's lack them
    shape_config = SimpleNamespace(topk=shape.topk, spec_steps=shape.steps, d=shape.draft_tokens)
    for name, value in vars(server_args(shape_config, capture_bs)).items():
        if name not in vars(runner.server_args):
            setattr(runner.server_args, name, value)
    # seeded draft sampling, as ``_context`` answers it for the runtime context
    runner.server_args.speculative_use_rejection_sampling = shape.seeded_sampling
    runner.server_args.enable_deterministic_inference = shape.seeded_sampling
    mc = runner.model_config
    mc.vocab_size, mc.spec_hidden_size, mc.dtype, mc.model_is_mrope = VOCAB, HIDDEN, torch.float64, False
    mc.hf_config = SimpleNamespace(architectures=["LlamaForCausalLMEagle"])
    runner.spec_algorithm = m.spec_info.SpeculativeAlgorithm.EAGLE
    runner.is_draft_worker, runner.canary_manager, runner.device_timer = True, None, None
    # one GPU, where the draft runner's set-up reads it off the runner (0.5.21)
    runner.tp_size, runner.tp_group = 1, SimpleNamespace(barrier=lambda: None)
    return runner, numbers, table


def _adopt_graph_state(backend, space: GraphSpace) -> None:
    """The backend's graph buffers as redzoned static buffers; the per-step backends held rows of the
    originals, so they are pointed at the adopted rows."""
    backend.cuda_graph_kv_indices = space.static("kv_indices", backend.cuda_graph_kv_indices, redzone_cells=512)
    backend.kv_indptr = space.static("kv_indptr", backend.kv_indptr, redzone_cells=64)
    for i, step in enumerate(backend.attn_backends):
        step.cuda_graph_kv_indices = backend.cuda_graph_kv_indices[i]
        step.kv_indptr = backend.kv_indptr[i]
    if getattr(backend, "window_rail", False):  # a windowed model's per-step window rail (its captures read rows)
        backend.cuda_graph_window_kv_indices = space.static("window_kv_indices", backend.cuda_graph_window_kv_indices,
                                                            redzone_cells=512)
        backend.window_kv_indptr = space.static("window_kv_indptr", backend.window_kv_indptr, redzone_cells=64)
    for i, step in enumerate(backend.attn_backends):  # a hybrid pool's per-step window write slots
        loc = getattr(step, "cuda_graph_swa_out_cache_loc", None)
        if isinstance(loc, torch.Tensor) and loc.numel():
            step.cuda_graph_swa_out_cache_loc = space.static(f"swa_out_cache_loc[{i}]", loc, redzone_cells=64)


def build(shape: DraftShape, capture_bs: list[int], heap: ShadowHeap | None = None) -> DraftServer:
    """The draft-decode runner of a server of ``shape``, by its own ``__init__``, captured at ``capture_bs``."""
    from vmfuzz.harness.targets.sglang import backend_init
    m = modules()
    space = GraphSpace(heap or ShadowHeap())
    capture_bs = sorted(set(capture_bs))
    runner_mr, numbers, table = _model_runner(shape, capture_bs, space.heap, space)
    with bound(*backend_init.lookups_bound(m.triton, m.triton.TritonMultiStepDraftBackend, numbers,
                                           shape.page_size)):
        backend = m.triton.TritonMultiStepDraftBackend(runner_mr, shape.topk, shape.steps)
        eager_backend = m.triton.TritonMultiStepDraftBackend(runner_mr, shape.topk, shape.steps)
    model = RecordingDraftModel(space, backend.attn_backends + eager_backend.attn_backends)
    runner_mr.forward = model.forward
    # the capture loop hands the model's forward to capture_one_shape, which drafts through the worker instead
    runner_mr.model = SimpleNamespace(shared_experts_config=None, forward=model.forward)
    worker = _worker(shape, runner_mr, backend, capture_bs, space)
    real_state = type(backend).init_cuda_graph_state

    def init_cuda_graph_state(max_bs, max_num_tokens):
        real_state(backend, max_bs, max_num_tokens)
        _adopt_graph_state(backend, space)

    def share_buffers(buffers):  # one runner: nothing to alias; its buffers become the graph's statics
        adopt_static(buffers, space)

    real_resolve = m.runner.resolve_decode_backend

    def resolve(runner):
        graphs = real_resolve(runner)
        real_capture = type(graphs).capture_one

        def capture_one(shape_key, forward_fn, *args, **kwargs):
            body = space.capturable(forward_fn, watch=[(f"attn_backends[{i}]", b)
                                                       for i, b in enumerate(backend.attn_backends)])
            model.in_graph = True
            try:
                return real_capture(graphs, shape_key, body, *args, **kwargs)
            finally:
                model.in_graph = False
        graphs.capture_one = capture_one
        real_replay = type(graphs).replay

        def replay(*args, **kwargs):
            model.in_graph = True
            try:
                return real_replay(graphs, *args, **kwargs)
            finally:
                model.in_graph = False
        graphs.replay = replay
        return graphs

    with bound(*bindings(shape, capture_bs, space), (backend, "init_cuda_graph_state", init_cuda_graph_state),
               (m.runner.EagleDraftInputBuffers, "share_buffers", share_buffers),
               (m.runner, "resolve_decode_backend", resolve)):
        runner = m.runner.EAGLEDraftCudaGraphRunner(worker, draft_attn_backend=backend)
    space.settle()
    return DraftServer(shape, runner, worker, backend, eager_backend, space, model, table, capture_bs)


def _worker(shape: DraftShape, runner_mr, backend, capture_bs, space: GraphSpace):
    """An ``EagleDraftWorker`` with the fields its ``draft_forward`` and the runner's set-up read."""
    m = modules()
    worker = object.__new__(m.worker.EagleDraftWorker)
    fields = dict(topk=shape.topk, speculative_num_steps=shape.steps, speculative_num_draft_tokens=shape.draft_tokens,
                  hot_token_id=None, index_share_for_mtp_iteration=False, seed_dsa_topk_from_draft_extend=False,
                  dsa_seed_topk_width=0, draft_runner=runner_mr, draft_attn_backend=backend, device="cpu",
                  server_args=runner_mr.server_args)
    for k, v in fields.items():
        setattr(worker, k, v)
    with bound(*bindings(shape, capture_bs, space)):
        worker._rebuild_topk1_chain_buffers()
    if shape.topk != 1:
        worker._topk1_parents_prealloc = torch.zeros(0, 0, dtype=torch.long)
    return worker


# -- live batches ----------------------------------------------------------------------------------

def live_batch(server: DraftServer, seq_lens: list[int], topk_p, topk_index, hidden, out_cache_loc):
    """A live draft-decode ForwardBatch: requests in pool rows ``bs .. 1``, positions ``s_b`` per branch."""
    m = modules()
    k = server.shape.topk
    bs = len(seq_lens)
    lens = torch.tensor(seq_lens, dtype=torch.long)
    spec = m.eagle_info.EagleDraftInput(
        topk_p=topk_p.clone(), topk_index=topk_index.clone(), hidden_states=hidden.clone(),
        capture_hidden_mode=m.forward_info.CaptureHiddenMode.LAST)
    sampling = m.sampling.SamplingBatchInfo(
        temperatures=torch.ones(bs, 1), top_ps=torch.ones(bs), top_ks=torch.ones(bs, dtype=torch.int32),
        min_ps=torch.zeros(bs), is_all_greedy=False, is_any_greedy=False, need_top_p_sampling=False,
        need_top_k_sampling=False, need_min_p_sampling=False, vocab_size=VOCAB)
    if server.shape.seeded_sampling:  # sampled drafts: warm rows over the whole vocabulary, a seed per request
        # never 0 (the seed buffer's start) and a batch's own, so a seed a replay leaves stale draws otherwise
        sampling.temperatures = torch.tensor([[0.5 + 0.25 * b] for b in range(bs)])
        sampling.top_ks = torch.full((bs,), VOCAB, dtype=torch.int32)
        sampling.sampling_seed = torch.tensor([7919 * s + 104729 * b + 31 * bs + 1 for b, s in enumerate(seq_lens)])
        spec.draft_probs = torch.softmax(torch.arange(bs * VOCAB, dtype=torch.float32).view(bs, VOCAB) % 5, dim=-1)
    fb = m.forward_info.ForwardBatch(
        forward_mode=m.forward_info.ForwardMode.DECODE, batch_size=bs, input_ids=None,
        req_pool_indices=torch.arange(bs, 0, -1, dtype=torch.long), seq_lens=lens, seq_lens_cpu=lens.clone(),
        out_cache_loc=out_cache_loc.clone(), seq_lens_sum=int(lens.sum()), return_logprob=False,
        positions=lens.repeat_interleave(k), spec_algorithm=server.runner.model_runner.spec_algorithm,
        spec_info=spec, sampling_info=sampling, capture_hidden_mode=m.forward_info.CaptureHiddenMode.LAST)
    if server.shape.window_pool:  # the plan a lone draft forward gets (its window writes are read from it)
        server.runner.model_runner.kv_index_translator.bind_own_plan(fb)
    return fb


def can_run(server: DraftServer, fb) -> bool:
    with bound(*bindings(server, server.capture_bs, server.space)):
        return bool(server.runner.can_run_graph(fb))


def replay(server: DraftServer, fb) -> Drafted:
    """``execute`` a live batch: padded to its graph, copied in, the out-of-graph metadata, replayed."""
    backend, views = server.backend, server.replay_views
    real = type(backend).init_forward_metadata_out_graph

    def recording(forward_batch, *args, **kwargs):
        if not kwargs.get("in_capture", False):
            views.append(SimpleNamespace(**vars(forward_batch)))
        return real(backend, forward_batch, *args, **kwargs)
    n0 = len(server.model.steps)
    server.model.kv = {}
    try:
        with bound(*bindings(server, server.capture_bs, server.space),
                   (backend, "init_forward_metadata_out_graph", recording)):
            out = server.runner.execute(fb)
    except AssertionError as exc:  # SGLang's own check; a property judges the view it was handed first
        if not views:
            raise
        empty = torch.empty(0)
        return Drafted(empty, empty, empty, [], server.runner.bs, views[-1], exc)
    steps = server.model.steps[n0:]
    if len(steps) != server.shape.steps - 1:
        raise OutOfStep("EAGLEDraftCudaGraphRunner.execute", RUNNER_FILE,
                        f"a replay ran {len(steps)} draft model steps (the graph body runs {server.shape.steps - 1})")
    return Drafted(out[0].clone(), out[1].clone(), out[2].clone(), steps, server.runner.bs,
                   views[-1] if views else None)


def eager(server: DraftServer, fb) -> Drafted:
    """The same batch drafted eagerly, as ``EagleDraftWorker.draft`` does when no graph runs it: the
    backend's eager metadata (``init_forward_metadata``), then ``draft_forward`` on the raw batch."""
    n0 = len(server.model.steps)
    server.model.kv = {}
    backend = server.eager_backend
    with bound(*bindings(server, server.capture_bs, server.space), (server.worker, "draft_attn_backend", backend)):
        backend.init_forward_metadata(fb)
        fb.mark_forward_metadata_ready()
        out = server.worker.draft_forward(fb)
    return Drafted(out[0].clone(), out[1].clone(), out[2].clone(), server.model.steps[n0:], fb.batch_size)
