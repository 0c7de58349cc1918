"""FlashInfer's multi-step draft backend, handed the view a draft-decode replay hands its backend.

A FlashInfer draft server runs the same ``EAGLEDraftCudaGraphRunner``; what differs is
its backend, ``FlashInferMultiStepDraftBackend``, whose out-of-graph metadata fills every
step's ``kv_indices`` row and ``kv_indptr`` with SGLang's draft kernel and then hands
each per-step FlashInfer backend its step's slices and the host copy of the step's
indptr (``global_override_indptr_cpu``), from which FlashInfer plans. With
``SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR`` on, that host indptr is computed from the
host lengths (``_build_draft_indptr_host``) instead of read back from the device.

Driven here: the backend by its own ``__init__`` and ``init_cuda_graph_state`` over the
draft session's model runner (its ``req_to_token`` names each cell's row and column;
the static pool's reads pass through), then ``init_forward_metadata_out_graph`` on a
replay's recorded view, with the host-indptr option off and on. The per-step FlashInfer
backends are recording stand-ins (FlashInfer's planner is a CUDA library): each records
what it is handed. Its ``kv_indices`` graph buffer is adopted as a redzoned buffer;
``device="cuda"`` buffers are made on the CPU.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.targets.sglang.binding import bound

FLASHINFER = "srt/layers/attention/flashinfer_backend.py"
HOST_INDPTR = "SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR"
#: What this module drives, for ``vmfuzz surface`` and the gate.
SURFACE: tuple = tuple((FLASHINFER, fn, ("capture-replay-agreement",)) for fn in (
    "FlashInferMultiStepDraftBackend.__init__", "FlashInferMultiStepDraftBackend.common_template",
    "FlashInferMultiStepDraftBackend.init_cuda_graph_state",
    "FlashInferMultiStepDraftBackend.init_forward_metadata_out_graph", "_build_draft_indptr_host"))
#: What it reaches but does not drive, and why.
NOT_DRIVEN: tuple = (
    (FLASHINFER, "FlashInferMultiStepDraftBackend.init_forward_metadata",
     "its eager ids buffer is made on device='cuda' per call; the replay's out-of-graph path, driven, runs the "
     "same template over the graph buffer"),
)


@dataclass
class StepPlan:
    """What one draft step's FlashInfer backend was handed: the device indptr and ids, the host indptr."""

    step: int
    indptr: list[int]
    indices: list[int]
    host_indptr: list[int] | None


@dataclass
class FlashInferDraft:
    """Every step's plan inputs, for one view, with the host-indptr option as ``host_indptr``."""

    host_indptr: bool
    steps: list[StepPlan] = field(default_factory=list)
    violations: list = field(default_factory=list)


class _CpuTorch:
    """``torch`` as the backend's set-up sees it on a CUDA host, its ``device="cuda"`` buffers made on the CPU."""

    def __getattr__(self, name):
        real = getattr(torch, name)
        if name not in ("zeros", "empty", "full", "ones"):
            return real

        def on_cpu(*args, **kwargs):
            if str(kwargs.get("device", "cpu")).startswith("cuda"):
                kwargs["device"] = "cpu"
            return real(*args, **kwargs)
        return on_cpu


def _step_recorder(module, log: dict):
    """The per-step ``FlashInferAttnBackend``, standing in: it records each out-of-graph metadata call."""

    class StepBackend:
        def __init__(self, model_runner, skip_prefill=False, kv_indptr_buf=None, kv_last_page_len_buf=None, **_):
            self.max_context_len = model_runner.model_config.context_len
            self.step = len(log.setdefault("backends", []))
            log["backends"].append(self)

        def init_cuda_graph_state(self, *args, **kwargs):
            pass

        def init_forward_metadata_out_graph(self, fb, in_capture=False):
            spec = fb.spec_info
            host = module.global_override_indptr_cpu
            log.setdefault("plans", []).append(StepPlan(
                self.step, [int(v) for v in spec.kv_indptr], [int(v) for v in spec.kv_indices],
                None if host is None else [int(v) for v in host]))
    return StepBackend


def plans(module, model_runner, shape, max_bs: int, view) -> list[FlashInferDraft]:
    """The FlashInfer draft backend's per-step plan inputs for ``view`` (a replay's view, handed as the runner
    hands it), host-indptr option off, then on."""
    heap = ShadowHeap()
    try:
        return _plans(module, model_runner, shape, max_bs, view, heap)
    finally:
        heap.release()


def _plans(module, model_runner, shape, max_bs: int, view, heap: ShadowHeap) -> list[FlashInferDraft]:
    log: dict = {}
    # one GPU, no attention-TP gather: the graph bucket list needs no alignment (backend_init's answer too);
    # the size is handed alone, or after the server_args (0.5.17-0.5.20)
    with bound((module, "FlashInferAttnBackend", _step_recorder(module, log)), (module, "torch", _CpuTorch()),
               (module, "get_cuda_graph_max_batch_size", lambda *args: args[-1])):
        backend = module.FlashInferMultiStepDraftBackend(model_runner, shape.topk, shape.steps)
        backend.init_cuda_graph_state(max_bs, max_bs * shape.topk)
    backend.cuda_graph_kv_indices = heap.adopt("flashinfer draft kv_indices", backend.cuda_graph_kv_indices, 512)
    option = getattr(module.envs, HOST_INDPTR, None)  # an SGLang without the option plans from the device only
    out = []
    for host in (False, True) if option is not None else (False,):
        log["plans"] = []
        with option.override(host) if option is not None else contextlib.nullcontext():
            backend.init_forward_metadata_out_graph(SimpleNamespace(**vars(view)))
        out.append(FlashInferDraft(host, list(log["plans"]), heap.check()))
    return out
