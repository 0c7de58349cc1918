"""SGLang's allocation sites: each backend's cuda-graph set-up, driven to its verify-mask call.

The triton backend is built by its own ``__init__`` over a stand-in model
runner (meta device) with the server-wide config it reads bound for the call;
the others are made with ``cls.__new__`` and given the attributes their
``init_cuda_graph_state`` reads, set to what their ``__init__`` derives from a
server started with the given numbers (context length, draft width, topk) on
the meta device, so the set-up allocates nothing real. Then its own
``init_cuda_graph_state(max_bs, ...)`` runs. ``maybe_create_verify_mask`` is
bound in the backend's module for that call: it records the arguments, runs
SGLang's real allocator (meta device) and stops the set-up there, so the
CUDA-only work after the mask is never reached.

Not driven: ``__init__`` of the backends other than triton (they need much
more of a model runner, KV pool and runtime context), and the backends whose
modules do not import without CUDA extensions (``load_sites`` says which and
why).
"""

from __future__ import annotations

import importlib
import inspect
from types import SimpleNamespace

import torch

from harness.model.allocation import ALLOCATING_BACKENDS, AllocationCall, ServerNumbers
from harness.model.errors import OutOfStep
from harness.targets.sglang.binding import bound
from harness.targets.sglang.seams import (ALLOCATOR_SYNONYMS, TranslatesNothing, quantities_of_call, unset_by_harness,
                                          where, with_quantity)

_ATTN = "srt/layers/attention/"

#: harness name -> (module under sglang.srt.layers.attention, class)
SITES: dict[str, tuple[str, str]] = {
    "triton": ("triton_backend", "TritonAttnBackend"),
    "flashattention": ("flashattention_backend", "FlashAttentionBackend"),
    "flashmla": ("flashmla_backend", "FlashMLABackend"),
    "trtllm_mla": ("trtllm_mla_backend", "TRTLLMMLABackend"),
    "deepseek_v4": ("deepseek_v4_backend", "DeepseekV4AttnBackend"),
    "qwen_sparse": ("qwen_sparse_attn_backend", "QwenSparseAttnBackend"),
    "deepseek_v4_hip_radix": ("deepseek_v4_backend_hip_radix", "DeepseekV4HipRadixBackend"),
}

#: Sites with a driver here. flashattention imports CUDA-only extensions
#: (sgl_kernel) at load: it is imported with them stubbed (``STUBBED_IMPORT``),
#: and its set-up never reaches them before the verify-mask call. flashmla's
#: set-up allocates on "cuda" before its call (``NOT_DRIVEN`` says so).
DRIVERS = ("triton", "flashattention", "trtllm_mla", "deepseek_v4", "qwen_sparse", "deepseek_v4_hip_radix")

#: (sglang-relative path, what is driven, properties that drive it); only the
#: sites a CPU host can import -- ``not_driven`` says why the others are not.
SURFACE: tuple[tuple[str, str, tuple[str, ...]], ...] = tuple(
    (_ATTN + module + ".py", f"{cls}.init_cuda_graph_state", ("allocation-soundness",))
    for name, (module, cls) in SITES.items() if name in DRIVERS
) + (
    # where triton derives max_context_len and the draft width it allocates with
    (_ATTN + "triton_backend.py", "TritonAttnBackend.__init__", ("allocation-soundness",)),
    # the allocator itself, called with each site's own arguments
    (_ATTN + "verify_mask.py", "maybe_create_verify_mask", ("allocation-soundness",)),
)


class _Allocated(Exception):
    """Ends a backend's set-up right after its verify-mask call."""


