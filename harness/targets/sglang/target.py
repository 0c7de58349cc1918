"""``SglangTarget``: SGLang's real code behind the target protocol's seams.

While one call runs, SGLang's module attributes that lead to a seam are bound to
this instance's seam, so a variant layered over the target (which replaces one
seam on a copy) reaches SGLang's real call site. At the kernel entry every
buffer the kernel writes -- the reused one, or the one SGLang's wrapper just
allocated -- is swapped for a redzoned stand-in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os

import torch

import vmfuzz.harness
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.guard.chain_write import ChainCall, ChainInputs, ChainOutput
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.guard.tree_write import KernelCall
from vmfuzz.harness.model.outputs import StepOutput
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.targets.sglang.binding import bound as _bound
from vmfuzz.harness.targets.sglang import (call_sites, flashinfer, fork_ready, graph_support, imitated_host,
                                           readers, writers)
from vmfuzz.harness.targets.sglang.imitated_host import VERIFY_MASK
from vmfuzz.harness.targets.sglang.loader import Sglang
from vmfuzz.harness.targets.sglang.reach import patches_everywhere
from vmfuzz.harness.targets.sglang.seams import (OutOfStep, Sentinel, bind, call_by_quantity, call_with,
                                          require_taken, where)
from vmfuzz.harness.targets.sglang.structs import replaced


#: (SGLang file, function, properties that drive it): what ``vmfuzz surface`` lists.
_ALL = ("no-oob-write", "fallback-equivalence", "reference-agreement", "capacity-soundness", "capacity-liveness",
        "multi-step-reuse", "trivial-path", "chain-writer")
SURFACE = (
    # every property allocates its mask through SGLang's allocator and sizing
    ("srt/layers/attention/verify_mask.py", "maybe_create_verify_mask", _ALL),
    ("srt/layers/attention/verify_mask.py", "tree_mask_numel", _ALL),
    # the direct chain writer sizes its buffer by arithmetic, not fits
    ("srt/layers/attention/verify_mask.py", "VerifyMask.fits", _ALL[:-1]),
)


class SglangTarget:
    name = "sglang"
    before_forks = staticmethod(fork_ready.before_forks)  # see fork_ready: done once, not per fork

    #: The Triton interpreter costs ~4 ms a launch at bs 1, d 2 and ~150 ms at
    #: bs 8, d 8; every verify step is one launch and a property runs 2-4 steps
    #: an example, so cases are kept small and few (README: "The `sglang` target").
    bounds = Bounds(max_bs=4, max_context_len=24, num_draft_tokens=6, topk=3, spec_steps=3, overshoot=3)
    budget = {"dev": 12, "pr": 30, "nightly": 400}
    #: nightly widens the bounds in steps, each with an equal share of the
    #: budget left: the small, fast shapes first (many cases), then production
    #: draft shapes (d 16, topk 8, spec_steps 6, max_bs 16, context 256), whose
    #: launches take ~0.3-1 s each in the interpreter. ``pr`` keeps ``bounds``.
    bounds_ladder = {"nightly": (
        bounds,
        Bounds(max_bs=8, max_context_len=64, num_draft_tokens=10, topk=5, spec_steps=4, overshoot=4),
        Bounds(max_bs=16, max_context_len=256, num_draft_tokens=16, topk=8, spec_steps=6, overshoot=4),
    )}
    #: seconds one isolated example may take before it is a target-hang: a shared case at the widest
    #: nightly bounds (up to 36 requests, d 16, five steps) took over 30 s in the interpreter on a loaded
    #: 2-core host; in a gate, one graph case (every runner built and captured, then replayed by three
    #: properties) took over 30 s on a 2-core host at load 6, where a hang would be a false finding
    example_timeout = {"nightly": 600.0, "pr": 120.0}
    #: pieces of a case's server this SGLang keeps vmfuzz from driving, and why (``known_on_base``)
    pieces_not_driven = staticmethod(graph_support.pieces_not_driven)

    def __init__(self, sg: Sglang, kernel_choice: str = "triton"):
        self.sglang = sg
        self.kernel_choice = kernel_choice
        self._graph_why: str | None = None  # "" once read: the graph path is driven here
        self._draft_tokens: dict[int, int] = {}  # id(mask) -> d, for the pre-fix fits(bs, d)
        self._heap: ShadowHeap | None = None
        self._callsite_fill: bool | None = None
        self._site = "eagle"  # the call site of the verify step under way, for site_fits
        # The arguments that call site passed fits, while it asks; a dict, so a variant's copy shares it.
        self._site_call: dict = {}
        # An SGLang without the chain branch or the pp rebuild gets cases through the others only.
        self.call_sites = call_sites.available(sg)
        self.bounds = dataclasses.replace(type(self).bounds, call_sites=self.call_sites)
        self.bounds_ladder = {profile: tuple(dataclasses.replace(b, call_sites=self.call_sites) for b in steps)
                              for profile, steps in type(self).bounds_ladder.items()}

    # -- seams ---------------------------------------------------------------
    def numel(self, mode, bs: int, d: int, max_context_len: int) -> int:
        return int(self.sglang.numel(self.sglang.Mode(int(mode)), bs, d, max_context_len))

    def fits(self, mask, bs: int) -> bool:
        asked = self._site_call.get("asked")
        if asked is not None:
            # Asked at a call site: the site's own arguments, with this batch size (a variant may ask another).
            call = inspect.BoundArguments(asked.signature, dict(asked.arguments))
            first, second = list(asked.signature.parameters)[:2]
            call.arguments[first], call.arguments[second] = mask, bs
            return bool(self.sglang.fits(*call.args, **call.kwargs))
        # Bound by fits's own parameters (loader._fits_shape): options with defaults keep them.
        if self.sglang.fits_problem:
            raise OutOfStep("VerifyMask.fits", VERIFY_MASK, self.sglang.fits_problem)
        bs_name, d_name = self.sglang.fits_names
        named = {bs_name: bs}
        if self.sglang.fits_takes_d:
            named[d_name] = self._draft_tokens.get(id(mask), 0)
        return bool(call_with(self.sglang.fits, "VerifyMask.fits", VERIFY_MASK, mask, **named))

    def fill_prefix(self, mask, reused: bool) -> bool:
        # What SGLang's call site asked its wrapper for; a variant overrides it.
        if self._callsite_fill is not None:
            return self._callsite_fill
        return bool(getattr(mask, "is_read", True))

    def kernel(self, call: KernelCall) -> None:
        # Passed by the kernel's own parameter names (seams.SYNONYMS), never by position.
        values = {q: getattr(call, q) for q in ("parent_list", "top_scores_index", "seq_lens", "tree_mask",
                                                "positions", "retrieve_index", "retrieve_next_token",
                                                "retrieve_next_sibling", "topk", "spec_steps", "d")}
        values["mode"] = self.sglang.Mode(int(call.mode))
        fn = self.sglang.jit if self.kernel_choice == "jit" else self.sglang.triton
        if fn is None:
            raise OutOfStep("sgl_build_tree_kernel_triton", "kernels/ops/speculative/spec_tree.py",
                            self.sglang.triton_problem)
        call_by_quantity(fn, getattr(fn, "__name__", "tree kernel"), where(fn), values)

    def not_driven_here(self, prop: str) -> str | None:
        """Why ``prop`` cannot be driven on this SGLang, found from its code; None: it can."""
        if prop in graph_support.PROPERTIES:
            return self._graph_path_not_driven()
        if prop == "chain-writer" and self.sglang.build_chain_tree is None:
            return "this SGLang has no build_chain_tree (kernels/ops/speculative/eagle.py): no chain writer to check"
        if prop == "packed-mask":
            return flashinfer.packing_not_driven()
        return None

    def _graph_path_not_driven(self) -> str | None:
        if self._graph_why is None:  # read once: the code under test does not change
            self._graph_why = graph_support.not_driven() or ""
        return self._graph_why or None

    def site_fits(self, site: str, mask, bs: int) -> bool:
        # What a call site's verify_mask.fits(bs) answers; a variant makes one site ask wrongly.
        return self.fits(mask, bs)

    def chain_kernel(self, call: ChainCall) -> None:
        if call.launch is None:
            raise RuntimeError("the sglang target relaunches SGLang's chain kernel as build_chain_tree "
                               "launched it; this ChainCall did not come from that launch")
        writers.relaunch_chain(self.sglang, call)

    # -- composite -----------------------------------------------------------
    def allocate(self, config: Config, heap: ShadowHeap | None):
        numel_router = lambda m, bs, d, mcl: self.numel(m, bs, d, mcl)  # noqa: E731
        vm = imitated_host.allocate(self.sglang, config, numel_router)
        if heap is not None:
            guarded = heap.alloc("tree_mask", vm.buffer.numel(), vm.buffer.dtype)
            vm = replaced(vm, "VerifyMask", VERIFY_MASK, buffer=guarded)
        if len(self._draft_tokens) > 4096:
            self._draft_tokens.clear()
        self._draft_tokens[id(vm)] = config.d
        return vm

    def verify(self, mask, config: Config, batch: Batch, heap: ShadowHeap) -> StepOutput:
        if mask is not None:
            self._draft_tokens[id(mask)] = config.d
        with self._routed(heap, mask, config.call_site) as taken:
            vi = call_sites.build_verify_input(self.sglang, mask, config, batch, heap.device)
        if not (config.trivial and config.call_site == "eagle"):  # d = 1 there fills the mask itself
            require_taken(taken, config.call_site)
        reused = mask is not None and vi.custom_mask.data_ptr() == mask.buffer.data_ptr()
        return StepOutput(vi.custom_mask, vi.positions, vi.retrieve_index, vi.retrieve_next_token,
                          vi.retrieve_next_sibling, reused=reused, draft_token=vi.draft_token)

    def chain_write(self, inputs: ChainInputs, buffer, heap: ShadowHeap, *, with_mrope: bool = True):
        """SGLang's ``build_chain_tree`` called directly, its launch guarded."""
        chain = self.sglang.build_chain_tree
        if chain is None:  # not_driven_here says so before any check runs
            raise OutOfStep("build_chain_tree", "kernels/ops/speculative/eagle.py", "absent from this SGLang")
        patches = writers.chain_kernel_patches(self.sglang, self.chain_kernel, heap)
        if not patches:
            raise OutOfStep("build_chain_tree", where(chain), "no Triton kernel launch found among the globals "
                            "it names, for vmfuzz to guard")
        with _bound(*patches):
            outputs = call_with(chain, "build_chain_tree", where(chain), bonus_tokens=inputs.bonus_tokens,
                                draft_tokens=inputs.draft_tokens, seq_lens=inputs.seq_lens, tree_mask_buf=buffer,
                                req_pool_indices=inputs.req_pool_indices, req_to_token=inputs.req_to_token,
                                with_mrope=with_mrope)
        patches[0][2].require("build_chain_tree returned without launching the kernel vmfuzz guards "
                              "(_build_chain_tree_kernel)")
        return ChainOutput.of(outputs, buffer)

    @contextlib.contextmanager
    def _routed(self, heap: ShadowHeap, mask, site: str | None = None):
        """Every seam of this instance bound into SGLang for one call (``site``: of that call site's step)."""
        self._site = site or self._site
        sg = self.sglang
        target = self
        wrapper = sg.wrapper_owner.build_tree_kernel_efficient

        def fits_router(vm, *args, **kw):
            # The batch size is fits's first parameter, however the call site passed it.
            asked = bind(sg.fits, "VerifyMask.fits", VERIFY_MASK, vm, *args, **kw)
            target._site_call["asked"] = asked
            try:
                return target.site_fits(target._site, vm, list(asked.arguments.values())[1])
            finally:
                target._site_call.pop("asked", None)

        def wrapper_router(*args, **kwargs):
            params = bind(wrapper, "build_tree_kernel_efficient", writers.EAGLE_UTILS, *args, **kwargs)
            params.apply_defaults()
            buf = params.arguments.get("tree_mask_buf")
            if buf is not None and "fill_prefix_mask" in params.arguments:
                target._callsite_fill = bool(params.arguments["fill_prefix_mask"])
                try:
                    params.arguments["fill_prefix_mask"] = bool(target.fill_prefix(mask, True))
                finally:
                    target._callsite_fill = None
            try:
                return wrapper(*params.args, **params.kwargs)
            except Exception as exc:
                writers.unguarded_write(exc, sg, kernel)
                raise

        wrapped = Sentinel(wrapper_router, "build_tree_kernel_efficient", writers.EAGLE_UTILS)
        # The wrapper wherever a call site may reach it: imported by name, through eagle_utils
        # (the pp rebuild imports it at call time), or under another name.
        patches = [(sg.VerifyMask, "fits", fits_router),
                   *patches_everywhere(wrapper, wrapped,
                                       (sg.wrapper_owner, "build_tree_kernel_efficient"),
                                       (sg.eagle_utils, "build_tree_kernel_efficient"))]
        chain = writers.chain_kernel_patches(sg, target.chain_kernel, heap)
        if target._site == "frozen_kv_mtp":
            # The frozen-KV MTP worker imported the wrapper by name at its own import.
            patches.append((sg.frozen().module, "build_tree_kernel_efficient", wrapped))
        kernel = writers.tree_kernel_patches(sg, target.kernel, heap)
        try:
            with _bound(*patches, *kernel, *chain):
                yield {"wrapper": wrapped, "kernel": kernel[0][2] if kernel else None,
                       "chain": chain[0][2] if chain else None}
        finally:
            self._site = "eagle" if site else self._site

    # -- readers (sglang/readers.py, sglang/flashinfer.py; seams of reader-agreement and packed-mask) --
    def read_eager(self, config: Config, batch: Batch, step: StepOutput, heap: ShadowHeap):
        return readers.read_eager(config, batch, step, heap)

    def read_replay(self, mask, config: Config, batch: Batch, step: StepOutput, heap: ShadowHeap):
        return readers.read_replay(mask, config, batch, step, heap)

    def read_eager_overlapped(self, config: Config, batch: Batch, step: StepOutput, heap: ShadowHeap):
        """The eager read as the overlap scheduler hands it: ``seq_lens_sum`` unknown (``readers``)."""
        return readers.read_eager(config, batch, step, heap, sum_known=False)

    def read_window_eager(self, config: Config, batch: Batch, step: StepOutput, heap: ShadowHeap, window: int):
        """The eager read on a server whose model reads a sliding ``window`` of tokens (``readers``)."""
        return readers.read_eager(config, batch, step, heap, window)

    def read_window_replay(self, mask, config: Config, batch: Batch, step: StepOutput, heap: ShadowHeap, window):
        """The replay read on a server whose model reads a sliding ``window`` of tokens (``readers``)."""
        return readers.read_replay(mask, config, batch, step, heap, window)

    def reader_session(self, mask, config: Config, pool: int, heap: ShadowHeap):
        """One Triton backend for a case's batches, graphs captured once (``readers.ServerReader``)."""
        return readers.ServerReader(mask, config, pool, heap)

    def pack_mask(self, config: Config, batch: Batch, step_mask, buffer):
        return flashinfer.pack_mask(config, batch, step_mask, buffer)

    def read_fa3_verify(self, config: Config, batch: Batch, step: StepOutput, page_size: int = 1,
                        window: int | None = None, verify_lens: list[int] | None = None):
        """FlashAttention's eager verify metadata over the step's mask (pages, window, lens: ``fa3_reader``)."""
        from vmfuzz.harness.targets.sglang import fa3_reader
        return fa3_reader.read_verify(config, batch, step, page_size, window, verify_lens)

    def read_fa3_replay(self, config: Config, batch: Batch, step: StepOutput, page_size=1, window=None, verify_lens=None):
        """The same metadata in the cuda graph's buffers, replayed at the captured bs >= bs (``fa3_reader``)."""
        from vmfuzz.harness.targets.sglang import fa3_reader
        return fa3_reader.read_replay(config, batch, step, page_size, window, verify_lens)

    def fa3_not_driven(self) -> str | None:
        from vmfuzz.harness.targets.sglang import fa3_reader
        return fa3_reader.not_driven()

    def fa3_replay_not_driven(self, config: Config) -> str | None:
        from vmfuzz.harness.targets.sglang import fa3_reader
        return fa3_reader.replay_not_driven(config)

    def read_qsa_verify(self, config: Config, batch: Batch, step: StepOutput):
        """Qwen sparse attention's eager chain verify read (``qsa_reader``)."""
        from vmfuzz.harness.targets.sglang import qsa_reader
        return qsa_reader.read_verify(config, batch, step)

    def read_qsa_replay(self, config: Config, batch: Batch, step: StepOutput):
        """The same read from the cuda graph's buffers, replayed at the captured bs >= bs (``qsa_reader``)."""
        from vmfuzz.harness.targets.sglang import qsa_reader
        return qsa_reader.read_replay(config, batch, step)

    def kv_locations(self, case, heap):
        """One draft-verify-accept iteration's KV locations through SGLang's code (``kv_locations``)."""
        from vmfuzz.harness.targets.sglang import kv_locations
        if getattr(self, "_kv_modules", None) is None:
            self._kv_modules = kv_locations.kv_modules()
        return kv_locations.run_case(self._kv_modules, case, heap)

    def qsa_not_driven(self, config: Config) -> str | None:
        from vmfuzz.harness.targets.sglang import qsa_reader
        return qsa_reader.not_driven(config)

    def shape_constants(self):
        """The widths the code under test is built around (the deep boundary corpus's sizes)."""
        from vmfuzz.harness.targets.sglang.shapes import shape_constants
        return shape_constants()

    def versions(self) -> dict[str, str]:
        import triton
        from vmfuzz.harness.targets.sglang.loader import imported_sglang_and_source
        version, path, source = imported_sglang_and_source()  # one git describe, not one per field
        return {"sglang": version, "sglang path": str(path), "sglang version from": source,
                "triton": triton.__version__, "torch": torch.__version__,
                "kernel": self.kernel_choice + (" (interpreter)" if os.environ.get("TRITON_INTERPRET") == "1" else ""),
                "call sites": ", ".join(self.call_sites),
                "vmfuzz": vmfuzz.harness.__version__}

    # -- routers and allocation sites (routers.py, allocation.py) --------------
    @property
    def routers(self) -> tuple[str, ...]:
        """The router kinds this SGLang has; the routing property checks these."""
        from vmfuzz.harness.targets.sglang import routers
        return routers.present()

    def route(self, router: str, spec_mode: str, children: dict, context_len: int):
        """SGLang's router class of that kind, built over stand-ins of ``children``."""
        from vmfuzz.harness.targets.sglang import routers
        return routers.build(self.sglang, router, spec_mode, children, context_len)

    def verify_routed(self, routing, config: Config, batch: Batch, heap: ShadowHeap) -> StepOutput:
        from vmfuzz.harness.targets.sglang import routers
        return routers.verify_routed(self, routing, config, batch, heap)

    def draft_graph_session(self, shape, max_bs: int, heap: ShadowHeap | None = None, largest_only: bool = False):
        """SGLang's draft-decode cuda-graph runner of a server of ``shape`` (``draft_graph_session``)."""
        from vmfuzz.harness.targets.sglang import draft_graph_session
        return draft_graph_session.DraftSession(shape, max_bs, heap, largest_only)

    def graph_session(self, config: Config, mask, heap: ShadowHeap, capture: bool = True, **server):
        """SGLang's target verify cuda-graph runner, captured at every bs (False: held back), as ``GraphSession``."""
        from vmfuzz.harness.targets.sglang import graph_session, pp_stage
        # a pp-site server's runner is a later pipeline stage's: its rebuild routed as the pp site's
        stage = (pp_stage.Stage(self.sglang, mask, config, lambda: self._routed(heap, mask, "pp"))
                 if config.call_site == "pp" else None)
        return graph_session.GraphSession(config, mask, heap, stage, capture, **server)

    def draft_extend_session(self, config: Config, heap: ShadowHeap, runner: str, window: int = 0):
        """One of SGLang's draft-extend cuda-graph runners, captured; ``window``: its model's (0: none)."""
        from vmfuzz.harness.targets.sglang import draft_extend_session
        return draft_extend_session.DraftExtendSession(config, heap, runner, window)

    def draft_extend_not_driven(self, config: Config, runner: str) -> str | None:
        from vmfuzz.harness.targets.sglang import draft_extend_session
        return draft_extend_session.not_driven(config, runner)

    def tbo_replay(self, config: Config, batch: Batch):
        """What TBO hands its overlap children to set up a TARGET_VERIFY cuda-graph replay."""
        from vmfuzz.harness.targets.sglang import routers
        return routers.tbo_replay(self.sglang, config, batch)

    def _allocation_sites(self) -> dict:
        from vmfuzz.harness.targets.sglang.allocation import load_sites
        self._sites = self._sites if getattr(self, "_sites", None) is not None else load_sites()
        return self._sites

    def allocating_backends(self) -> dict[str, str | None]:
        """Allocation sites driven here (None) or why not (a reason)."""
        return {name: None if not isinstance(site, str) else site
                for name, site in self._allocation_sites().items()}

    def allocation_call(self, backend: str, numbers):
        from vmfuzz.harness.targets.sglang.allocation import allocation_call
        return allocation_call(self, backend, numbers)

    def fa3_graph_buffers(self, numbers, names, page_size: int = 1) -> dict[str, tuple[int, ...]]:
        """The shapes FlashAttention's cuda-graph set-up asks for its metadata buffers (``fa3_graph``)."""
        from vmfuzz.harness.targets.sglang import fa3_graph
        return fa3_graph.graph_buffers(self, numbers, names, page_size)

    def fa3_graph_constants(self, numbers, names) -> dict[str, tuple | None]:
        """How that set-up filled each of them (``fa3_graph``)."""
        from vmfuzz.harness.targets.sglang import fa3_graph
        return fa3_graph.graph_constants(self, numbers, names)

    def triton_indptr_buffers(self, numbers) -> dict[str, tuple[int, ...]]:
        """The shapes of the per-request index pointers the Triton backend's ``__init__`` allocates."""
        from vmfuzz.harness.targets.sglang.allocation import triton_indptr_buffers
        return triton_indptr_buffers(self, numbers)

