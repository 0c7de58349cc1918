"""What SGLang's CUDA-graph runners ask the server and the device for, answered for one runner on the CPU.

Every runner the graph path drives (target verify, draft decode, draft
extend, multi-layer draft extend) reads the same runtime context (the
speculative shape, the graph settings, one GPU, no parallelism), captures
through ``torch.cuda``'s graph names and keeps its inputs in a buffer set.
``runner_lookups`` answers the target verify runner's lookups with the graph
stand-in (``guard.graph``); ``draft_lookups`` adds a draft runner's own
answers over it. ``adopt_static`` makes a runner's buffer set the redzoned
static buffers of its graph space, ``keep_bodies`` makes a graph backend capture
through the stand-in, ``attention_context`` opens the forward context an eager
forward runs in, and ``sglang_modules`` imports a runner's SGLang modules quietly.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from types import SimpleNamespace

import torch

from vmfuzz.harness.guard.graph import GraphSpace
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang.loader import _quiet_import
from vmfuzz.harness.targets.sglang.reach import lookup_patches
from vmfuzz.harness.targets.sglang.stand_in import StandIn

_CONTEXT = "srt/runtime_context.py"

_VERIFY_MODULES = {
    "runner": "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    "base_runner": "sglang.srt.model_executor.runner.base_runner",
    "base_graph": "sglang.srt.model_executor.runner.base_cuda_graph_runner",
    "full": "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend",
    "pool": "sglang.srt.model_executor.runner_utils.pool",
    "buffers": "sglang.srt.model_executor.runner_utils.buffers",
    "registry": "sglang.srt.model_executor.cuda_graph_buffer_registry",
    "forward_info": "sglang.srt.model_executor.forward_batch_info",
    "forward_context": "sglang.srt.model_executor.forward_context",
    "logits": "sglang.srt.layers.logits_processor",
    "spec_info": "sglang.srt.speculative.spec_info",
    "eagle_info": "sglang.srt.speculative.eagle_info",
}


def sglang_modules(names: dict[str, str]) -> SimpleNamespace:
    """``names``' SGLang modules (key -> dotted name), imported without their start-up chatter."""
    from vmfuzz.harness.targets.sglang.imports import sglang_module
    with _quiet_import():
        return SimpleNamespace(**{k: sglang_module(v) for k, v in names.items()})


def module_set(names: dict[str, str]):
    """A loader of ``names``' SGLang modules: imported on its first call, the same namespace after."""
    return functools.lru_cache(maxsize=None)(lambda: sglang_modules(names))


#: the target verify runner's modules (``graph_runner.modules``)
verify_modules = module_set(_VERIFY_MODULES)


def answers(config, capture_bs: list[int], pp_size: int = 1) -> dict:
    """The runtime context a single-GPU EAGLE server of ``config``'s shape answers (``pp_size``: its
    pipeline stages; this runner is one stage's)."""
    spec = StandIn("get_spec()", _CONTEXT, speculative_eagle_topk=config.topk,
                   speculative_num_steps=config.spec_steps, speculative_num_draft_tokens=config.d,
                   speculative_algorithm="EAGLE")
    graph = StandIn("get_exec().graph", _CONTEXT, enable_cudagraph_gc=True, debug_cuda_graph=False,
                    disable_cuda_graph_padding=False, enable_profile_cuda_graph=False,
                    cuda_graph_config=None, torch_compile_max_bs=0)
    exec_ = StandIn("get_exec()", _CONTEXT, graph=graph,
                    overlap=StandIn("get_exec().overlap", _CONTEXT, enable_two_batch_overlap=False),
                    features=StandIn("get_exec().features", _CONTEXT, enable_memory_saver=False,
                                     enable_encoder_swa_bounded_replay=False))
    flags = StandIn("get_flags()", _CONTEXT, capture=StandIn("get_flags().capture", _CONTEXT,
                                                             enable_torch_compile=False))
    parallel = StandIn("get_parallel()", _CONTEXT, tp_rank=0, tp_size=1, num_dp_ranks=1, dp_size=1, pp_size=pp_size,
                       attn_tp_size=1, attn_dp_enabled=False, moe_ep_size=1, attn_tp_rank=0, enable_dp_attention=False,
                       tp_group=SimpleNamespace(barrier=lambda: None))
    resources = StandIn("get_resources()", _CONTEXT, graph_memory_pool=None, graph_pool_borrow=None)

    class _Model:
        @staticmethod
        def override(**_):
            return contextlib.nullcontext()
    return {"get_spec": lambda: spec, "get_exec": lambda: exec_, "get_flags": lambda: flags,
            "get_resources": lambda: resources, "get_parallel": lambda: parallel, "get_model": lambda: _Model,
            # a single GPU, no expert parallelism: the non-padded token count is never maintained
            "enable_num_token_non_padded": lambda: False}