def _attributes(name: str, n: ServerNumbers) -> dict:
    """What each backend's ``__init__`` would have set, for a target runner of a server with ``n``."""
    common = dict(device="meta", is_draft_runner=False, skip_prefill=False, max_context_len=n.context_len,
                  kv_index_translator=TranslatesNothing())
    if name == "triton":
        return dict(common, num_draft_tokens=n.num_draft_tokens, num_head=1, max_kv_splits=1, v_head_dim=1,
                    swa_v_head_dim=None, lean_total_programs=1, lean_block_m=1, sliding_window_size=None)
    if name == "flashattention":
        # a target runner of a dense MHA model, page size 1, no local or sliding-window attention
        return dict(common, page_size=1, topk=n.topk, speculative_num_draft_tokens=n.num_draft_tokens,
                    speculative_step_id=0, _get_scheduler_metadata=None, use_mla=False, local_attn_builder=None,
                    has_local_attention=False, use_sliding_window_kv_pool=False)
    if name == "trtllm_mla":
        # _unified_mla: releases before 0.5.19 ask whether the KV pool is the unified MLA one; it is not
        return dict(common, num_draft_tokens=n.num_draft_tokens, page_size=64, data_type=torch.bfloat16,
                    num_q_heads=1, kv_cache_dim=1, _unified_mla=False)
    if name == "deepseek_v4":
        return dict(common, speculative_num_draft_tokens=n.num_draft_tokens)
    if name == "qwen_sparse":
        return dict(common, runner=SimpleNamespace(is_draft_worker=False))
    if name == "deepseek_v4_hip_radix":
        return dict(common, is_draft_worker=False, speculative_num_draft_tokens=n.num_draft_tokens)
    raise ValueError(f"unknown allocating backend {name!r} (known: {', '.join(ALLOCATING_BACKENDS)})")


def _server_context(n: ServerNumbers):
    """The server-wide config a backend's ``__init__`` reads, for a server with ``n``."""
    spec = SimpleNamespace(speculative_num_draft_tokens=n.num_draft_tokens, speculative_num_steps=n.spec_steps,
                           speculative_eagle_topk=n.topk, speculative_algorithm="EAGLE")
    exec_ = SimpleNamespace(
        kernel=SimpleNamespace(enable_lean_attention=None, triton_attention_num_kv_splits=8,
                               triton_attention_split_tile_size=None),
        dllm=SimpleNamespace(dllm_algorithm=None),
        deterministic=SimpleNamespace(enable_deterministic_inference=False))
    parallel = SimpleNamespace(attn_dcp_size=1, attn_dcp_rank=0, attn_tp_size=1)
    schedule = SimpleNamespace(chunked_prefill_size=8192)
    return spec, exec_, parallel, schedule


def _model_runner(n: ServerNumbers, exec_, schedule, device="meta"):
    """A target model runner of a small dense model, on ``device`` (meta: nothing is allocated).

    Its ``server_args`` holds the same options as the stand-in server's
    ``get_exec``/``get_schedule``, for releases that read them from there.
    """
    server_args = SimpleNamespace(
        triton_attention_num_kv_splits=exec_.kernel.triton_attention_num_kv_splits,
        triton_attention_split_tile_size=exec_.kernel.triton_attention_split_tile_size,
        enable_lean_attention=exec_.kernel.enable_lean_attention,
        enable_deterministic_inference=exec_.deterministic.enable_deterministic_inference,
        chunked_prefill_size=schedule.chunked_prefill_size, page_size=1)
    model_config = SimpleNamespace(
        context_len=n.context_len, attention_arch=None, get_max_num_attention_heads=lambda: 8,
        get_num_kv_heads=lambda *a: 8, v_head_dim=64, swa_v_head_dim=64, head_dim=64, is_encoder_decoder=False)
    pool = SimpleNamespace(size=n.max_bs, req_to_token=torch.zeros(n.max_bs, 1, dtype=torch.int32, device=device))
    kv_pool = SimpleNamespace(start_layer=0, get_value_buffer=lambda layer: torch.empty(1, 8, 64, device="meta"))
    return SimpleNamespace(
        req_to_token_pool=pool, sliding_window_size=None, token_to_kv_pool=kv_pool,
        token_to_kv_pool_allocator=None, page_size=1, kv_index_translator=TranslatesNothing(),
        decode_num_tokens_per_req=lambda: n.num_draft_tokens, is_draft_worker=False, spec_algorithm=None,
        model_config=model_config, device=device, gpu_id=0, kv_cache_dtype=torch.bfloat16,
        server_args=server_args)


def _constructed(name: str, mod, cls, n: ServerNumbers):
    """The backend built by its own ``__init__`` where stand-ins carry it (triton), else None.

    Then the attributes the allocation reads (context length, draft width,
    draft-runner flag, device) are the ones ``__init__`` derived, so a wrong
    derivation there is caught too.
    """
    return built_by_init(mod, cls, n) if name == "triton" else None


