"""The EAGLE draft worker a draft-side cuda-graph runner is built over, standing in, and its server.

A draft-side runner (draft extend, multi-layer draft extend) is made by its
own ``__init__``, which reads the worker (its draft model runner, its draft
extend attention backend(s), its algorithm) and server-wide lookups. This
module gives both: ``draft_worker`` (stand-ins that record what the runner
reads), ``extend_backend`` (the Triton backend ``readers.triton_backend``
builds, whose cuda-graph state SGLang's ``init_cuda_graph_state`` then sets,
its KV-id buffer made a redzoned static buffer), and ``bindings``: the target
verify driver's server-wide lookups (``graph_lookups.draft_lookups``) plus the
ones draft runners make, and the process-wide buffer pool
(``input_buffers.share_input_buffer``) scoped to the session's graph space.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from vmfuzz.harness.guard.graph import GraphSpace
from vmfuzz.harness.model.config import Config
from vmfuzz.harness.targets.sglang.graph_model import HIDDEN, VOCAB
from vmfuzz.harness.targets.sglang.graph_lookups import (draft_lookups, keep_bodies, module_set, rank_place,
                                                        scoped_pool, server_args, single_gpu_helpers, static,
                                                        verify_modules)
from vmfuzz.harness.targets.sglang.stand_in import StandIn

_WORKER = "srt/speculative/eagle_worker_v2.py"
_CONTEXT = "srt/runtime_context.py"


_modules = module_set(dict(
    input_buffers="sglang.srt.model_executor.input_buffers",
    spec_info="sglang.srt.speculative.spec_info",
    spec_utils="sglang.srt.speculative.spec_utils",
    triton="sglang.srt.layers.attention.triton_backend",
    backend_utils="sglang.srt.model_executor.runner_backend.utils",
    graph_config="sglang.srt.model_executor.cuda_graph_config"))


@dataclass
class DraftServer:
    """A draft-side runner of one server, its graph space, its model, what its captures recorded."""

    config: Config
    space: GraphSpace
    model: object
    capture_bs: list[int]
    runner: object = None
    backends: list = field(default_factory=list)
    captures: dict = field(default_factory=dict)
    #: (name, numel, dtype) -> the session's one static buffer of that key (SGLang's process-wide pool)
    pool: dict = field(default_factory=dict)
    #: per-request width of the window the runner captures (d, or d + front)
    width: int = 0
    #: the draft model's sliding window (0: no window layers), its layers then reading the window rail
    window: int = 0

    @property
    def spec_algorithm(self):
        return _modules().spec_info.SpeculativeAlgorithm.EAGLE


@dataclass
class StepResult:
    """One draft-extend forward of a live batch, replayed through a graph or run eagerly: its real rows'
    logits and hidden states (and top-k, multi-layer), the model call, and for a replay the bucket B,
    the view the backend's replay metadata was built from, which of its fields the backend read, and
    the backend's query-row pointers and per-request KV lengths over B rows."""

    logits: torch.Tensor
    hidden: torch.Tensor
    forward: object
    graph_bs: int
    view: object = None
    view_reads: frozenset = frozenset()
    qo_indptr: tuple = ()
    kv_lens: tuple = ()
    topk_index: torch.Tensor | None = None


class _ReadView(SimpleNamespace):
    """A replay view's fields, noting each one read (the runner hands the backend a plain namespace,
    whose class cannot be swapped for a recording one, so the backend is handed this copy instead)."""

    def __init__(self, view, reads: set):
        super().__init__(**vars(view))
        object.__setattr__(self, "_reads", reads)

    def __getattribute__(self, name):
        if not name.startswith("_"):
            object.__getattribute__(self, "_reads").add(name)
        return object.__getattribute__(self, name)


def viewing(backend, views: list) -> tuple:
    """A patch of ``backend.init_forward_metadata_out_graph`` that keeps each replay's view (not a
    capture's) with the fields the backend read of it."""
    real = type(backend).init_forward_metadata_out_graph

    def recording(forward_batch, *args, **kwargs):
        if kwargs.get("in_capture", False):
            return real(backend, forward_batch, *args, **kwargs)
        reads: set = set()
        try:
            return real(backend, _ReadView(forward_batch, reads), *args, **kwargs)
        finally:
            views.append((forward_batch, frozenset(reads)))
    return (backend, "init_forward_metadata_out_graph", recording)


def backend_rows(backend, B: int) -> tuple[tuple, tuple]:
    """The query-row pointers and per-request KV lengths of B requests in the backend's own index
    buffers, which its eager metadata and a graph's captured metadata both are views of."""
    kv = backend.kv_indptr[:B + 1].tolist()
    return tuple(backend.qo_indptr[:B + 1].tolist()), tuple(b - a for a, b in zip(kv, kv[1:]))


