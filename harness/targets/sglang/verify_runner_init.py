"""SGLang's target verify ``DecodeCudaGraphRunner`` made by its own ``__init__`` over a stand-in model runner.

``made_by_init`` calls the runner's ``__init__`` as a server's ``ModelRunner``
does for an EAGLE target on one GPU, so what it decides is SGLang's own: the
captured batch sizes (``get_batch_sizes_to_capture`` over the configured list
and the request pool), ``max_bs``, the tokens per request it captures
(``ModelRunner.decode_num_tokens_per_req``, SGLang's own method bound to the
stand-in), ``max_num_token``, the attention backend's cuda-graph state
(``init_cuda_graph_state`` at those sizes), the static buffers
(``DecodeInputBuffers.create``), which of them go to the process-wide pool
(``share_buffers``) and the buffer registry. The capture ``__init__`` ends with
is held back until the caller asks for it (``capture``), so what ``__init__``
sized (``Sizing``) can be judged before any graph reads it.

What only the harness can supply, and is never judged as SGLang's:

- the server's configuration: the configured capture list
  (``cuda_graph_config.decode.bs``, the caller's ``capture_bs``), the request
  pool's depth (``req_to_token_pool.size`` = the largest of that list), one GPU,
  no DP, TBO, LoRA, DLLM, mamba (``init_lookups``), the metadata glue graph
  switched on only where the caller asks (``glue_graph.switched_on``);
- the model: the recording stand-in (``graph_model``), its width, vocabulary
  and dtype (``HIDDEN``, ``VOCAB``, float32), a Llama-like hf config;
- the shared logits output (``graph_shared_output``): a zeroed tensor of the
  rows and vocabulary the runner asks for;
- the device: every tensor the process-wide pool or the backend's graph set-up
  keeps becomes a redzoned static buffer of the session's ``GraphSpace``, the
  graph names are the stand-in's (``guard.graph``), and the KV-id gather of the
  backend is the harness's (``readers.triton_backend``).

A release whose ``__init__`` asks for what the stand-ins lack (or whose
signature this does not fit) raises ``NotDriven`` with why; the caller then
assembles the runner by hand and reports ``__init__`` not driven.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from vmfuzz.harness.guard.graph import GraphSpace
from vmfuzz.harness.model import consultation
from vmfuzz.harness.model.config import Config
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.graph_lookups import answers as graph_answers
from vmfuzz.harness.targets.sglang.graph_lookups import (bucket_helpers, keep_bodies, module_set, rank_place,
                                                        runner_lookups, scoped_pool, server_args, single_gpu_helpers,
                                                        verify_modules)
from vmfuzz.harness.targets.sglang.graph_model import HIDDEN, VOCAB
from vmfuzz.harness.targets.sglang.reach import lookup_patches
from vmfuzz.harness.targets.sglang.stand_in import StandIn, consultation_of

INIT = "DecodeCudaGraphRunner.__init__"
_MODEL_RUNNER = "srt/model_executor/model_runner.py"
_CONTEXT = "srt/runtime_context.py"

_modules = module_set(dict(
    model_runner="sglang.srt.model_executor.model_runner",
    misc_utils="sglang.srt.model_executor.model_runner_components.misc_utils",
    input_buffers="sglang.srt.model_executor.input_buffers",
    backend_utils="sglang.srt.model_executor.runner_backend.utils",
    graph_config="sglang.srt.model_executor.cuda_graph_config",
    capture_mode="sglang.srt.model_executor.runner_utils.capture_mode",
    tbo="sglang.srt.batch_overlap.two_batch_overlap",
    spec_utils="sglang.srt.speculative.spec_utils"))

#: the ModelRunner methods the runner's __init__ calls, bound to the stand-in as SGLang's own
_RUNNER_METHODS = ("decode_num_tokens_per_req", "get_pp_proxy_topk_size", "get_pp_proxy_residual_num_blocks",
                   "get_pp_proxy_dspark_hidden_size", "get_aux_hidden_states_width")


class NotDriven(Exception):
    """The runner's ``__init__`` could not be driven over the stand-ins (the reason is the message)."""