def built_by_init(mod, cls, n: ServerNumbers, device="meta"):
    """``cls`` (the Triton backend) made by its own ``__init__`` over a stand-in target model runner of a
    server started with ``n``, its request pool ``n.max_bs`` deep; the server-wide config bound for the call.

    What the stand-in runner lacks that this SGLang's ``__init__`` reads is out of step.
    """
    spec, exec_, parallel, schedule = _server_context(n)
    try:
        with bound((mod, "get_spec", lambda: spec), *_server_lookups(mod, exec_, parallel, schedule)):
            return cls(_model_runner(n, exec_, schedule, device))
    except AttributeError as exc:
        if getattr(exc, "obj", 0) is None or isinstance(getattr(exc, "obj", None), SimpleNamespace):
            raise OutOfStep(f"{cls.__name__}.__init__", where(cls),
                            f"reads {exc.name!r} from a stand-in vmfuzz built: {exc}") from None
        raise


#: Model-family probes the constructor asks of the model config; the stand-in
#: model is a plain dense one, so each answers "not this family". Releases
#: name them differently (one ``mambaish_config`` from 0.5.18 on, three
#: family probes before), so each is bound where the module has it.
_FAMILY_PROBES = ("mambaish_config", "hybrid_gdn_config", "kimi_linear_config", "linear_attn_model_spec")


def _server_lookups(mod, exec_, parallel, schedule) -> list[tuple]:
    """The server-wide lookups this release's module goes through, each bound to the stand-in server.

    Only ``get_spec`` is required: older releases read the kernel and
    scheduling options from ``model_runner.server_args`` instead of
    ``get_exec``/``get_schedule`` (the stand-in runner carries both forms).
    """
    lookups = {"get_exec": lambda: exec_, "get_parallel": lambda: parallel, "get_schedule": lambda: schedule}
    lookups.update({probe: (lambda config: None) for probe in _FAMILY_PROBES})
    return [(mod, name, value) for name, value in lookups.items() if hasattr(mod, name)]


#: Sites whose module imports CUDA-only extensions at load: imported with those
#: stubbed (``_with_extensions_stubbed``) so their set-up can be driven on meta.
STUBBED_IMPORT = ("flashattention",)


