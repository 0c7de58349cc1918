"""FlashInfer's cuda-graph verify plan, driven with stand-ins: what it is handed, and its packing.

``FlashInferIndicesUpdaterPrefill.call_begin_forward`` runs over a stand-in
updater and a cuda-graph prefill wrapper whose ``begin_forward`` is SGLang's
``fast_prefill_plan`` bound to it, with a real ``EagleVerifyInput``. So SGLang's
own code computes the query and KV indptrs and gathers the KV slots
(``generate_attn_arg_prefill``), the host copies, ``packed_lengths``/
``packed_indptr``, the host-side assert on the total, and launches
``pack_verify_mask_into`` (Triton; the interpreter on CPU) into the wrapper's
custom-mask buffer -- the redzoned buffer the property hands in.

The KV-index translator is ``kv_ids.GathersKvSlots``: each (request, token)
gets a distinct slot from a stand-in request-to-token table, written through a
shadow heap, so a gather of the wrong request's slots shows in the values and
one past its buffer in a redzone. FlashInfer's own ``plan`` is not run
(``_cached_module`` is a stand-in): it records the host arrays it is handed,
bound to the names of FlashInfer's plan parameters. The view then carries what
was handed on at each hop, upstream first (``PlanRead``): what
``generate_attn_arg_prefill`` returned, what ``call_begin_forward`` passed to
``fast_prefill_plan`` (by its parameter names), what that passed to ``plan``,
and the wrapper's device buffers it refreshed.
"""

from __future__ import annotations

import functools
import inspect

import torch

from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.readers import PackedView, PlanRead, plan_kv_span, pool_slots, stale_kv_indices
from vmfuzz.harness.targets.sglang.kv_ids import GathersKvSlots
from vmfuzz.harness.targets.sglang.readers import modules
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang.seams import bind, call_with
from vmfuzz.harness.targets.sglang.stand_in import StandIn

FLASHINFER = "srt/layers/attention/flashinfer_backend.py"
EAGLE_INFO = "srt/speculative/eagle_info.py"

#: What this module drives: (path under the sglang package, function, properties).
SURFACE = (
    (FLASHINFER, "FlashInferIndicesUpdaterPrefill.call_begin_forward", ("packed-mask",)),
    (FLASHINFER, "fast_prefill_plan", ("packed-mask",)),
    (EAGLE_INFO, "EagleVerifyInput.generate_attn_arg_prefill", ("packed-mask",)),
    ("kernels/ops/speculative/pack_verify_mask.py", "pack_verify_mask_into", ("packed-mask",)),
    ("kernels/ops/speculative/pack_verify_mask.py", "_pack_verify_mask_kernel", ("packed-mask",)),
)

#: who hands each array on
GENERATOR = "EagleVerifyInput.generate_attn_arg_prefill"
CALLER = "FlashInferIndicesUpdaterPrefill.call_begin_forward"
PLANNER = "fast_prefill_plan"

#: what generate_attn_arg_prefill returns, in the order its call site unpacks it
_GENERATED = ("kv_indices", "kv_indptr", "qo_indptr", "custom_mask")
#: fast_prefill_plan's parameters that carry the layout -> what each must hold
_PLAN_INPUTS = {"qo_indptr": "qo_indptr", "paged_kv_indptr": "kv_indptr", "paged_kv_indices": "kv_indices",
                "paged_kv_last_page_len": "kv_last_page_len", "custom_mask": "custom_mask",
                "qo_indptr_host": "qo_indptr", "kv_indptr_host": "kv_indptr", "kv_lens_host": "kv_lens"}
#: the wrapper's cuda-graph input buffers fast_prefill_plan refreshes -> what each must hold
_WRAPPER_BUFFERS = {"_qo_indptr_buf": "qo_indptr", "_paged_kv_indptr_buf": "kv_indptr",
                    "_paged_kv_indices_buf": "kv_indices", "_paged_kv_last_page_len_buf": "kv_last_page_len"}


def _flashinfer_plan(float_workspace_buffer, int_workspace_buffer, pin_memory_int_workspace_buffer, qo_indptr,
                     kv_indptr, kv_len_arr, total_num_rows, batch_size, num_qo_heads, num_kv_heads, page_size,
                     enable_cuda_graph, head_dim_qk, head_dim_vo, causal, window_left, *rest):
    """The parameters of FlashInfer's prefill ``plan`` (its positional ABI) up to the last that changes which
    cells a query row attends to (``window_left``): what each argument is. ``causal`` only bounds the work
    the scheduler plans (a tree's visible cells all lie inside a causal bound, and a custom mask decides
    the rest); the others (split sizes, colocated CTAs, a uniform query length) schedule the work too."""


