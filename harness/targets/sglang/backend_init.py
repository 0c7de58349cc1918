"""The allocating backends, each built by its own ``__init__`` for a server's numbers.

A stand-in target model runner carries the server's arguments where SGLang's
``ModelRunner`` carries them: ``server_args`` (cuda_graph_max_bs, the
speculative options), ``model_config.context_len``, the request pool, the KV
cache dtype, and the runtime-context lookups (``get_spec``, ``get_exec``, ...)
answer from the same arguments. So whatever a backend derives from them --
its ``max_context_len``, its draft width, the draft-runner flag -- is derived
by SGLang's own code, and a wrong derivation there reaches the allocation
check. Everything is on the meta device: nothing is allocated.

What ``__init__`` does that only a CUDA host can (JIT builds, FlashInfer
wrappers, device queries, pinned host buffers) is bound, for the call, to an
inert stand-in listed in ``CUDA_ONLY`` with why it cannot change the mask's
size. A name the stand-in lacks that this SGLang's ``__init__`` reads is out of
step (exit 3), never a finding.

A backend module that imports CUDA-only extension modules at load is imported
with them stubbed (``import_with_extensions_stubbed``), and its ``__init__``'s
own imports of them are stubs again for the call (``extensions_stubbed_again``):
the allocation sites and the FA3 reader build their backends this one way.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from types import SimpleNamespace

import torch

from vmfuzz.harness.model.allocation import ServerNumbers
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.reach import lookup_patches
from vmfuzz.harness.targets.sglang.seams import TranslatesNothing, call_with, where
from vmfuzz.harness.targets.sglang.stand_in import StandIn, recorded

#: Model-family probes the constructor asks of the model config; the stand-in
#: model is a plain dense one, so each answers "not this family". Releases
#: name them differently (one ``mambaish_config`` from 0.5.18 on, three
#: family probes before), so each is bound where the module has it.
_FAMILY_PROBES = ("mambaish_config", "hybrid_gdn_config", "kimi_linear_config", "linear_attn_model_spec")

#: the files that define what the stand-ins below stand in for
_CONTEXT, _RUNNER = "srt/runtime_context.py", "srt/model_executor/model_runner.py"

#: The runtime-context lookups a backend module may go through.
_LOOKUPS = ("get_spec", "get_exec", "get_parallel", "get_schedule", "get_model", "get_memory", "get_disagg",
            "get_platform", "get_buffer")


#: A single-GPU server's parallelism options, under ServerArgs' names: read off ``server_args`` by some
#: releases (0.5.17's FA3 ``__init__``: whether to precompute the scheduler metadata) and answered by
#: ``get_parallel`` in others, the same values either way.
SINGLE_GPU = {"enable_prefill_cp": False, "enable_dp_attention": False}


def server_args(n: ServerNumbers, page_size: int = 1) -> StandIn:
    """The arguments a server started with ``n`` (and KV pages of ``page_size`` tokens) has, under
    ServerArgs' own names."""
    return StandIn(
        "ServerArgs", "srt/server_args.py",
        cuda_graph_max_bs=n.max_bs, max_running_requests=n.max_bs, context_length=n.context_len,
        speculative_algorithm="EAGLE", speculative_num_draft_tokens=n.num_draft_tokens,
        speculative_eagle_topk=n.topk, speculative_num_steps=n.spec_steps, page_size=page_size,
        triton_attention_num_kv_splits=8, triton_attention_split_tile_size=None, enable_lean_attention=None,
        enable_deterministic_inference=False, chunked_prefill_size=8192, disable_chunked_prefix_cache=False,
        flashinfer_mla_disable_ragged=False, disable_radix_cache=False, is_embedding=False,
        disaggregation_mode="null", enable_two_batch_overlap=False, **SINGLE_GPU)