class _Absent:
    """Stands for a name a CUDA extension would provide; calling it is a driver bug."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is a stub of a CUDA extension (not importable here); "
                           "the allocation driver must not reach it")

    def __getattr__(self, attr: str):
        return _Absent(f"{self._name}.{attr}")


def _stub_module(name: str):
    import types
    mod = types.ModuleType(name)
    mod.__path__ = []  # a package, so ``from name.sub import x`` finds a stubbed ``sub`` too
    mod.__getattr__ = lambda attr: _Absent(f"{name}.{attr}")
    return mod


def _with_extensions_stubbed(module: str, tries: int = 8):
    """Import ``module`` with each missing extension module stubbed, then forget the
    stubs and every module the import added that holds one (directly or through
    another such module), so no later import finds a stub. The modules it added
    that hold none stay imported: importing them again would run their
    registrations (custom ops) twice. Returns the module object."""
    import sys
    before = set(sys.modules)
    stubbed: list[str] = []
    try:
        for _ in range(tries):
            try:
                return importlib.import_module(module)
            except ModuleNotFoundError as exc:
                missing = exc.name
                if not missing or missing.startswith("sglang") or missing in stubbed:
                    raise
                stubbed.append(missing)
                sys.modules[missing] = _stub_module(missing)
        raise ImportError(f"{module} still misses modules after stubbing {', '.join(stubbed)}")
    finally:
        _forget_stubbed(before, stubbed)


def _forget_stubbed(before: set, stubbed: list[str]) -> None:
    import sys
    added = {name: sys.modules[name] for name in set(sys.modules) - before}
    tainted = {name for name in stubbed if name in added}
    changed = True
    while changed:  # a module holding a stub's name, or a tainted module, is tainted
        changed = False
        dropped = {id(added[n]) for n in tainted}
        for name, mod in added.items():
            if name in tainted:
                continue
            if any(isinstance(v, _Absent) or id(v) in dropped for v in list(vars(mod).values())):
                tainted.add(name)
                changed = True
    for name in tainted:
        mod = sys.modules.pop(name, None)
        parent, _, leaf = name.rpartition(".")
        if parent in sys.modules and getattr(sys.modules[parent], leaf, None) is mod:
            delattr(sys.modules[parent], leaf)


def load_sites() -> dict[str, object]:
    """harness name -> the imported module, or a string saying why it does not import here."""
    sites: dict[str, object] = {}
    for name, (module, cls) in SITES.items():
        try:
            path = "sglang.srt.layers.attention." + module
            mod = _with_extensions_stubbed(path) if name in STUBBED_IMPORT else importlib.import_module(path)
        except Exception as exc:  # any failure in its import chain means "not drivable here"
            sites[name] = f"{module}.py does not import here ({type(exc).__name__}: {exc})"
            continue
        if not hasattr(mod, cls) or not hasattr(mod, "maybe_create_verify_mask"):
            sites[name] = f"{module}.py has no {cls} calling maybe_create_verify_mask"
            continue
        sites[name] = mod if name in DRIVERS else (f"{module}.py imports, but no driver for its set-up "
                                                    "was proven on a CPU host")
    return sites


def allocation_call(target, name: str, numbers: ServerNumbers) -> AllocationCall:
    """Run backend ``name``'s cuda-graph set-up for ``numbers`` and record its verify-mask call."""
    sites = target._allocation_sites()
    mod = sites.get(name)
    if mod is None or isinstance(mod, str):
        raise ValueError(f"allocation site {name!r} is not driven here: {mod or 'unknown backend'}")
    cls = getattr(mod, SITES[name][1])
    backend = _constructed(name, mod, cls, numbers)
    if backend is None:
        backend = cls.__new__(cls)
        for attr, value in _attributes(name, numbers).items():
            object.__setattr__(backend, attr, value)
    real = mod.maybe_create_verify_mask
    calls: list[AllocationCall] = []

    def recording(*args, **kwargs):
        try:
            inspect.signature(real).bind(*args, **kwargs)
        except TypeError:
            real(*args, **kwargs)  # SGLang's caller does not match its allocator: its own TypeError
        # Read by the allocator's own parameter names, so a renamed keyword is still the quantity it was.
        q, call = quantities_of_call(real, "maybe_create_verify_mask", _ATTN + "verify_mask.py", args, kwargs,
                                     ALLOCATOR_SYNONYMS)
        # The allocator only sizes; the meta device keeps a production-size mask free.
        with_quantity(call, "device", "meta", ALLOCATOR_SYNONYMS)
        mask = real(*call.args, **call.kwargs)
        calls.append(AllocationCall(
            name, q.get("max_bs"), q.get("max_context_len"), q.get("d"), bool(q.get("is_read")),
            bool(q.get("is_draft_runner")), bool(q.get("skip_prefill")), q.get("dtype", torch.bool), mask))
        raise _Allocated

    patches = [(mod, "maybe_create_verify_mask", recording)]
    if name == "qwen_sparse":
        # it reads the draft width from the server's published spec config at set-up
        spec = SimpleNamespace(speculative_num_draft_tokens=numbers.num_draft_tokens)
        patches.append((mod, "get_spec", lambda: spec))
    with bound(*patches):
        try:
            backend.init_cuda_graph_state(numbers.max_bs, numbers.max_bs * numbers.num_draft_tokens)
        except _Allocated:
            pass
        except AttributeError as exc:
            unset_by_harness(exc, backend, cls, f"{cls.__name__} stand-in", _ATTN + SITES[name][0] + ".py")
            raise
    if not calls:
        raise OutOfStep(f"{SITES[name][1]}.init_cuda_graph_state", _ATTN + SITES[name][0] + ".py",
                        "it returned without calling maybe_create_verify_mask, the call vmfuzz records")
    return calls[0]


#: (sglang-relative path, what, why not driven): the other allocation sites.
NOT_DRIVEN: tuple[tuple[str, str, str], ...] = (
    (_ATTN + "flashattention_backend.py", "FlashAttentionBackend.__init__",
     "only init_cuda_graph_state is driven (imported with sgl_kernel stubbed); its attributes are set "
     "as __init__ would"),
    (_ATTN + "flashmla_backend.py", "FlashMLABackend.init_cuda_graph_state",
     "before its verify-mask call the set-up allocates on device='cuda' (hard-coded) and reads "
     "torch.cuda.get_device_properties, so no CPU host reaches the call even with flash_mla stubbed"),
    (_ATTN + "trtllm_mla_backend.py", "TRTLLMMLABackend.__init__",
     "only init_cuda_graph_state is driven; its attributes are set as __init__ would"),
    (_ATTN + "deepseek_v4_backend.py", "DeepseekV4AttnBackend.__init__",
     "only init_cuda_graph_state is driven; its attributes are set as __init__ would"),
    (_ATTN + "qwen_sparse_attn_backend.py", "QwenSparseAttnBackend.__init__",
     "only init_cuda_graph_state is driven; its attributes are set as __init__ would"),
)
