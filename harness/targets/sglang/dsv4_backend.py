"""DeepSeek V4's attention backend, made by its own ``__init__`` over a DeepSeek V4 server's runner.

The allocation site (``allocation``) asks for it on a server that drafts chains:
its ``__init__`` asserts topk 1 at most, and the model, page size and KV pool
it asserts (``DSV4_*``) are a DeepSeek V4 server's. Its runner is
``backend_init``'s stand-in target runner with those; its KV pool is SGLang's
own class made with ``__new__``, given only what ``__init__`` reads. What the
``__init__`` asks a GPU (its indexers' compute capability) is answered as a
GPU older than sm100 would answer (``DSV4_CUDA_ONLY``), where this release asks.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import SimpleNamespace

from vmfuzz.harness.model.allocation import ServerNumbers
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang import backend_init
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.reach import lookup_patches
from vmfuzz.harness.targets.sglang.seams import call_with, where
from vmfuzz.harness.targets.sglang.stand_in import StandIn
from vmfuzz.harness.targets.sglang.structs import field_defaults

_RUNNER = "srt/model_executor/model_runner.py"


#: A DeepSeek V4 server as its attention backend's ``__init__`` asserts it: KV pages of 256 tokens, MQA heads
#: 512 wide (448 no-PE + 64 RoPE), window pages a whole number of its 128-token windows; its KV pool keeps
#: the compress ratios 4 and 128 (the C4 indexer's and the C128 layers'), with no request window.
DSV4_PAGE_SIZE, DSV4_HEAD_DIM, DSV4_SWA_PAGE_SIZE, DSV4_RATIOS = 256, 512, 128, (4, 128)
#: the modules DeepSeek V4's ``__init__`` reaches the runtime-context lookups through, besides its own
_DSV4_LOOKUP_MODULES = ("sglang.srt.layers.attention.dsa.dsa_topk_backend",)
#: (module, name, stand-in, why it cannot change the mask's size): the device queries DeepSeek V4's ``__init__``
#: makes (bound where the module has the name: 0.5.21 asks the device unguarded, 0.5.23 answers False on a CPU)
DSV4_CUDA_ONLY = (
    ("sglang.srt.layers.attention.dsv4.v41_indexer", "is_sm100_or_newer", lambda: False,
     "asks the GPU's compute capability to pick DeepGEMM's indexer kernels: the indexers, not the mask"),
)


def model_runner(n: ServerNumbers, device="meta", spec_algorithm=None, request_window=None) -> StandIn:
    """A DeepSeek V4 target model runner of a server started with ``n``: ``backend_init.model_runner``'s, with
    the model, page size and KV pool its backend's ``__init__`` asserts (``DSV4_*``), no HiSparse, the target
    of ``spec_algorithm`` (EAGLE where not given), its KV pool keeping ``request_window`` (a V4.1 pool's).

    The pool is SGLang's ``DeepSeekV4TokenToKVPool`` class (the backend checks it is one), made with
    ``__new__`` and given only what ``__init__`` reads: its own set-up allocates the compressed KV of
    every layer, which no allocation check reads."""
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    pool = DeepSeekV4TokenToKVPool.__new__(DeepSeekV4TokenToKVPool)
    vars(pool).update(swa_page_size=DSV4_SWA_PAGE_SIZE, present_ratios=DSV4_RATIOS,
                      request_window=request_window)
    model = dict(head_dim=DSV4_HEAD_DIM, v_head_dim=DSV4_HEAD_DIM, hf_text_config=StandIn(
        "hf_text_config", _RUNNER, model_type="deepseek_v4", num_attention_heads=8))
    runner = backend_init.model_runner(n, device, page_size=DSV4_PAGE_SIZE, kv_pool=pool, model=model,
                                       runner=dict(hisparse_coordinator=None,
                                                   spec_algorithm=spec_algorithm or SpeculativeAlgorithm.EAGLE))
    # 0.5.17-0.5.19 read DeepSeek V4's kernel choices off the runner's server_args (later releases through
    # get_exec()): each at this release's own ServerArgs default, as a server started without them has it
    for name, value in _server_arg_defaults(DSV4_KERNEL_ARGS).items():
        setattr(runner.server_args, name, value)
    return runner


#: DeepSeek V4's kernel choices its ``__init__`` reads (the FP4 C4 indexer, the top-k kernel): they pick the
#: indexers' kernels, not the mask's size
DSV4_KERNEL_ARGS = ("enable_deepseek_v4_fp4_indexer", "dsa_topk_backend")


def _server_arg_defaults(names) -> dict:
    """``names``' defaults in the installed SGLang's ``ServerArgs``, for those it declares."""
    from sglang.srt.server_args import ServerArgs  # a dataclass up to 0.5.19, a msgspec Struct since 0.5.20
    declared = field_defaults(ServerArgs)
    return {name: declared[name] for name in names if name in declared}


def lookups(mod, cls, n: ServerNumbers) -> list[tuple]:
    """What DeepSeek V4's backend ``cls`` (of module ``mod``) is made and asked under on a server started with
    ``n``: the runtime-context lookups where it and its top-k resolver make them, and ``DSV4_CUDA_ONLY``."""
    # A release that lacks one of these modules makes no lookup or query through it (0.5.17-0.5.20 have
    # no V4.1 indexer): nothing to bind there.
    extra = [importlib.import_module(name) for name in _DSV4_LOOKUP_MODULES if _holds(name)]
    patches = [*backend_init.lookups_bound(mod, cls, n, DSV4_PAGE_SIZE),
               *lookup_patches(extra, backend_init._context(backend_init.server_args(n, DSV4_PAGE_SIZE)))]
    for module, name, stand_in, _ in DSV4_CUDA_ONLY:
        held = importlib.import_module(module) if _holds(module) else None
        if held is not None and hasattr(held, name):
            patches.append((held, name, stand_in))
    return patches


def _holds(module: str) -> bool:
    """Whether the installed SGLang has ``module`` (read from its files, never its version)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package this release does not have
        return False


def built_by_init(mod, cls, n: ServerNumbers, device="meta", spec_algorithm=None, request_window=None):
    """DeepSeek V4's attention backend ``cls`` made by its own ``__init__`` over ``model_runner`` (the target of
    ``spec_algorithm``), under ``lookups``. Its ``__init__`` takes topk 1 at most (a DeepSeek V4 server drafts
    chains only): a caller asks only for such a server."""
    runner = model_runner(n, device, spec_algorithm, request_window)
    with bound(*lookups(mod, cls, n)):
        try:
            return call_with(cls, f"{cls.__name__}.__init__", where(cls), model_runner=runner)
        except AttributeError as exc:
            obj = getattr(exc, "obj", None)
            if isinstance(obj, SimpleNamespace) or obj is runner.token_to_kv_pool:
                seam = "its KV pool (made with __new__)" if not isinstance(obj, SimpleNamespace) else "a stand-in"
                raise OutOfStep(f"{cls.__name__}.__init__", where(cls),
                                f"reads {exc.name!r} from {seam} vmfuzz built: {exc}") from None
            raise
        except (ValueError, RuntimeError) as exc:
            if "not published" in str(exc):
                raise OutOfStep(f"{cls.__name__}.__init__", where(cls), str(exc)) from None
            raise