def _context(args: StandIn) -> dict[str, object]:
    """Each runtime-context lookup's answer, read from ``args`` as SGLang's config bags read server_args:
    a single-GPU server, no data/context/decode parallelism."""
    spec = StandIn("get_spec()", _CONTEXT, **{k: getattr(args, k) for k in (
        "speculative_algorithm", "speculative_num_draft_tokens", "speculative_eagle_topk", "speculative_num_steps")})
    exec_ = StandIn(
        "get_exec()", _CONTEXT,
        kernel=StandIn("get_exec().kernel", _CONTEXT, enable_lean_attention=args.enable_lean_attention,
                               triton_attention_num_kv_splits=args.triton_attention_num_kv_splits,
                               triton_attention_split_tile_size=args.triton_attention_split_tile_size,
                               flashinfer_mla_disable_ragged=args.flashinfer_mla_disable_ragged,
                               # DeepSeek V4's kernel choices, at ServerArgs' defaults
                               enable_deepseek_v4_fp4_indexer=False, dsa_topk_backend="sgl-kernel",
                               dsv4_prefill_backend="auto"),
        features=StandIn("get_exec().features", _CONTEXT, enable_decoder_swa_bounded_replay=None),
        dllm=StandIn("get_exec().dllm", _CONTEXT, dllm_algorithm=None),
        overlap=StandIn("get_exec().overlap", _CONTEXT, enable_two_batch_overlap=args.enable_two_batch_overlap),
        deterministic=StandIn("get_exec().deterministic", _CONTEXT,
                              enable_deterministic_inference=args.enable_deterministic_inference))
    parallel = StandIn("get_parallel()", _CONTEXT,
                       attn_dcp_size=1, attn_dcp_rank=0, attn_tp_size=1, attn_cp_size=1, dcp_enabled=False,
                               dcp_size=1, dcp_rank=0, attn_dp_enabled=False,
                               **{k: getattr(args, k) for k in SINGLE_GPU})
    schedule = StandIn("get_schedule()", _CONTEXT,
                       chunked_prefill_size=args.chunked_prefill_size, page_size=args.page_size,
                               disable_chunked_prefix_cache=args.disable_chunked_prefix_cache)
    answers = {"get_spec": spec, "get_exec": exec_, "get_parallel": parallel, "get_schedule": schedule,
               "get_model": StandIn("get_model()", _CONTEXT, is_embedding=args.is_embedding),
               "get_memory": StandIn("get_memory()", _CONTEXT, disable_radix_cache=args.disable_radix_cache),
               "get_disagg": StandIn("get_disagg()", _CONTEXT, disaggregation_mode=args.disaggregation_mode),
               "get_platform": StandIn("get_platform()", _CONTEXT, is_sm100=False)}
    lookups: dict[str, object] = {name: recorded(lambda v=v: v, name, _CONTEXT) for name, v in answers.items()}
    # a named process-wide buffer: made fresh (on meta) for each backend built here
    lookups["get_buffer"] = recorded(lambda name, make: make(), "get_buffer", _CONTEXT)
    return lookups


