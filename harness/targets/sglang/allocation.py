"""SGLang's allocation sites: each backend's cuda-graph set-up, driven to its verify-mask call.

Each backend in ``BUILT_BY_INIT`` is built by its own ``__init__`` over a
stand-in target model runner that carries the server's arguments
(``backend_init``), so the context length, draft width and draft-runner flag it
allocates with are what SGLang derives from them. DeepSeek V4's backend is built
by its own ``__init__`` too, over a DeepSeek V4 server's runner
(``dsv4_backend.built_by_init``), for a server that drafts chains (topk 1
at most, which its ``__init__`` asserts); for a tree server, which DeepSeek V4
never runs, and for its ROCm backend, the backend is made with ``cls.__new__``
and given the attributes its ``init_cuda_graph_state`` reads, set to what its
``__init__`` derives.
Then the backend's own ``init_cuda_graph_state(max_bs, max_bs * d)`` runs:
the two numbers SGLang's cuda-graph runner hands it.
``maybe_create_verify_mask`` is bound in the backend's module for that call:
it records the arguments, runs SGLang's real allocator (meta device) and stops
the set-up there, so the CUDA-only work after the mask is never reached.

Not driven: ``__init__`` of DeepSeek V4's ROCm backend, and the
backends whose module this release does not have (``load_sites`` says which). A
module that is there but raises when imported is never left undriven: it is
raised as ``imports.decide`` says (SGLang's own raise a finding, the rest out of step).
"""

from __future__ import annotations

import importlib
import inspect

import torch

from vmfuzz.harness.model.allocation import (ALLOCATING_BACKENDS, TRITON_INDPTRS, TRITON_INIT, AllocationCall,
                                      ServerNumbers)
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang import backend_init, dsv4_backend
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.reach import lookup_patches, reached
from vmfuzz.harness.targets.sglang.seams import (ALLOCATOR_SYNONYMS, TranslatesNothing, call_method, quantities_of_call,
                                          unset_by_harness, with_quantity)

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
#: and neither its ``__init__`` nor its set-up calls them before the
#: verify-mask call. flashmla's set-up allocates on "cuda" before its call:
#: those allocations go to meta (``backend_init.HostTorch``).
DRIVERS = ("triton", "flashattention", "flashmla", "trtllm_mla", "deepseek_v4", "qwen_sparse",
           "deepseek_v4_hip_radix")

#: Sites built by their own ``__init__`` over the stand-in runner (``backend_init``): what they
#: allocate with is what SGLang derives from the server's arguments.
BUILT_BY_INIT = ("triton", "flashattention", "flashmla", "trtllm_mla", "qwen_sparse")
#: Sites built by their own ``__init__`` over a runner of their model family's server, where that server runs the
#: case's draft (``_built_for_family``)
BUILT_FOR_FAMILY = ("deepseek_v4",)

#: (sglang-relative path, what is driven, properties that drive it); only the
#: sites a CPU host can import -- ``not_driven`` says why the others are not.
SURFACE: tuple[tuple[str, str, tuple[str, ...]], ...] = tuple(
    (_ATTN + module + ".py", f"{cls}.init_cuda_graph_state", ("allocation-soundness",))
    for name, (module, cls) in SITES.items() if name in DRIVERS
) + tuple(
    # where each derives max_context_len, the draft width and the runner role it allocates with
    (_ATTN + module + ".py", f"{cls}.__init__", ("allocation-soundness",))
    for name, (module, cls) in SITES.items() if name in BUILT_BY_INIT + BUILT_FOR_FAMILY
) + (
    # the parent __init__ of both MLA backends: where they derive max_context_len
    (_ATTN + "flashinfer_mla_backend.py", "FlashInferMLAAttnBackend.__init__", ("allocation-soundness",)),
    # the allocator itself, called with each site's own arguments
    (_ATTN + "verify_mask.py", "maybe_create_verify_mask", ("allocation-soundness",)),
)


class _Allocated(Exception):
    """Ends a backend's set-up right after its verify-mask call."""


def _attributes(name: str, n: ServerNumbers) -> dict:
    """What the ``__init__`` of a backend not built here (``BUILT_BY_INIT``) would have set, for a
    target runner of a server with ``n``: each attribute its ``init_cuda_graph_state`` reads."""
    common = dict(device="meta", is_draft_runner=False, skip_prefill=False, max_context_len=n.context_len,
                  kv_index_translator=TranslatesNothing())
    if name == "deepseek_v4":
        return dict(common, speculative_num_draft_tokens=n.num_draft_tokens)
    if name == "deepseek_v4_hip_radix":
        return dict(common, is_draft_worker=False, speculative_num_draft_tokens=n.num_draft_tokens)
    raise ValueError(f"unknown allocating backend {name!r} (known: {', '.join(ALLOCATING_BACKENDS)})")


def built_by_init(mod, cls, n: ServerNumbers, device="meta", sliding_window_size: int | None = None, kv_pool=None):
    """``cls`` (the Triton backend) made by its own ``__init__`` over a stand-in target model runner of a
    server started with ``n``, its request pool ``n.max_bs`` deep (``backend_init.built_by_init``)."""
    return backend_init.built_by_init(mod, cls, n, device, sliding_window_size=sliding_window_size, kv_pool=kv_pool)