#: FlashInfer plan's host arrays and counts -> what each must hold
_PLAN_ARGS = {"qo_indptr": "qo_indptr", "kv_indptr": "kv_indptr", "kv_len_arr": "kv_lens",
              "total_num_rows": "total_num_rows", "batch_size": "batch_size", "page_size": "page_size",
              "window_left": "window_left"}


#: the order a hop's arrays are judged in
_ORDER = ("batch_size", "total_num_rows", "page_size", "window_left", "qo_indptr", "kv_indptr", "kv_lens",
          "kv_last_page_len", "kv_indices", "custom_mask")


def _held(value) -> torch.Tensor:
    """A copy of what was handed on, as it was then (a later hop must not change what an earlier one handed)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return torch.tensor([int(value)])


class _Hops:
    """What each hop on the way to the plan handed on, recorded as the calls are made."""

    def __init__(self):
        self.generated: tuple | None = None
        self.planned: dict | None = None
        self.plan_args: dict | None = None
        self.mask_regrown: tuple[int, int] | None = None

    def record_generated(self, spec_info):
        fn = spec_info.generate_attn_arg_prefill

        def generate(*args, **kwargs):
            handed_in = spec_info.custom_mask
            out = fn(*args, **kwargs)
            self.generated = tuple(out)
            handed_on = self.generated[_GENERATED.index("custom_mask")] if len(self.generated) == 4 else None
            if isinstance(handed_in, torch.Tensor) and isinstance(handed_on, torch.Tensor) and (
                    handed_on.untyped_storage().data_ptr() != handed_in.untyped_storage().data_ptr()):
                self.mask_regrown = (handed_in.numel(), handed_on.numel())
            return out
        return generate

    def record_plan(self, *args, **kwargs):
        if kwargs:
            raise OutOfStep("_cached_module.plan", FLASHINFER, f"called with keywords {sorted(kwargs)}: "
                            "vmfuzz reads FlashInfer's plan arguments by position")
        got = bind(_flashinfer_plan, "_cached_module.plan", FLASHINFER, *args).arguments
        self.plan_args = {name: _held(got[name]) for name in _PLAN_ARGS}

    def reads(self, wrapper, finished: bool = True) -> list[PlanRead]:
        """Each hop's arrays; unless ``finished``, only those handed on before a hop raised (the wrapper's
        buffers are refreshed last, so a raise leaves them as they were)."""
        if finished and (self.planned is None or self.plan_args is None):
            raise OutOfStep(PLANNER, FLASHINFER, "call_begin_forward never reached FlashInfer's plan: nothing "
                            "it was handed can be judged")
        out = []
        if self.generated is not None:
            out += [PlanRead(GENERATOR, name, self._generated_as(name, value), _held(value))
                    for name, value in zip(_GENERATED, self.generated) if isinstance(value, torch.Tensor)]
        out += [PlanRead(CALLER, name, _PLAN_INPUTS[name], held)
                for name, (held, _) in (self.planned or {}).items()]
        out += [PlanRead(PLANNER, f"plan({name})", _PLAN_ARGS[name], value)
                for name, value in (self.plan_args or {}).items()]
        if finished:
            out += [PlanRead(PLANNER, name, quantity, _held(getattr(wrapper, name)))
                    for name, quantity in _WRAPPER_BUFFERS.items()]
        # Within a hop, the indptrs before the arrays they index: a wrong indptr misplaces the rest.
        hop = {GENERATOR: 0, CALLER: 1, PLANNER: 2}
        return sorted(out, key=lambda r: (hop[r.writer], _ORDER.index(r.quantity)))

    def _generated_as(self, name: str, value) -> str:
        """What a returned array is: the fast_prefill_plan parameter it was handed to as it is, else its place."""
        for param, (_, passed) in (self.planned or {}).items():
            if passed is value:
                return _PLAN_INPUTS[param]
        return name


class _RecordingPlan(functools.partial):
    """``fast_prefill_plan`` bound to the wrapper, as SGLang's capture installs it (``.func`` is SGLang's
    own), recording each layout argument by ``fast_prefill_plan``'s own parameter names."""

    def __call__(self, *args, **kwargs):
        got = bind(self.func, PLANNER, FLASHINFER, *self.args, *args, **kwargs).arguments
        missing = [n for n in _PLAN_INPUTS if n not in got and n != "custom_mask"]
        if missing:
            raise OutOfStep(PLANNER, FLASHINFER, f"the call names no {', '.join(missing)}")
        self.keywords["_hops"].planned = {n: (_held(got[n]), got[n]) for n in _PLAN_INPUTS
                                          if isinstance(got.get(n), torch.Tensor)}
        own = {k: v for k, v in self.keywords.items() if k != "_hops"}
        return self.func(*self.args, *args, **{**own, **kwargs})