def model_runner(n: ServerNumbers, device="meta", page_size: int = 1,
                 sliding_window_size: int | None = None, kv_pool=None, model: dict | None = None,
                 runner: dict | None = None) -> StandIn:
    """A target model runner of a server started with ``n``, its KV in pages of ``page_size`` tokens, on
    ``device`` (meta: nothing is allocated); ``sliding_window_size``: a model whose every layer reads a
    window of that many tokens over one ordinary KV pool, unless ``kv_pool`` is the server's (a hybrid one).

    The model is a small dense one that also answers the MLA shape questions
    (kv_lora_rank, ...) the MLA backends ask; its request pool is ``max_bs``
    deep, the least a server capturing ``max_bs`` has. ``model`` and ``runner``: fields of the model
    config and of the runner that a model family's server has otherwise (``dsv4_backend.model_runner``).
    """
    args = server_args(n, page_size)
    model_config = StandIn("ModelConfig", _RUNNER, **{
        **dict(context_len=args.context_length, attention_arch=None, get_max_num_attention_heads=lambda: 8,
               get_num_kv_heads=lambda *a: 8, num_attention_heads=8, v_head_dim=64, swa_v_head_dim=64, head_dim=64,
               is_encoder_decoder=False, is_local_attention_model=False, kv_lora_rank=512, qk_nope_head_dim=128,
               qk_rope_head_dim=64, scaling=1.0, hf_config=None,
               hf_text_config=StandIn("hf_text_config", _RUNNER, num_attention_heads=8)),
        **(model or {})})
    pool = StandIn("req_to_token_pool", _RUNNER, size=args.max_running_requests,
                           req_to_token=torch.zeros(args.max_running_requests, 1, dtype=torch.int32, device=device))
    kv_pool = kv_pool if kv_pool is not None else StandIn(
        "token_to_kv_pool", _RUNNER, start_layer=0, get_value_buffer=lambda layer: torch.empty(1, 8, 64, device="meta"))
    return StandIn("ModelRunner", _RUNNER, **{**dict(
        server_args=args, model_config=model_config, req_to_token_pool=pool, token_to_kv_pool=kv_pool,
        token_to_kv_pool_allocator=None, sliding_window_size=sliding_window_size, page_size=args.page_size,
        attention_chunk_size=None,  # no chunked local attention (model_config.is_local_attention_model)
        kv_index_translator=TranslatesNothing(), is_draft_worker=False, spec_algorithm=None,
        # a single-GPU server's parallel sizes where older releases read them off the runner
        # (0.5.21: attn_cp_size; 0.5.17-0.5.20: a ``ps`` bag), as get_parallel answers today
        attn_cp_size=1, ps=StandIn("ModelRunner.ps", _RUNNER, attn_cp_size=1, tp_size=1, attn_tp_size=1, dp_size=1,
                                      attn_dp_size=1, tp_rank=0, dp_rank=0, pp_size=1, pp_rank=0, moe_ep_size=1),
        decode_num_tokens_per_req=lambda: args.speculative_num_draft_tokens, device=device, gpu_id=0,
        dtype=torch.bfloat16, kv_cache_dtype=torch.bfloat16, kv_cache_dtype_str="auto",
        max_running_requests=args.max_running_requests), **(runner or {})})


class HostTorch:
    """``torch`` as a module's set-up sees it on a CUDA host, allocating on meta instead.

    Device-pinned or ``device="cuda"`` buffers go to the meta device (their size
    is what the set-up computed), and the device query answers one SM.
    """

    _MAKERS = ("zeros", "empty", "full", "ones", "arange")
    cuda = SimpleNamespace(get_device_properties=lambda *a: SimpleNamespace(multi_processor_count=1),
                           is_available=lambda: False)

    def __getattr__(self, name):
        real = getattr(torch, name)
        if name not in self._MAKERS:
            return real

        def on_meta(*args, **kwargs):
            kwargs.pop("pin_memory", None)
            if str(kwargs.get("device", "meta")).startswith(("cuda", "cpu")):
                kwargs["device"] = "meta"
            return real(*args, **kwargs)
        return on_meta


def _meta_counter(device, num_q_heads, max_batch_size):
    return torch.zeros(1, dtype=torch.uint8, device="meta")


#: backend -> (module under sglang.srt.layers.attention, name, stand-in, why it cannot change the mask's size):
#: what its ``__init__`` does that needs a CUDA host. A name this release lacks is out of step (``bound``).
CUDA_ONLY: dict[str, tuple[tuple[str, str, object, str], ...]] = {
    "flashinfer_mla": (
        ("flashinfer_mla_backend", "BatchMLAPagedAttentionWrapper", lambda *a, **k: None,
         "FlashInfer's MLA wrappers (not installed): kernels' plans, not the mask"),
        ("flashinfer_mla_backend", "BatchPrefillWithRaggedKVCacheWrapper", lambda *a, **k: None,
         "FlashInfer's ragged prefill wrapper (not installed): prefill only"),
        ("flashinfer_mla_backend", "torch", HostTorch(), "pinned host buffers of the fast prefill plan"),
        # the MLP-sync alignment of the indptr buffers: 1 on a single-GPU server without two-batch overlap
        ("flashinfer_mla_backend", "get_cuda_graph_max_batch_size", lambda size: size,
         "sizes the FlashInfer indptr buffers, not the verify mask"),
    ),
    "trtllm_mla": (
        ("trtllm_mla_backend", "_jit_fixup_module", lambda *a: None, "a JIT build of a prefill fix-up kernel"),
        ("trtllm_mla_backend", "make_persistent_multi_ctas_kv_counter_buffer", _meta_counter,
         "asks FlashInfer for the GPU's SM count to size a decode counter"),
        ("trtllm_mla_backend", "can_use_set_mla_kv_concat_q", lambda *a: False,
         "asks the GPU's compute capability for a fused KV write"),
        ("trtllm_mla_backend", "can_use_set_mla_kv_concat_q_fp8", lambda *a: False,
         "asks the GPU's compute capability for a fused fp8 KV write"),
    ),
    # its cuda-graph set-up allocates on a hard-coded "cuda" and asks the GPU's SM count before its call
    "flashmla": (("flashmla_backend", "torch", HostTorch(), "device='cuda' scratch and the SM count query"),),
}