def server_args(config, capture_bs: list[int], pp_size: int = 1) -> StandIn:
    """The ``ServerArgs`` of a single-GPU EAGLE server of ``config``'s shape capturing ``capture_bs``
    (``answers``' settings), under the names SGLang 0.5.17-0.5.20's runner set-up reads them off
    ``model_runner.server_args``; later releases ask the runtime context for them."""
    from sglang.srt.model_executor.cuda_graph_config import Backend
    return StandIn(
        "ServerArgs", "srt/server_args.py", dllm_algorithm=None,
        speculative_algorithm="EAGLE", speculative_eagle_topk=config.topk,
        speculative_num_steps=config.spec_steps, speculative_num_draft_tokens=config.d,
        cuda_graph_config=SimpleNamespace(decode=SimpleNamespace(bs=list(capture_bs), backend=Backend.FULL)),
        disable_cuda_graph_padding=False, enable_cudagraph_gc=True, debug_cuda_graph=False,
        enable_profile_cuda_graph=False, torch_compile_max_bs=0, enable_torch_compile_debug_mode=False,
        # one GPU: no tensor, pipeline, data or decode-context parallelism, no overlap, LoRA, PD multiplexing
        tp_size=1, pp_size=pp_size, dp_size=1, dcp_size=1, enable_dp_attention=False,
        enable_two_batch_overlap=False, enable_lora=False, enable_pdmux=False, enable_memory_saver=False,
        flashinfer_allreduce_fusion_backend=None, moe_a2a_backend="none",
        enable_mamba_extra_buffer=lambda: False)


def single_gpu_helpers() -> dict:
    """The parallelism helpers a runner's set-up calls, answered for one GPU: no gathered, MLP-synced or
    attention-TP buffers, no attention DP or context parallelism, every batch size aligned. 0.5.17-0.5.20
    pass them the server_args, later releases read the runtime context: the answer is the same."""
    def never(*_, **__):
        return False
    return {"require_gathered_buffer": never, "require_mlp_tp_gather": never, "require_mlp_sync": never,
            "require_attn_tp_gather": never, "is_dsa_enable_prefill_cp": never, "is_mla_cp_enabled": never,
            "is_mla_prefill_cp_enabled": never,  # its name up to 0.5.20
            "deployment_attn_dp_size": lambda *_, **__: 1, "is_npu": lambda: False,
            "get_cuda_graph_batch_size_alignment": lambda *_, **__: 1}


def rank_place(pp_size: int = 1) -> StandIn:
    """This rank's place among a single-GPU server's parallel groups (the last of ``pp_size`` pipeline
    stages), as 0.5.17-0.5.20 keep it on the model runner (``ModelRunner.ps``)."""
    return StandIn("ModelRunner.ps", "srt/model_executor/model_runner.py", tp_rank=0, tp_size=1,
                   pp_rank=pp_size - 1, pp_size=pp_size, dp_rank=0, attn_dp_size=1, attn_cp_size=1, moe_ep_size=1)


@contextlib.contextmanager
def _no_gc_freeze(enable_cudagraph_gc: bool = False):
    yield


class _Quiet:
    """The capture loop's progress bar, silent (a run prints its own progress)."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)

    def set_description(self, *_):
        pass


def runner_lookups(config, capture_bs: list[int], space: GraphSpace, pp_size: int = 1) -> list[tuple]:
    """The target verify runner's server-wide lookups and ``torch.cuda``'s graph names, answered for a
    runner of ``config``'s shape capturing ``capture_bs`` in ``space`` (patches for ``binding.bound``)."""
    m = verify_modules()
    default = space.device_module().current_stream()

    @contextlib.contextmanager
    def graph_capture(stream=None, **_):
        yield SimpleNamespace(stream=default)

    out = lookup_patches([m.runner, m.base_runner, m.base_graph, m.full, m.pool, m.buffers, m.registry],
                         answers(config, capture_bs, pp_size))
    out += [
        (m.runner, "graph_capture", graph_capture),
        (m.runner, "get_available_gpu_memory", lambda *a, **k: 0.0),
        (m.runner, "tqdm", SimpleNamespace(tqdm=_Quiet)),
        # GPU-memory housekeeping around a capture: two full collections of this process's heap
        # (torch and SGLang loaded: 0.35 s each, 40 % of a graph check), nothing a graph computes
        (m.runner, "freeze_gc", _no_gc_freeze),
        # torch.cuda's graph names, as FullCudaGraphBackend reaches them
        (torch.cuda, "CUDAGraph", space.CUDAGraph),
        (torch.cuda, "graph", space.graph),
        (torch.cuda, "graph_pool_handle", space.graph_pool_handle),
        # the side stream the metadata glue graph captures on (faithful only as a capture's stream)
        (torch.cuda, "Stream", space.Stream),
    ]
    # Names a release's runner module may not hold (0.5.17-0.5.20 capture on graph_capture()'s own stream
    # and tune nothing): a module-level name it lacks is one its code cannot call, so there is nothing to
    # answer; a call that reaches the real one another way is caught as bypassed by ``binding.bound``.
    out += [(m.runner, name, answer) for name, answer in (
        ("get_or_create_global_graph_capture_stream", lambda: default),
        ("maybe_flashinfer_autotune_speculative_draft", lambda *a, **k: None)) if hasattr(m.runner, name)]
    return out