#: Sites whose module imports CUDA-only extensions at load: imported with those
#: stubbed (``backend_init.import_with_extensions_stubbed``) so their set-up can be driven on meta.
STUBBED_IMPORT = ("flashattention", "flashmla")


def load_sites() -> dict[str, object]:
    """harness name -> the imported module, or a string saying why it is not driven here.

    A site's module this release does not have is "not in this release"; any
    other failure to import it is raised as ``imports.decide`` says (SGLang's own
    raise a finding, the rest out of step), never a site quietly left undriven.
    """
    from vmfuzz.harness.targets.sglang.imports import NotInRelease, sglang_module
    sites: dict[str, object] = {}
    for name, (module, cls) in SITES.items():
        path = "sglang.srt.layers.attention." + module
        importer = backend_init.import_with_extensions_stubbed if name in STUBBED_IMPORT else importlib.import_module
        try:
            mod = sglang_module(path, importer)
        except NotInRelease:
            sites[name] = f"{module}.py is not in this release"
            continue
        if not hasattr(mod, cls) or reached(mod, "maybe_create_verify_mask") is None:
            sites[name] = f"{module}.py has no {cls} calling maybe_create_verify_mask"
            continue
        sites[name] = mod if name in DRIVERS else (f"{module}.py imports, but no driver for its set-up "
                                                    "was proven on a CPU host")
    return sites


def site_backend(target, name: str, numbers: ServerNumbers, page_size: int = 1):
    """(module, class, backend): backend ``name`` of a server started with ``numbers`` (its KV in pages of
    ``page_size`` tokens), made as its set-up is driven here (``BUILT_BY_INIT`` by its own ``__init__``,
    the others given its attributes)."""
    sites = target._allocation_sites()
    mod = sites.get(name)
    if mod is None or isinstance(mod, str):
        raise ValueError(f"allocation site {name!r} is not driven here: {mod or 'unknown backend'}")
    cls = getattr(mod, SITES[name][1])
    if name in BUILT_BY_INIT:
        stubs = [lambda: backend_init.extensions_stubbed_again(mod.__name__)] if name in STUBBED_IMPORT else []
        backend = backend_init.built_by_init(mod, cls, numbers, name=name, stubs=stubs, page_size=page_size)
    elif _built_for_family(name, numbers):
        backend = dsv4_backend.built_by_init(mod, cls, numbers)
    else:
        backend = cls.__new__(cls)
        for attr, value in _attributes(name, numbers).items():
            object.__setattr__(backend, attr, value)
    return mod, cls, backend


def _built_for_family(name: str, numbers: ServerNumbers) -> bool:
    """Whether site ``name`` is built by its own ``__init__`` for ``numbers``: DeepSeek V4's, on a server
    drafting chains (its ``__init__`` asserts topk 1 at most: no DeepSeek V4 server drafts a tree)."""
    return name in BUILT_FOR_FAMILY and numbers.topk <= 1


def allocation_call(target, name: str, numbers: ServerNumbers) -> AllocationCall:
    """Run backend ``name``'s cuda-graph set-up for ``numbers`` and record its verify-mask call."""
    mod, cls, backend = site_backend(target, name, numbers)
    real = reached(mod, "maybe_create_verify_mask")
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

    # the set-up reads the server-wide config and does the CUDA-only work __init__ did: the same stand-ins
    # bound where the backend reaches the allocator: its import, or the module it calls it through
    patches = [*lookup_patches([mod], {"maybe_create_verify_mask": recording}),
               *backend_init.lookups_bound(mod, cls, numbers),
               *backend_init.cuda_only(name, mod)]
    with bound(*patches):
        try:
            call_method(backend, "init_cuda_graph_state", max_bs=numbers.max_bs,
                        max_num_tokens=numbers.max_bs * numbers.num_draft_tokens)
        except _Allocated:
            pass
        except AttributeError as exc:
            unset_by_harness(exc, backend, cls, f"{cls.__name__} stand-in", _ATTN + SITES[name][0] + ".py")
            raise
    if not calls:
        raise OutOfStep(f"{SITES[name][1]}.init_cuda_graph_state", _ATTN + SITES[name][0] + ".py",
                        "it returned without calling maybe_create_verify_mask, the call vmfuzz records")
    return calls[0]


def triton_indptr_buffers(target, numbers: ServerNumbers) -> dict[str, tuple[int, ...]]:
    """The shapes of the Triton backend's per-request index pointers (``TRITON_INDPTRS``) as its own
    ``__init__`` made them, on meta, for a server with ``numbers`` (request pool ``numbers.max_bs`` deep)."""
    _, cls, backend = site_backend(target, "triton", numbers)
    missing = [name for name in TRITON_INDPTRS if not isinstance(getattr(backend, name, None), torch.Tensor)]
    if missing:
        raise OutOfStep(TRITON_INIT, _ATTN + SITES["triton"][0] + ".py",
                        f"a target runner's {cls.__name__} has no {', '.join(missing)} tensor, where vmfuzz reads "
                        "the per-request index pointers it allocates")
    return {name: tuple(getattr(backend, name).shape) for name in TRITON_INDPTRS}


#: (sglang-relative path, what, why not driven): the other allocation sites.
NOT_DRIVEN: tuple[tuple[str, str, str], ...] = ()