def _graph_wrapper(m, bs: int, kv_tokens: int, buffer: torch.Tensor, dev, heap: ShadowHeap, hops: _Hops):
    """A cuda-graph prefill wrapper for ``bs`` requests: the state ``fast_prefill_plan`` reads and refreshes."""
    kv_indices = heap.alloc("_paged_kv_indices_buf", max(1, kv_tokens), torch.int32, redzone_cells=64)
    kv_indices.copy_(stale_kv_indices(kv_indices.numel(), dev))
    wrapper = StandIn(
        "BatchPrefillWithPagedKVCacheWrapper", FLASHINFER,
        device=dev, is_cuda_graph_enabled=True, _backend="fa2",
        _cached_module=StandIn("FlashInfer's cached module", FLASHINFER, plan=hops.record_plan),
        _max_total_num_rows=None,
        _qo_indptr_buf=torch.full((bs + 1,), -7, dtype=torch.int32, device=dev),
        _paged_kv_indptr_buf=torch.full((bs + 1,), -7, dtype=torch.int32, device=dev),
        _paged_kv_last_page_len_buf=torch.full((bs,), -7, dtype=torch.int32, device=dev),
        _paged_kv_indices_buf=kv_indices,
        _mask_indptr_buf=torch.zeros(bs + 1, dtype=torch.int32, device=dev),
        _custom_mask_buf=buffer,
        _float_workspace_buffer=None, _int_workspace_buffer=None, _pin_memory_int_workspace_buffer=None,
    )
    wrapper.begin_forward = _RecordingPlan(m.flashinfer_backend.fast_prefill_plan, wrapper, _hops=hops)
    return wrapper


def pack_mask(config: Config, batch: Batch, step_mask: torch.Tensor, buffer: torch.Tensor) -> PackedView:
    """FlashInfer's cuda-graph verify plan over ``step_mask``, packing into ``buffer``."""
    probed()
    m = modules()
    dev, d, bs = buffer.device, config.d, batch.bs
    seq_lens = torch.tensor(batch.seq_lens, dtype=torch.long, device=dev)
    seq_sum = int(sum(batch.seq_lens))
    spec_info = m.eagle_info.EagleVerifyInput(
        draft_token=None, custom_mask=step_mask, positions=None, retrieve_index=None, retrieve_next_token=None,
        retrieve_next_sibling=None, retrieve_cum_len=None, spec_steps=config.spec_steps, topk=config.topk,
        draft_token_num=d, capture_hidden_mode=m.forward_info.CaptureHiddenMode.FULL, seq_lens_sum=seq_sum,
        seq_lens_cpu=seq_lens.cpu())
    hops, heap = _Hops(), ShadowHeap(dev)
    spec_info.generate_attn_arg_prefill = hops.record_generated(spec_info)
    wrapper = _graph_wrapper(m, bs, seq_sum + d * bs, buffer, dev, heap, hops)
    # Each (request, token) its own slot, room for its prefix and draft tokens; stray writes land in redzones.
    translator = GathersKvSlots(heap, plan_kv_span(config))
    updater = StandIn(
        "FlashInferIndicesUpdaterPrefill", FLASHINFER,
        attn_backend=StandIn("FlashInferAttnBackend", FLASHINFER, kv_index_translator=translator,
                             dq_paged_kernel_lens=None),
        kv_last_page_len=torch.ones(max(bs, config.max_bs), dtype=torch.int32, device=dev), num_qo_heads=1,
        num_kv_heads=1, head_dim=8, q_data_type=torch.float16, data_type=torch.float16, _swa_kv_pool=None)
    try:
        # By SGLang's own parameter names; ``plan`` only where this SGLang takes it.
        call_with(m.flashinfer_backend.FlashInferIndicesUpdaterPrefill.call_begin_forward, CALLER, FLASHINFER,
                  updater, wrapper_ragged=None, wrapper_paged=wrapper,
                  req_pool_indices=torch.tensor(pool_slots(bs), dtype=torch.long, device=dev),
                  paged_kernel_lens=seq_lens, paged_kernel_lens_sum=seq_sum, seq_lens=seq_lens, prefix_lens=None,
                  kv_start_idx=None, kv_indptr=torch.zeros(bs + 1, dtype=torch.int32, device=dev),
                  qo_indptr=torch.zeros(bs + 1, dtype=torch.int32, device=dev), use_ragged=False,
                  spec_info=spec_info, seq_lens_cpu=seq_lens.cpu(), plan=None)
    except (AssertionError, OutOfStep):
        raise  # the host-side check's refusal is judged as one; vmfuzz out of step is exit 3
    except Exception as exc:
        if hops.generated is None:
            raise  # nothing was handed on yet
        raised = exc
    else:
        raised = None
    return PackedView(wrapper._custom_mask_buf, wrapper._mask_indptr_buf, plan=hops.reads(wrapper, raised is None),
                      plan_overruns=heap.check(), plan_gatherer=GENERATOR if hops.generated is not None else CALLER,
                      mask_regrown=hops.mask_regrown, raised=raised)