#: backend -> the CUDA_ONLY groups its class's ``__init__`` chain goes through
CHAINS: dict[str, tuple[str, ...]] = {"trtllm_mla": ("flashinfer_mla", "trtllm_mla"),
                                      "flashmla": ("flashinfer_mla", "flashmla")}


def cuda_only(name: str, own) -> list[tuple]:
    """The (module, attribute, stand-in, may_add) bindings that stand in for backend ``name``'s CUDA-only
    work; ``own``: the backend's module as loaded (a stubbed import leaves it out of ``sys.modules``)."""
    out = []
    for group in CHAINS.get(name, ()):
        for module, attr, value, _ in CUDA_ONLY[group]:
            path = "sglang.srt.layers.attention." + module
            mod = own if own.__name__ == path else importlib.import_module(path)
            # FlashInfer's names are absent where it is not installed: SGLang's module still refers to them
            may_add = attr.startswith("Batch")
            # a CUDA-only step an older release does not have needs no stand-in: its __init__ cannot reach it
            if may_add or hasattr(mod, attr):
                out.append((mod, attr, value, may_add))
    return out


def _modules_of(mod, cls) -> list:
    """The modules ``cls``'s ``__init__`` chain is defined in, ``mod`` (its own, which a stubbed import
    leaves out of ``sys.modules``) first."""
    seen = [mod]
    for klass in cls.__mro__[1:]:
        mod = sys.modules.get(klass.__module__)
        if mod is not None and mod.__name__.startswith("sglang.") and mod not in seen:
            seen.append(mod)
    return seen


def lookups_bound(mod, cls, n: ServerNumbers, page_size: int = 1) -> list[tuple]:
    """The runtime-context lookups and family probes, bound where ``cls``'s modules (``mod``, its own,
    first) import them."""
    answers = _context(server_args(n, page_size))
    answers.update({probe: (lambda config: None) for probe in _FAMILY_PROBES})
    # wherever the real lookup is held: a module that calls ``runtime_context.get_spec()`` goes through
    # the function's home, not a name it imported
    return lookup_patches(_modules_of(mod, cls), answers)