@dataclass(frozen=True)
class Sizing:
    """What the runner's ``__init__`` decided, read before any capture: the buckets it captures, the
    largest, the tokens per request it captures, its token capacity, and each static buffer's shape."""

    capture_bs: tuple[int, ...]
    max_bs: int
    captured_req_width: int
    max_num_token: int
    buffers: dict = field(default_factory=dict)

    @classmethod
    def of(cls, runner) -> "Sizing":
        shapes = {}
        for name, value in vars(runner.buffers).items():
            if isinstance(value, torch.Tensor):
                shapes[name] = tuple(value.shape)
            elif isinstance(value, dict):
                shapes.update({f"{name}.{k}": tuple(v.shape) for k, v in value.items()
                               if isinstance(v, torch.Tensor)})
        return cls(tuple(runner.capture_bs), runner.max_bs, runner.captured_req_width, runner.max_num_token,
                   shapes)


def _hf_config() -> SimpleNamespace:
    # a dense Llama target: no DSA, Kimi, DSpark or MoE branch of the set-up applies
    return SimpleNamespace(architectures=["LlamaForCausalLM"], model_type="llama")


def model_runner(config: Config, model, backend, spec_algorithm, pool_size: int, pp_size: int,
                 hf=None, capture_bs: list[int] | None = None) -> StandIn:
    """The target ``ModelRunner`` the runner's ``__init__`` reads, SGLang's own methods bound to it."""
    m = _modules()
    hf = hf or _hf_config()
    runner = StandIn(
        "target ModelRunner", _MODEL_RUNNER,
        device="cpu", gpu_id=0, is_draft_worker=False, spec_algorithm=spec_algorithm, model=model,
        dtype=torch.float32, attn_backend=backend,
        model_config=StandIn("target ModelConfig", "srt/configs/model_config.py", hidden_size=HIDDEN,
                             vocab_size=VOCAB, dtype=torch.float32, is_encoder_decoder=False, hf_config=hf,
                             hf_text_config=hf, context_len=config.max_context_len, hc_hidden_size=None),
        server_args=server_args(config, capture_bs or [pool_size], pp_size),
        req_to_token_pool=SimpleNamespace(size=pool_size),
        ngram_embedding_manager=SimpleNamespace(enabled=False), layer_info=SimpleNamespace(start_layer=0),
        pp_group=SimpleNamespace(world_size=pp_size, rank_in_group=pp_size - 1),
        pp_size=pp_size, pp_rank=pp_size - 1, tp_group=SimpleNamespace(barrier=lambda: None),  # as 0.5.21 reads them
        ps=rank_place(pp_size),  # as 0.5.17-0.5.20 read them
        # the rows SGLang asks of the process-wide logits output, allocated as asked
        graph_shared_output=SimpleNamespace(
            get_logits_buffer=lambda vocab, rows: torch.zeros(rows, vocab, dtype=torch.float32)),
        kv_index_translator=SimpleNamespace(bind_runner_slots=lambda fb: None),
        hisparse_coordinator=None, capture_head_hooks=[], capture_tail_hooks=[], canary_manager=None,
        lora_manager=None, attn_tp_sequence_sharded=lambda n: False, device_timer=None,
        shared_read_done_event=None)
    for name in _RUNNER_METHODS:
        # a method this release's ModelRunner lacks is one its runner's __init__ does not call (0.5.21 has no
        # get_aux_hidden_states_width); should it call it, the stand-in says what it lacked
        real = getattr(m.model_runner.ModelRunner, name, None)
        if real is not None:
            setattr(runner, name, functools.partial(real, runner))
    return runner