#: The switch a server sets to plan EAGLE's verify on the host (and so pack its mask in SGLang's own
#: code): the deployment packed-mask models. Set only while the capture runs, then put back.
HOST_PLAN_SWITCH = "SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN"
PACK_MODULE = "sglang.kernels.ops.speculative.pack_verify_mask"


class _StandInWrapper:
    """Stands for FlashInfer's cuda-graph prefill wrapper (not importable without CUDA): made by SGLang's
    own wrapper factory, it keeps what it was made with; its ``begin_forward`` is FlashInfer's own
    until SGLang's capture swaps it, which is what the probe looks for."""

    made: list = []

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        type(self).made.append(self)

    def begin_forward(self, *args, **kwargs):
        """FlashInfer's own plan: the capture's first plan() goes through the updater stand-in instead."""


def _capture_attributes(bs: int, dev) -> dict:
    """What a FlashInfer backend's ``__init__`` and cuda-graph set-up give it, for a server with one paged
    full-attention wrapper on the fa2 prefill backend and a bf16 KV cache (where SGLang plans on the host)."""
    tokens = 64
    return dict(
        device=dev, num_wrappers=1, prefill_backend="fa2", dispatch_reason=None, use_sliding_window_kv_pool=False,
        flashinfer_kv_cache_dtype=torch.bfloat16, workspace_buffer=torch.empty(8, dtype=torch.uint8, device=dev),
        cuda_graph_custom_mask=torch.zeros(tokens * tokens, dtype=torch.uint8, device=dev),
        cuda_graph_qk_indptr=[torch.zeros(bs + 1, dtype=torch.int32, device=dev)],
        cuda_graph_qo_indptr=[torch.zeros(bs + 1, dtype=torch.int32, device=dev)],
        kv_indptr=[torch.zeros(bs + 1, dtype=torch.int32, device=dev)],
        cuda_graph_kv_indices=[torch.zeros(tokens, dtype=torch.int32, device=dev)],
        kv_last_page_len=torch.ones(bs, dtype=torch.int32, device=dev),
        prefill_cuda_graph_metadata={}, decode_cuda_graph_metadata={}, draft_extend_cuda_graph_metadata={},
        full_cg_prefill_wrappers=None,
        # the first plan() of a capture: FlashInfer's own, not the fast plan; it plans nothing here
        indices_updater_prefill=StandIn("FlashInferIndicesUpdaterPrefill", FLASHINFER,
                                        update=lambda *args, **kwargs: None))