def built_by_init(mod, cls, n: ServerNumbers, device="meta", name: str | None = None, stubs=(),
                  sliding_window_size: int | None = None, page_size: int = 1, kv_pool=None):
    """``cls`` made by its own ``__init__`` over a stand-in target model runner of a server started with ``n``
    (its model windowed to ``sliding_window_size`` tokens, if given; its KV in pages of ``page_size`` tokens,
    in ``kv_pool`` where given).

    ``name`` (the harness's backend name) selects the CUDA-only stand-ins;
    ``stubs``: a context manager factory that puts back the stubbed extension
    modules ``mod`` was imported with, for the imports ``__init__`` makes.
    What the stand-in runner lacks that this SGLang's ``__init__`` reads is out of step.
    """
    runner = model_runner(n, device, page_size=page_size, sliding_window_size=sliding_window_size, kv_pool=kv_pool)
    with contextlib.ExitStack() as stack:
        for enter in stubs:
            stack.enter_context(enter())
        stack.enter_context(bound(*lookups_bound(mod, cls, n, page_size), *cuda_only(name or "", mod)))
        try:
            return call_with(cls, f"{cls.__name__}.__init__", where(cls), model_runner=runner)
        except AttributeError as exc:
            if getattr(exc, "obj", 0) is None or isinstance(getattr(exc, "obj", None), SimpleNamespace):
                raise OutOfStep(f"{cls.__name__}.__init__", where(cls),
                                f"reads {exc.name!r} from a stand-in vmfuzz built: {exc}") from None
            raise
        except (ValueError, RuntimeError) as exc:
            # a runtime-context lookup this release makes where vmfuzz binds none, or a call into a
            # stubbed CUDA extension: what vmfuzz stands in for is out of step, not the backend wrong
            if "not published" in str(exc) or "stub of a CUDA extension" in str(exc):
                raise OutOfStep(f"{cls.__name__}.__init__", where(cls), str(exc)) from None
            raise


# -- CUDA-only extension modules, stubbed for an import or a call -------------------------

class _Absent:
    """Stands for a name a CUDA extension would provide; calling it is a driver bug."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is a stub of a CUDA extension (not importable here); "
                           "the driver must not reach it")

    def __getattr__(self, attr: str):
        return _Absent(f"{self._name}.{attr}")


def _stub_module(name: str):
    import types
    mod = types.ModuleType(name)
    mod.__path__ = []  # a package, so ``from name.sub import x`` finds a stubbed ``sub`` too
    mod.__getattr__ = lambda attr: _Absent(f"{name}.{attr}")
    return mod


def import_with_extensions_stubbed(module: str, tries: int = 8):
    """Import ``module`` with each missing extension module stubbed, then forget the
    stubs and every module the import added that holds one (directly or through
    another such module), so no later import finds a stub. The modules it added
    that hold none stay imported: importing them again would run their
    registrations (custom ops) twice. Returns the module object."""
    before = set(sys.modules)
    stubbed: list[str] = []
    try:
        for _ in range(tries):
            try:
                imported = importlib.import_module(module)
                _STUBBED[module] = tuple(stubbed)
                return imported
            except ModuleNotFoundError as exc:
                missing = exc.name
                if not missing or missing.startswith("sglang") or missing in stubbed:
                    raise
                stubbed.append(missing)
                sys.modules[missing] = _stub_module(missing)
        raise ImportError(f"{module} still misses modules after stubbing {', '.join(stubbed)}")
    finally:
        _forget_stubbed(before, stubbed)


#: module -> the extension modules it was imported with stubbed
_STUBBED: dict[str, tuple[str, ...]] = {}


class _StubFinder:
    """Finds every module under ``roots`` as a stub, for the imports an ``__init__`` makes."""

    def __init__(self, roots: tuple[str, ...]):
        self.roots = roots
        self.made: list[str] = []

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in self.roots:
            return None
        from importlib.util import spec_from_loader
        return spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec):
        self.made.append(spec.name)
        return _stub_module(spec.name)

    def exec_module(self, module):
        pass


@contextlib.contextmanager
def extensions_stubbed_again(module: str):
    """The extension modules ``module`` was imported with stubbed are stubs again for the call, and
    forgotten after it, as at import."""
    roots = _STUBBED.get(module, ())
    finder = _StubFinder(roots)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in finder.made:
            sys.modules.pop(name, None)


@contextlib.contextmanager
def uninstalled_stubbed(*roots: str):
    """Each of ``roots`` (a compiled extension's top module) that is not installed here is a stub for
    the call, and forgotten after it: a branch that imports its names but does not call them runs as
    SGLang wrote it; one that calls one raises (``_Absent``), never a value vmfuzz made up."""
    from importlib.util import find_spec
    finder = _StubFinder(tuple(r for r in roots if r not in sys.modules and find_spec(r) is None))
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in finder.made:
            sys.modules.pop(name, None)


def _forget_stubbed(before: set, stubbed: list[str]) -> None:
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