def init_lookups(config: Config, capture_bs: list[int], space: GraphSpace, pool: dict, pp_size: int) -> list:
    """The server-wide lookups the runner's ``__init__`` makes beyond its capture's (``runner_lookups``)."""
    m, mi = verify_modules(), _modules()
    graph = StandIn("get_exec().graph", _CONTEXT, enable_cudagraph_gc=True, debug_cuda_graph=False,
                    disable_cuda_graph_padding=False, enable_profile_cuda_graph=False, torch_compile_max_bs=0,
                    cuda_graph_config=SimpleNamespace(decode=SimpleNamespace(
                        bs=list(capture_bs), backend=mi.graph_config.Backend.FULL)))
    exec_ = StandIn("get_exec()", _CONTEXT, graph=graph,
                    overlap=SimpleNamespace(enable_two_batch_overlap=False),
                    features=SimpleNamespace(enable_memory_saver=False, enable_encoder_swa_bounded_replay=False),
                    mamba=SimpleNamespace(enable_mamba_extra_buffer=False),
                    deterministic=SimpleNamespace(enable_deterministic_inference=False))
    parallel = StandIn("get_parallel()", _CONTEXT, tp_rank=0, tp_size=1, num_dp_ranks=1, dp_size=1, pp_size=pp_size,
                       pp_rank=pp_size - 1, attn_tp_size=1, attn_cp_size=1, attn_dp_enabled=False, moe_ep_size=1,
                       attn_tp_rank=0, enable_dp_attention=False,  # the names 0.5.21 reads them by
                       tp_group=SimpleNamespace(barrier=lambda: None))
    answers = {"get_exec": lambda: exec_, "get_parallel": lambda: parallel,
               "get_disagg": lambda: SimpleNamespace(enable_pdmux=False), **single_gpu_helpers(),
               "get_server_return_hidden_states_mode":  # up to 0.5.20 it is passed the server_args
                   lambda *_: m.forward_info.CaptureHiddenMode.NULL,
               "get_device": lambda: SimpleNamespace(device="cpu"), "is_tbo_enabled": lambda: False}
    device = space.device_module()
    out = runner_lookups(config, capture_bs, space, pp_size)
    # the runner's own methods bound to the stand-in model runner, and the helpers they call
    out += lookup_patches([mi.model_runner, mi.spec_utils, mi.misc_utils], {
        **graph_answers(config, capture_bs, pp_size), "get_parallel": lambda: parallel})
    out += lookup_patches([m.runner, m.base_runner, m.base_graph, mi.misc_utils, mi.backend_utils, mi.tbo,
                           *bucket_helpers()], answers)
    return out + [(torch, "get_device_module", lambda *a, **k: device),
                  (mi.input_buffers, "share_input_buffer", scoped_pool(space, pool)),
                  (m.runner, "resolve_decode_backend", _keeping_bodies(space, m.runner.resolve_decode_backend))]


def _keeping_bodies(space: GraphSpace, real):
    """``resolve_decode_backend``, its graph backend capturing through the graph stand-in."""
    def resolve_decode_backend(runner):
        backend = real(runner)
        keep_bodies(backend, space)
        return backend
    return resolve_decode_backend