def _capture_installs_fast_plan(m, topk: int) -> bool:
    """Whether SGLang's cuda-graph capture of an EAGLE TARGET_VERIFY batch (``topk``) swaps a prefill
    wrapper's plan for ``fast_prefill_plan``, found by running the capture and looking at the wrappers."""
    import os

    from vmfuzz.harness.targets.sglang.binding import bound
    from vmfuzz.harness.targets.sglang.seams import unset_by_harness
    mod = m.flashinfer_backend
    cls = mod.FlashInferAttnBackend
    bs, d, dev = 2, 3, torch.device("cpu")
    seq_lens = torch.tensor([4, 5], dtype=torch.long)
    spec_info = m.eagle_info.EagleVerifyInput(
        draft_token=None, custom_mask=torch.ones(int(seq_lens.sum()) * d + d * d * bs, dtype=torch.bool),
        positions=None, retrieve_index=None, retrieve_next_token=None, retrieve_next_sibling=None,
        retrieve_cum_len=None, spec_steps=2, topk=topk, draft_token_num=d,
        capture_hidden_mode=m.forward_info.CaptureHiddenMode.FULL, seq_lens_sum=int(seq_lens.sum()),
        seq_lens_cpu=seq_lens.clone())
    batch = StandIn(
        "ForwardBatch", FLASHINFER,
        batch_size=bs, req_pool_indices=torch.arange(bs), seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(),
        seq_lens_sum=int(seq_lens.sum()), encoder_lens=None, forward_mode=m.forward_info.ForwardMode.TARGET_VERIFY,
        spec_info=spec_info, positions=torch.zeros(bs * d, dtype=torch.long), kv_loc_plan=None, out_cache_loc=None)
    backend = cls.__new__(cls)
    for attr, value in _capture_attributes(bs, dev).items():
        object.__setattr__(backend, attr, value)
    _StandInWrapper.made = []
    saved = os.environ.get(HOST_PLAN_SWITCH)
    os.environ[HOST_PLAN_SWITCH] = "true"
    try:
        with bound((mod, "BatchPrefillWithPagedKVCacheWrapper", _StandInWrapper, True)):
            call_with(cls.init_forward_metadata_out_graph, "FlashInferAttnBackend.init_forward_metadata_out_graph",
                      FLASHINFER, backend, batch, in_capture=True)
    except AttributeError as exc:
        unset_by_harness(exc, backend, cls, "FlashInferAttnBackend stand-in", FLASHINFER)
        raise
    finally:
        if saved is None:
            os.environ.pop(HOST_PLAN_SWITCH, None)
        else:
            os.environ[HOST_PLAN_SWITCH] = saved
    made = _StandInWrapper.made
    if not made:
        raise OutOfStep("FlashInferAttnBackend.init_forward_metadata_out_graph", FLASHINFER,
                        "its TARGET_VERIFY capture made no prefill wrapper through "
                        "BatchPrefillWithPagedKVCacheWrapper, where vmfuzz looks for the plan it installs")
    fast = mod.fast_prefill_plan
    return any(getattr(w.begin_forward, "func", None) is fast or getattr(w.begin_forward, "__func__", None) is fast
               for w in made)


#: the probe's answer, or what it raised (re-raised inside packed-mask's check), once per process
_PROBED: dict = {}


def packing_not_driven() -> str | None:
    """Why packed-mask cannot be driven on this SGLang (None: it can), found by running its code.

    SGLang packs an EAGLE verify mask itself only where its cuda-graph capture
    installs ``fast_prefill_plan`` on a TARGET_VERIFY wrapper; elsewhere the
    packing happens inside FlashInfer's own plan, which is not SGLang's code.
    So the capture is run (``_capture_installs_fast_plan``) and its wrappers are
    looked at, wherever the code that swaps them now lives. A capture that
    raises, or a module that does not load, is not a reason: it is left to
    packed-mask's check, which meets it (``probed``) as a finding or out of step.
    """
    from vmfuzz.harness.targets.sglang.imports import NotInRelease, sglang_module
    try:
        sglang_module(PACK_MODULE)
        m = modules()
    except NotInRelease as exc:
        return f"this SGLang packs no verify mask in its own code ({exc})"
    except Exception:  # noqa: BLE001 - the check meets it again (imports are decided once)
        return None
    if not hasattr(m.flashinfer_backend, "fast_prefill_plan"):
        return f"{FLASHINFER} has no fast_prefill_plan: its verify mask is packed inside FlashInfer's own plan"
    if "installed" not in _PROBED and "raised" not in _PROBED:
        try:
            _PROBED["installed"] = any(_capture_installs_fast_plan(m, topk) for topk in (1, 2))
        except Exception as exc:  # noqa: BLE001 - kept for the check, which raises it where it is judged
            _PROBED["raised"] = exc
            return None
    if "raised" in _PROBED or _PROBED["installed"]:
        return None
    return (f"{FLASHINFER}'s cuda-graph capture installs fast_prefill_plan on no EAGLE target-verify wrapper: "
            "its verify mask is packed inside FlashInfer's own plan, not SGLang's code")


def probed() -> None:
    """Raise what the capture probe raised, if it did: packed-mask then could not learn whether SGLang packs."""
    raised = _PROBED.get("raised")
    if raised is not None:
        raise raised
