"""The ``sglang`` target: the installed SGLang package's real code, cut at the seams.

What runs is SGLang's own: ``maybe_create_verify_mask`` and ``tree_mask_numel``
size the allocation, ``VerifyMask.fits`` decides capacity, the call sites
(``eagle_worker_common.build_eagle_verify_input`` when drafting,
``EAGLEWorkerV2._build_trivial_verify_input`` when d = 1) decide reuse or
fallback, ``eagle_utils.build_tree_kernel_efficient`` fills and allocates, and
its kernel writes. The batch, worker and attention backend are SimpleNamespace
stand-ins carrying only what those functions read, the way SGLang's own unit
tests drive them.

While one call runs, SGLang's module attributes that lead to a seam are bound to
this instance's seam, so a variant layered over the target (which replaces one
seam on a copy) reaches SGLang's real call site: the class's ``fits``, the
sizing helper, the call site's wrapper (for the reuse-path prefix fill) and the
kernel entry. They are restored when the call returns, raises or is interrupted.
At the kernel entry every buffer the kernel writes -- the reused one, or the one
SGLang's wrapper just allocated -- is swapped for a redzoned stand-in.

Versions: SGLang 0.5.17 ... 0.5.23 differ in where the kernel entry lives and
what the platform dispatch is called; the pre-#33127 API shape takes
``fits(bs, num_draft_tokens)`` and keeps ``max_context_len`` in the struct.
Both are detected from signatures and struct fields, never from version strings.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import sys
import warnings
from types import SimpleNamespace

import msgspec
import torch

import harness
from harness.campaign import Bounds
from harness.config import Batch, Config
from harness.kernel_call import KernelCall, guarded_write
from harness.layouts import TreeMaskMode
from harness.outputs import StepOutput
from harness.shadow import ShadowHeap
from harness.trees import tree_tensors

INSTALL_HINT = ("install it with `bash scripts/install_sglang.sh` "
                "(sglang==0.5.23 --no-deps plus its CPU import chain, into .venv)")

#: The kernel's positional arguments, as every SGLang version passes them.
KERNEL_ARGS = ("parent_list", "top_scores_index", "seq_lens", "tree_mask", "positions", "retrieve_index",
               "retrieve_next_token", "retrieve_next_sibling", "topk", "spec_steps", "d", "mode")

#: Where the wrapper hands over to the kernel, newest first: 0.5.23 dispatches
#: through a function imported from spec_tree; older wheels call a module global
#: directly in their platform switch (the CUDA/default branch, which a host with
#: no platform flag set also takes).
KERNEL_ENTRIES = ("build_tree_kernel_efficient_func", "sgl_build_tree_kernel_efficient")

_MISSING = object()


class _Sglang(SimpleNamespace):
    """The SGLang modules and callables the adapter drives, found once at load."""


@contextlib.contextmanager
def _quiet_import():
    """SGLang's import chain warns about every accelerator it cannot find; a run's
    output should hold findings, not that."""
    logger = logging.getLogger("sglang")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _import_sglang(kernel_choice: str) -> _Sglang:
    if os.environ.get("SGLANG_USE_CPU_ENGINE"):
        # With it set, SGLang takes its CPU-engine branch and imports sgl_kernel's
        # CPU ops, which are not the code this target guards.
        raise ImportError("SGLANG_USE_CPU_ENGINE is set; unset it so SGLang's Triton/CUDA kernels load")
    if kernel_choice != "jit" and not torch.cuda.is_available():
        # triton.jit picks the interpreter at decoration time, i.e. when SGLang's
        # kernel module is imported: it must be in the environment before that.
        if "sglang.kernels.ops.speculative.spec_tree" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise ImportError("SGLang's kernels were imported before TRITON_INTERPRET=1 was set; "
                              "no CUDA device here, so they cannot run")
        os.environ["TRITON_INTERPRET"] = "1"
    names = {
        "verify_mask": "sglang.srt.layers.attention.verify_mask",
        "eagle_utils": "sglang.srt.speculative.eagle_utils",
        "call_site": "sglang.srt.speculative.eagle_worker_common",
        "worker_v2": "sglang.srt.speculative.eagle_worker_v2",
        "forward_info": "sglang.srt.model_executor.forward_batch_info",
    }
    mods = {}
    with _quiet_import():
        for key, name in names.items():
            try:
                mods[key] = importlib.import_module(name)
            except Exception as exc:  # any failure in SGLang's import chain means "not usable here"
                raise ImportError(f"{name}: {type(exc).__name__}: {exc}") from None
    try:
        spec_tree = importlib.import_module("sglang.kernels.ops.speculative.spec_tree")
    except Exception:
        spec_tree = None
    sg = _Sglang(**mods, spec_tree=spec_tree)
    vm, eu = sg.verify_mask, sg.eagle_utils
    for owner, attr in ((vm, "VerifyMask"), (vm, "maybe_create_verify_mask"), (vm, "tree_mask_numel"),
                        (eu, "build_tree_kernel_efficient"), (sg.call_site, "build_eagle_verify_input"),
                        (sg.worker_v2, "EAGLEWorkerV2"), (sg.forward_info, "ForwardMode")):
        if not hasattr(owner, attr):
            raise ImportError(f"{owner.__name__} has no {attr} (not an SGLang with a preallocated verify mask)")
    sg.VerifyMask = vm.VerifyMask
    sg.Mode = getattr(vm, "TreeMaskMode", None) or eu.TreeMaskMode
    sg.fields = set(sg.VerifyMask.__struct_fields__)
    sg.fits = sg.VerifyMask.fits
    fits_params = [p for p in inspect.signature(sg.fits).parameters][1:]
    sg.fits_takes_d = len(fits_params) >= 2
    sg.numel = vm.tree_mask_numel
    sg.maybe_create = vm.maybe_create_verify_mask
    sg.maybe_create_params = set(inspect.signature(sg.maybe_create).parameters)
    sg.entry = next((n for n in KERNEL_ENTRIES if n == "sgl_build_tree_kernel_efficient" or hasattr(eu, n)), None)
    # The call site calls the wrapper through its own module global when it
    # imported it by name, else through eagle_utils.
    sg.wrapper_owner = sg.call_site if hasattr(sg.call_site, "build_tree_kernel_efficient") else eu
    sg.triton = (getattr(spec_tree, "sgl_build_tree_kernel_triton", None) if spec_tree else None) \
        or getattr(eu, "sgl_build_tree_kernel_triton", None)
    sg.jit = None
    if torch.cuda.is_available():
        for mod, attr in (("sglang.kernels.ops.speculative.tree", "build_tree_kernel_efficient"),
                          ("sgl_kernel", "build_tree_kernel_efficient")):
            try:
                sg.jit = getattr(importlib.import_module(mod), attr)
                break
            except Exception:
                continue
    if kernel_choice == "jit" and sg.jit is None:
        raise ImportError("VMFUZZ_SGLANG_KERNEL=jit needs a CUDA device and SGLang's JIT tree kernel")
    if kernel_choice != "jit" and sg.triton is None:
        raise ImportError("SGLang's Triton tree kernel (sgl_build_tree_kernel_triton) was not found")
    return sg


def _sg_version() -> str:
    try:
        from importlib.metadata import version
        return version("sglang")
    except Exception:
        return "unknown"


@contextlib.contextmanager
def _bound(*patches):
    """Bind (owner, attr, value) for the duration; put back exactly what was there."""
    saved = []
    try:
        for owner, attr, value in patches:
            saved.append((owner, attr, owner.__dict__.get(attr, _MISSING) if isinstance(owner, type)
                          else getattr(owner, attr, _MISSING)))
            setattr(owner, attr, value)
        yield
    finally:
        for owner, attr, old in reversed(saved):
            if old is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, old)


class SglangTarget:
    name = "sglang"

    #: The Triton interpreter costs ~4 ms a launch at bs 1, d 2 and ~150 ms at
    #: bs 8, d 8; every verify step is one launch and a property runs 2-4 steps
    #: an example, so cases are kept small and few (README: "The `sglang` target").
    bounds = Bounds(max_bs=4, max_context_len=24, num_draft_tokens=6, topk=3, spec_steps=3, overshoot=3)
    budget = {"dev": 12, "pr": 30, "nightly": 400}

    def __init__(self, sg: _Sglang, kernel_choice: str = "triton"):
        self._sg = sg
        self.kernel_choice = kernel_choice
        self._draft_tokens: dict[int, int] = {}  # id(mask) -> d, for the pre-fix fits(bs, d)
        self._heap: ShadowHeap | None = None
        self._callsite_fill: bool | None = None

    # -- seams ---------------------------------------------------------------
    def numel(self, mode, bs: int, d: int, max_context_len: int) -> int:
        return int(self._sg.numel(self._sg.Mode(int(mode)), bs, d, max_context_len))

    def fits(self, mask, bs: int) -> bool:
        if self._sg.fits_takes_d:
            return bool(self._sg.fits(mask, bs, self._draft_tokens.get(id(mask), 0)))
        return bool(self._sg.fits(mask, bs))

    def fill_prefix(self, mask, reused: bool) -> bool:
        # What SGLang's call site asked its wrapper for; a variant overrides it.
        if self._callsite_fill is not None:
            return self._callsite_fill
        return bool(getattr(mask, "is_read", True))

    def kernel(self, call: KernelCall) -> None:
        args = (call.parent_list, call.top_scores_index, call.seq_lens, call.tree_mask, call.positions,
                call.retrieve_index, call.retrieve_next_token, call.retrieve_next_sibling,
                call.topk, call.spec_steps, call.d, self._sg.Mode(int(call.mode)))
        if self.kernel_choice == "jit":
            self._sg.jit(*args)
        else:
            self._sg.triton(*args)

    # -- composite -----------------------------------------------------------
    def allocate(self, config: Config, heap: ShadowHeap | None):
        sg = self._sg
        mode = sg.Mode(int(config.mode))
        device = "meta"  # SGLang sizes it; the cells come from the heap below
        numel_router = lambda m, bs, d, mcl: self.numel(m, bs, d, mcl)  # noqa: E731
        with _bound((sg.verify_mask, "tree_mask_numel", numel_router)):
            kwargs = dict(is_draft_runner=False, skip_prefill=False, max_bs=config.max_bs,
                          max_context_len=config.max_context_len, num_draft_tokens=config.d,
                          device=device, is_read=config.is_read)
            vm = sg.maybe_create(**{k: v for k, v in kwargs.items() if k in sg.maybe_create_params})
            if vm is None or vm.mode != mode:
                # This host's default read layout differs from the config's: build
                # the struct the way SGLang's allocator does, in the config's layout.
                n = numel_router(mode, config.max_bs, config.d, config.max_context_len)
                fields = dict(buffer=torch.empty(n, dtype=torch.bool, device=device), mode=mode,
                              max_bs=config.max_bs, max_context_len=config.max_context_len,
                              is_read=config.is_read)
                vm = sg.VerifyMask(**{k: v for k, v in fields.items() if k in sg.fields})
        if heap is not None:
            guarded = heap.alloc("tree_mask", vm.buffer.numel(), vm.buffer.dtype)
            vm = msgspec.structs.replace(vm, buffer=guarded)
        if len(self._draft_tokens) > 4096:
            self._draft_tokens.clear()
        self._draft_tokens[id(vm)] = config.d
        return vm

    def verify(self, mask, config: Config, batch: Batch, heap: ShadowHeap) -> StepOutput:
        sg = self._sg
        dev = heap.device
        bs = batch.bs
        if mask is not None:
            self._draft_tokens[id(mask)] = config.d
        seq_lens = torch.tensor(batch.seq_lens, dtype=torch.long, device=dev)
        backend = SimpleNamespace(verify_mask=mask, max_context_len=config.max_context_len)
        model_runner = SimpleNamespace(attn_backend=backend,
                                       model_config=SimpleNamespace(context_len=config.max_context_len,
                                                                    model_is_mrope=False))
        target_worker = SimpleNamespace(model_runner=model_runner)
        bonus = torch.arange(bs, dtype=torch.long, device=dev)
        stand_in = SimpleNamespace(
            forward_mode=sg.forward_info.ForwardMode.DECODE,
            seq_lens=seq_lens,
            # The exact sum sizes the wrapper's FULL_MASK fallback tightly, so a
            # short fallback allocation overflows instead of hiding in slack.
            seq_lens_sum=int(sum(batch.seq_lens)),
            seq_lens_cpu=seq_lens.cpu(),
            spec_info=SimpleNamespace(bonus_tokens=bonus),
            multimodal_inputs=[None] * bs,
        )
        with self._routed(heap, mask):
            if config.trivial:
                vi = self._trivial(stand_in, target_worker, config, dev)
            else:
                sel, par = tree_tensors(config, batch, dev)
                draft = torch.zeros((bs, config.d - 1), dtype=torch.long, device=dev)
                vi = sg.call_site.build_eagle_verify_input(
                    stand_in, SimpleNamespace(bonus_tokens=bonus), par, sel, draft, None,
                    target_worker=target_worker, topk=config.topk, num_steps=config.spec_steps,
                    num_draft_tokens=config.d, tree_mask_mode=sg.Mode(int(config.mode)), device=str(dev))
        reused = mask is not None and vi.custom_mask.data_ptr() == mask.buffer.data_ptr()
        return StepOutput(vi.custom_mask, vi.positions, vi.retrieve_index, vi.retrieve_next_token,
                          vi.retrieve_next_sibling, reused=reused)

    def _trivial(self, stand_in, target_worker, config: Config, dev):
        worker_cls = self._sg.worker_v2.EAGLEWorkerV2
        worker = worker_cls.__new__(worker_cls)  # only the attributes the trivial path reads
        for attr, value in (("_target_worker", target_worker), ("target_worker", target_worker),
                            ("topk", config.topk), ("device", str(dev))):
            with contextlib.suppress(AttributeError):
                setattr(worker, attr, value)
        return worker._build_trivial_verify_input(stand_in)

    @contextlib.contextmanager
    def _routed(self, heap: ShadowHeap, mask):
        sg = self._sg
        target = self
        wrapper = sg.wrapper_owner.build_tree_kernel_efficient

        def fits_router(vm, bs, *rest, **kw):
            return target.fits(vm, bs)

        def wrapper_router(*args, **kwargs):
            params = inspect.signature(wrapper).bind(*args, **kwargs)
            params.apply_defaults()
            buf = params.arguments.get("tree_mask_buf")
            if buf is not None and "fill_prefix_mask" in params.arguments:
                target._callsite_fill = bool(params.arguments["fill_prefix_mask"])
                try:
                    params.arguments["fill_prefix_mask"] = bool(target.fill_prefix(mask, True))
                finally:
                    target._callsite_fill = None
            return wrapper(*params.args, **params.kwargs)

        def kernel_entry(*args, **kwargs):
            bound = dict(zip(KERNEL_ARGS, args))
            bound.update(kwargs)
            seq = bound["seq_lens"]
            call = KernelCall(
                parent_list=bound["parent_list"], top_scores_index=bound["top_scores_index"], seq_lens=seq,
                tree_mask=bound["tree_mask"], positions=bound["positions"],
                retrieve_index=bound["retrieve_index"], retrieve_next_token=bound["retrieve_next_token"],
                retrieve_next_sibling=bound["retrieve_next_sibling"], topk=int(bound["topk"]),
                spec_steps=int(bound["spec_steps"]), d=int(bound["d"]), mode=TreeMaskMode(int(bound["mode"])),
                heap=heap)
            guarded_write(target.kernel, call, [int(s) for s in seq.tolist()])

        patches = [(sg.VerifyMask, "fits", fits_router),
                   (sg.wrapper_owner, "build_tree_kernel_efficient", wrapper_router)]
        if sg.entry is not None:
            patches.append((sg.eagle_utils, sg.entry, kernel_entry))
        with _bound(*patches):
            yield

    def versions(self) -> dict[str, str]:
        import triton
        return {"sglang": _sg_version(), "triton": triton.__version__, "torch": torch.__version__,
                "kernel": self.kernel_choice + (" (interpreter)" if os.environ.get("TRITON_INTERPRET") == "1" else ""),
                "vmfuzz": harness.__version__}


def load() -> SglangTarget:
    from harness.targets import TargetUnavailable

    choice = os.environ.get("VMFUZZ_SGLANG_KERNEL", "triton")
    if choice not in ("triton", "jit"):
        raise TargetUnavailable(f"VMFUZZ_SGLANG_KERNEL={choice!r}: use triton or jit")
    try:
        sg = _import_sglang(choice)
    except ImportError as exc:
        raise TargetUnavailable(f"cannot import SGLang ({exc}); {INSTALL_HINT}") from None
    return SglangTarget(sg, choice)