def extend_backend(server: DraftServer, graphs: bool = True):
    """The draft-extend Triton backend: its own ``__init__`` for the server's numbers. ``graphs``: the
    runner will call its ``init_cuda_graph_state``, whose KV-id buffer becomes a redzoned static."""
    from vmfuzz.harness.targets.sglang.readers import triton_backend
    config = server.config
    backend = triton_backend(None, config, config.max_bs, torch.device("cpu"), server.space.heap, graphs=False,
                             window=server.window or None)
    if graphs:
        real = type(backend).init_cuda_graph_state

        def init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs):
            gathers = backend.kv_index_translator
            out = real(backend, max_bs, max_num_tokens, *args, **kwargs)
            backend.cuda_graph_kv_indices = server.space.static(
                "kv_indices", backend.cuda_graph_kv_indices, redzone_cells=config.max_context_len + 64)
            if server.window:  # the window rail a replay refills (indices, and each request's first column)
                for name in ("cuda_graph_window_kv_indices", "cuda_graph_window_kv_offsets", "window_kv_indptr"):
                    setattr(backend, name, server.space.static(name.removeprefix("cuda_graph_"),
                                                               getattr(backend, name), redzone_cells=64))
            backend.kv_index_translator = gathers
            return out
        backend.init_cuda_graph_state = init_cuda_graph_state
    return backend


def _model_runner(server: DraftServer, backend) -> StandIn:
    config = server.config
    hf = SimpleNamespace(architectures=["LlamaForCausalLMEagle"])
    return StandIn(
        "draft ModelRunner", "srt/model_executor/model_runner.py",
        device="cpu", gpu_id=0, is_draft_worker=True, spec_algorithm=server.spec_algorithm,
        model=server.model, dtype=torch.float32, attn_backend=backend,
        model_config=StandIn("draft ModelConfig", "srt/configs/model_config.py", hidden_size=HIDDEN,
                             spec_hidden_size=HIDDEN, vocab_size=VOCAB, dtype=torch.float64, hf_config=hf,
                             is_encoder_decoder=False, model_is_mrope=False, context_len=config.max_context_len),
        req_to_token_pool=SimpleNamespace(size=config.max_bs),
        server_args=server_args(config, server.capture_bs), ps=rank_place(),  # as 0.5.17-0.5.20 read them
        graph_shared_output=SimpleNamespace(
            get_logits_buffer=lambda vocab, rows: torch.zeros(rows, vocab, dtype=torch.float32)),
        kv_index_translator=SimpleNamespace(bind_runner_slots=lambda fb: None),
        canary_manager=None, device_timer=None, shared_read_done_event=None, capture_head_hooks=[],
        capture_tail_hooks=[], lora_manager=None, hisparse_coordinator=None,
        attn_tp_sequence_sharded=lambda n: False,  # one GPU, as 0.5.21 reads it off the runner
        tp_size=1, tp_group=SimpleNamespace(barrier=lambda: None))


def draft_worker(server: DraftServer, backends: list) -> StandIn:
    """The EAGLE (v2 or multi-layer) draft worker the runner's ``__init__`` reads."""
    runners = [_model_runner(server, b) for b in backends]
    algorithm = server.spec_algorithm
    return StandIn(
        "EagleDraftWorker", _WORKER, draft_runner=runners[0], draft_extend_attn_backend=backends[0],
        draft_extend_attn_backend_list=backends, mtp_model_runner=lambda step: runners[step],
        draft_runner_list=runners, speculative_algorithm=algorithm, hot_token_id=None,
        seed_dsa_topk_from_draft_extend=False, dsa_seed_topk_width=0, draft_extend_num_front_tokens=0,
        chain_mtp_hidden_states=True, use_rejection_sampling=False, topk=server.config.topk,
        speculative_num_steps=server.config.spec_steps, device="cpu", gpu_id=0)


def _share(server: DraftServer):
    """``share_input_buffer``, scoped to the session (``graph_lookups.scoped_pool``)."""
    return scoped_pool(server.space, server.pool)


def adopt(server: DraftServer, buffers, exclude=()) -> None:
    """Each tensor of a runner's buffer set a static buffer of the session (``exclude``: kept private,
    still redzoned), as the runner's own ``share_buffers`` would pool it."""
    share = _share(server)
    for name, value in list(vars(buffers).items()):
        if not isinstance(value, torch.Tensor) or not value.numel():
            continue
        if name in exclude:
            setattr(buffers, name, static(server.space, name, value))
        else:
            setattr(buffers, name, share(name, value))