def graph_state(backend, space: GraphSpace, max_context_len: int) -> None:
    """The backend's ``init_cuda_graph_state`` as SGLang sizes it, its KV-id buffer and verify mask then
    re-homed as redzoned static buffers of ``space`` (same sizes; the KV ids stale, as a device's are)."""
    from vmfuzz.harness.targets.sglang.imitated_host import VERIFY_MASK
    from vmfuzz.harness.model.readers import stale_kv_indices
    from vmfuzz.harness.targets.sglang.structs import replaced
    real = type(backend).init_cuda_graph_state

    def init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs):
        gathers = backend.kv_index_translator
        out = real(backend, max_bs, max_num_tokens, *args, **kwargs)
        ids = space.static("kv_indices", backend.cuda_graph_kv_indices, redzone_cells=max_context_len + 64)
        ids.copy_(stale_kv_indices(ids.numel(), ids.device))
        backend.cuda_graph_kv_indices = ids
        vm = backend._verify_mask
        if vm is not None:
            buffer = space.static("tree_mask", vm.buffer, redzone_cells=max(64, vm.buffer.numel() // 4))
            backend._verify_mask = replaced(vm, "VerifyMask", VERIFY_MASK, buffer=buffer)
        backend.kv_index_translator = gathers
        return out
    backend.init_cuda_graph_state = init_cuda_graph_state


def _fits(runner_cls) -> str | None:
    """Why this release's ``__init__`` is not one vmfuzz can call as a ``ModelRunner`` does (None: it is)."""
    try:
        params = inspect.signature(runner_cls.__init__).parameters
    except (TypeError, ValueError):
        return "its signature cannot be read"
    if "model_runner" not in params or "attn_backend" not in params:
        return "it takes no (model_runner, attn_backend=...) as SGLang 0.5.23's does"
    return None


def made_by_init(config: Config, capture_bs: list[int], space: GraphSpace, model, backend, pp_size: int = 1,
                 dspark: bool | str = False):
    """(the runner, made by its own ``__init__`` with its capture held back; the lookups it was made
    under, ``init_lookups``). ``dspark``: a DSpark server's target (``dspark_verify``: its
    algorithm, its DeepSeek V4.1 config (V4's, where asked as ``dspark_verify.NO_CANDIDATES_ASKED``), the
    device its early path asks for, answered). Raises
    ``NotDriven`` where this release's ``__init__`` cannot be driven over the stand-ins; what the
    failed attempt noted of them is then cleared from the check's ledger (the reason says it), so it
    cannot make a later finding on the hand-assembled runner out of step."""
    m = verify_modules()
    R = m.runner.DecodeCudaGraphRunner
    why = _fits(R)
    try:
        _modules()
    except ImportError as exc:  # a module vmfuzz binds the set-up through, moved or gone in this release
        why = why or f"a module its set-up is driven through does not import ({exc})"
    if why is not None:
        raise NotDriven(f"{INIT}: {why}")
    ledger = consultation.current()
    n0 = len(ledger.entries) if ledger is not None else 0
    from vmfuzz.harness.targets.sglang import dspark_verify
    eagle = m.spec_info.SpeculativeAlgorithm.EAGLE
    mr = model_runner(config, model, backend, dspark_verify.DSparkAlgorithm(eagle) if dspark else eagle,
                      max(capture_bs), pp_size, dspark_verify.hf_config(config.max_context_len, dspark) if dspark else None,
                      capture_bs)
    lookups = init_lookups(config, capture_bs, space, {}, pp_size)
    held: list = []
    graph_state(backend, space, config.max_context_len)
    try:
        with bound(*lookups, *(dspark_verify.init_lookups(m.runner) if dspark else ()),
                   (R, "capture", lambda self: held.append(self))):
            runner = R(mr, attn_backend=backend)
    except Exception as exc:  # noqa: BLE001 - what the stand-ins lack is vmfuzz's gap, said
        noted = (ledger.entries[n0:] if ledger is not None else
                 [consultation_of(mr), consultation_of(mr.model_config)])
        lacking = sorted(f"{e.seam}.{name}" for e in noted for name in e.lacking)
        # a lookup vmfuzz did not answer ("not published") or its own wiring raising is vmfuzz's gap too
        if lacking or _raised_in_harness(exc) or "not published" in str(exc):
            for e in noted:
                e.lacking.clear()
            raise NotDriven(f"{INIT} asks for {', '.join(lacking) or 'what vmfuzz does not answer'} "
                            f"({type(exc).__name__}: {str(exc)[:160]})") from exc
        raise
    if held != [runner]:
        raise NotDriven(f"{INIT} did not end with its capture as vmfuzz holds it back")
    return runner, lookups


def _raised_in_harness(exc: BaseException) -> bool:
    from vmfuzz.harness.targets.sglang.stand_in import is_harness_file
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and is_harness_file(tb.tb_frame.f_code.co_filename)


def capture(runner, lookups: list) -> None:
    """The capture the runner's ``__init__`` ends with, run where it was held back (in SGLang's capture
    mode, as ``__init__`` runs it)."""
    mode = getattr(_modules().capture_mode, "model_capture_mode", None) or contextlib.nullcontext
    with bound(*lookups):
        with mode():
            runner.capture()