def draft_lookups(config, capture_bs: list[int], space: GraphSpace, modules: list, context: dict) -> list[tuple]:
    """A draft runner's lookups: the target verify runner's (``runner_lookups``), then ``context``'s
    answers wherever ``modules`` look them up, and the device module the graph space stands for."""
    out = runner_lookups(config, capture_bs, space)
    out += lookup_patches([*modules, *bucket_helpers()], context)
    device = space.device_module()
    return out + [(torch, "get_device_module", lambda *a, **k: device)]


def bucket_helpers() -> list:
    """The modules of the helpers a release's bucket sizing calls by name and that make server-wide
    lookups in their own module (0.5.21's ``get_cuda_graph_max_batch_size``), for those lookups to be
    answered there too while the helper runs as itself; none where the sizing makes them itself."""
    helper = getattr(verify_modules().base_graph, "get_cuda_graph_max_batch_size", None)
    return [inspect.getmodule(helper)] if helper is not None else []


def static(space: GraphSpace, name: str, value: torch.Tensor) -> torch.Tensor:
    """One runner buffer as a redzoned static buffer of ``space`` (same contents)."""
    return space.static(name, value, redzone_cells=max(64, value.numel() // 4))


def scoped_pool(space: GraphSpace, pool: dict):
    """SGLang's process-wide ``share_input_buffer``, scoped to one graph space's ``pool``: the first
    buffer of a (name, numel, dtype) key becomes a redzoned static buffer of ``space``, and every later
    one of the same key a view of it, as SGLang's pool hands it out."""
    def share_input_buffer(name: str, new_buffer: torch.Tensor) -> torch.Tensor:
        key = (name, new_buffer.numel(), new_buffer.dtype)
        canonical = pool.get(key)
        if canonical is None:
            canonical = pool[key] = static(space, name, new_buffer.contiguous())
        return canonical.as_strided(new_buffer.size(), new_buffer.stride())
    return share_input_buffer


def adopt_static(buffers, space: GraphSpace) -> None:
    """Every tensor of a runner's buffer set, adopted as a redzoned static buffer (same contents)."""
    for name, value in list(vars(buffers).items()):
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.numel():
            setattr(buffers, name, static(space, name, value))


def keep_bodies(backend, space: GraphSpace, body=None) -> None:
    """A graph backend's ``capture_one`` and ``replay`` made the stand-in's: each captured callable kept
    as a graph's body (``body(forward_fn)``; default ``space.capturable``), and the forward context it was
    captured in kept with it. A graph's kernels read the attention metadata of the backend they were
    captured against, whichever context is current at replay; the stand-in re-runs Python that finds that
    backend through the forward context, so a replay restores the capture's (SGLang 0.5.22's capture
    body opens none of its own; 0.5.23's opens the same one inside)."""
    fc = verify_modules().forward_context
    capture_one, replay = type(backend).capture_one, type(backend).replay
    make = body or space.capturable
    contexts: dict = {}

    def capturing(shape_key, forward_fn, *args, **kwargs):
        contexts[shape_key] = fc.get_forward_context() if fc.has_forward_context() else None
        return capture_one(backend, shape_key, make(forward_fn), *args, **kwargs)

    def replaying(shape_key, *args, **kwargs):
        prev = fc.set_forward_context(contexts.get(shape_key))
        try:
            return replay(backend, shape_key, *args, **kwargs)
        finally:
            fc.set_forward_context(prev)
    backend.capture_one, backend.replay = capturing, replaying


def attention_context(backend, forward_batch):
    """The forward context an eager forward of ``forward_batch`` over ``backend`` runs in, opened as this
    SGLang's ``forward_context`` takes it (0.5.23 also lends it the batch; 0.5.22 takes the context alone)."""
    fc = verify_modules().forward_context
    ctx = fc.ForwardContext(attn_backend=backend)
    if "forward_batch" in inspect.signature(fc.forward_context).parameters:
        return fc.forward_context(ctx, forward_batch=forward_batch)
    return fc.forward_context(ctx)


def fitted(fn, name: str):
    """``fn``, refused before the call (out of step) where this release's signature takes other arguments
    than the hand assembly passes (0.5.21's buffer set): the harness's wiring, never SGLang's raise."""
    def call(**kwargs):
        try:
            inspect.signature(fn).bind(**kwargs)
        except TypeError as exc:
            raise OutOfStep(name, fn.__module__, f"takes other arguments than the runner's hand assembly passes "
                                                 f"({exc})") from None
        return fn(**kwargs)
    return call