def bindings(server: DraftServer, runner_modules) -> list[tuple]:
    """The server-wide lookups a draft runner makes, answered for ``server``, and its buffer pool."""
    config = server.config
    mb = _modules()
    graph = StandIn("get_exec().graph", _CONTEXT, enable_cudagraph_gc=True, debug_cuda_graph=False,
                    disable_cuda_graph_padding=False, enable_profile_cuda_graph=False,
                    cuda_graph_config=SimpleNamespace(decode=SimpleNamespace(bs=list(server.capture_bs),
                                                                             backend=mb.graph_config.Backend.FULL)),
                    torch_compile_max_bs=0)
    exec_ = StandIn("get_exec()", _CONTEXT, graph=graph,
                    overlap=SimpleNamespace(enable_two_batch_overlap=False),
                    features=SimpleNamespace(enable_memory_saver=False, enable_encoder_swa_bounded_replay=False),
                    mamba=SimpleNamespace(enable_mamba_extra_buffer=False),
                    deterministic=SimpleNamespace(enable_deterministic_inference=False))
    spec = StandIn("get_spec()", _CONTEXT, speculative_eagle_topk=config.topk,
                   speculative_num_steps=config.spec_steps, speculative_num_draft_tokens=config.d,
                   speculative_algorithm="EAGLE", speculative_use_rejection_sampling=False)
    parallel = StandIn("get_parallel()", _CONTEXT, tp_rank=0, tp_size=1, num_dp_ranks=1, pp_size=1,
                       attn_tp_size=1, attn_cp_size=1, attn_dp_enabled=False, moe_ep_size=1,
                       dp_size=1, attn_tp_rank=0, enable_dp_attention=False,  # the names 0.5.21 reads them by
                       tp_group=SimpleNamespace(barrier=lambda: None))
    answers = {"get_exec": lambda: exec_, "get_spec": lambda: spec, "get_parallel": lambda: parallel,
               "get_disagg": lambda: SimpleNamespace(enable_pdmux=False), **single_gpu_helpers()}
    out = draft_lookups(config, server.capture_bs, server.space,
                        [*runner_modules, verify_modules().base_graph, mb.spec_utils, mb.backend_utils], answers)
    out += [(mb.input_buffers, "share_input_buffer", _share(server)),
            (mb.triton, "get_spec", lambda: spec) if hasattr(mb.triton, "get_spec") else None]
    out += [(mod, "resolve_decode_backend", _keeping_bodies(server, mod.resolve_decode_backend))
            for mod in runner_modules if hasattr(mod, "resolve_decode_backend")]
    return [p for p in out if p is not None]


def _keeping_bodies(server: DraftServer, real):
    """``resolve_decode_backend``, its graph backend made to capture through the graph stand-in
    (``graph_lookups.keep_bodies``): each captured callable's outputs pooled, its closure watched."""
    def resolve_decode_backend(runner):
        backend = real(runner)
        keep_bodies(backend, server.space, lambda forward_fn: server.space.capturable(
            _pool_outputs(server.space, forward_fn), watch=_closure(forward_fn)))
        return backend
    return resolve_decode_backend


def _closure(fn) -> list[tuple[str, object]]:
    """What ``fn``'s closure holds, by name: the host state a graph of it keeps (watched for stale reads)."""
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    out = []
    for name, cell in zip(code.co_freevars if code else (), cells):
        try:
            out.append((name, cell.cell_contents))
        except ValueError:
            continue
    return out


def _pool_outputs(space: GraphSpace, forward_fn):
    """``forward_fn`` whose outputs live where its capture run's did, as a graph's outputs live in its
    memory pool: a replay writes the tensors the capture returned (SGLang keeps and hands back those
    objects), never new ones. Warm-up runs outside the capture return their own."""
    kept: dict = {}

    def graph_body():
        out = forward_fn()
        if "out" not in kept:
            if space.capturing is not None:
                kept["out"] = out
            return out
        _write_into(kept["out"], out, "output")
        return kept["out"]
    graph_body.__name__ = getattr(forward_fn, "__name__", "graph_body")
    return graph_body


def _write_into(dst, src, path: str) -> None:
    from vmfuzz.harness.guard.graph import NotFaithful
    if isinstance(dst, torch.Tensor):
        if not isinstance(src, torch.Tensor) or src.shape != dst.shape or src.dtype != dst.dtype:
            raise NotFaithful(f"a replay's {path} is not shaped as its capture's (a graph's outputs are fixed)")
        if src.data_ptr() != dst.data_ptr():
            dst.copy_(src)
    elif isinstance(dst, (list, tuple)):
        for i, (a, b) in enumerate(zip(dst, src)):
            _write_into(a, b, f"{path}[{i}]")
    elif hasattr(dst, "__dict__"):
        for name, value in vars(dst).items():
            if value is not None:
                _write_into(value, getattr(src, name, None), f"{path}.{name}")
