"""SGLang's multi-layer EAGLE draft-extend runners, captured and replayed on the CPU.

``MultiLayerEagleMultiStepDraftExtendCudaGraphRunner`` is made by its own
``__init__`` over the stand-in draft worker (``draft_worker``): one per-step
``MultiLayerEagleDraftExtendCudaGraphRunner`` per draft step, each over its
own Triton draft-extend backend, one shared buffer set (``_allocate_buffers``,
each tensor then a redzoned static buffer of the session), every step's graph
captured at every captured bs in reverse step order. A live batch then runs
as the multi-layer worker's ``_draft_extend_for_decode`` runs it: ``prepare``
fills the shared buffers once (``fill_draft_extend_prepare_buffers_triton``,
or the ``_native`` torch form an NPU build binds: ``prepare_kind``), and each
step ``replay(step)``s its graph, the worker rotating the window's token ids
between steps (``rotate_input_ids``).

The eager reference (``eager``) is the worker's eager loop for the same
batch: per step the step's backend's eager DRAFT_EXTEND_V2 metadata, the
forward over every token with the ``select_index`` rows pruned, the chain's
hidden states handed on and the ids rotated.
"""

from __future__ import annotations


import torch

from vmfuzz.harness.guard.graph import GraphSpace
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.draft_extend_model import DraftExtendModel
from vmfuzz.harness.targets.sglang.draft_extend_runner import live_batch
from vmfuzz.harness.targets.sglang.draft_worker import (DraftServer, StepResult, adopt, backend_rows, bindings,
                                                        draft_worker, extend_backend, viewing)
from vmfuzz.harness.targets.sglang.graph_lookups import attention_context, module_set

RUNNER_FILE = "srt/speculative/multi_layer_eagle_draft_extend_cuda_graph_runner.py"
KERNEL_FILE = "kernels/ops/speculative/multi_layer_eagle.py"
_PROPS = ("graph-replay-equivalence", "padding-inert", "capture-replay-agreement")
_STEP = "MultiLayerEagleDraftExtendCudaGraphRunner."
_MULTI = "MultiLayerEagleMultiStepDraftExtendCudaGraphRunner."

#: What this module drives: (path under the sglang package, function, properties).
SURFACE = tuple((RUNNER_FILE, fn, _PROPS) for fn in (
    *(_STEP + f for f in ("__init__", "init_buffers_and_capture", "_replay_graph", "_make_graph_key",
                          "can_run_graph", "get_forward_batch", "_postprocess_forward_batch",
                          "_select_step_logits", "_compute_topk", "_run_step_body", "capture_one_shape",
                          "replay")),
    *(_MULTI + f for f in ("__init__", "_create_runner", "_capture_context", "_create_runners",
                           "_cuda_graph_disabled", "_init_and_capture", "_vocab_size", "_allocate_buffers",
                           "_stage_metadata", "prepare", "replay", "get_runner", "can_run_graph")),
)) + tuple((KERNEL_FILE, fn, _PROPS) for fn in (
    "fill_draft_extend_prepare_buffers_kernel", "fill_draft_extend_prepare_buffers_triton",
    "fill_draft_extend_prepare_buffers_native", "rotate_input_ids", "rotate_input_ids_kernel"))

_ONE = "OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner."
#: why the single-graph variant is not built: the worker picks it (SGLANG_ENABLE_SINGLE_CG_DRAFT, on by default)
#: only where every step's backend rebuilds or stages its draft-extend metadata in graph; Triton does neither
_ONE_WHY = ("the single-graph variant: the worker builds it only over draft-extend backends that rebuild or stage "
            "their metadata in graph (FA3 in 0.5.23); over Triton, driven here, a server runs the per-step graphs")
#: What it does not reach, and why (docs/generated/not-driven.md).
NOT_DRIVEN = tuple((RUNNER_FILE, fn, why) for fn, why in (
    (_ONE + "_init_and_capture", _ONE_WHY),
    (_ONE + "_capture_one_graph", _ONE_WHY),
    (_ONE + "replay", _ONE_WHY),
    (_MULTI + "stage_shared_reads", "metadata staging needs a backend that stages it (Triton does not) and the "
                                    "target graph's in-graph read fence"),
    (_MULTI + "clone_draft_probs", "rejection sampling's in-graph proposal belongs to the single-graph variant"),
    (_STEP + "_sample_draft_proposal", "rejection sampling's in-graph proposal belongs to the single-graph variant"),
))

#: prepare()'s kernel, by the name of the build that binds it
PREPARE_KINDS = ("triton", "native")


modules = module_set(dict(
    runner="sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner",
    utils="sglang.srt.speculative.multi_layer_eagle_utils",
    kernels="sglang.kernels.ops.speculative.multi_layer_eagle",
    forward_context="sglang.srt.model_executor.forward_context"))


def _bindings(server: DraftServer, prepare_kind: str) -> list[tuple]:
    m = modules()
    out = bindings(server, [m.runner])
    fill = getattr(m.utils, f"fill_draft_extend_prepare_buffers_{prepare_kind}")
    return out + [(m.runner, "fill_draft_extend_prepare_buffers", fill),
                  (m.runner, "get_available_gpu_memory", lambda *a, **k: 0.0)]


def build(config: Config, capture_bs: list[int], heap: ShadowHeap | None = None,
          prepare_kind: str = "triton") -> DraftServer:
    """The multi-step runner for ``config``'s server (topk 1), every step captured at every bs."""
    m = modules()
    space = GraphSpace(heap or ShadowHeap())
    model = DraftExtendModel(space)
    server = DraftServer(config, space, model, sorted(set(capture_bs)))
    server.prepare_kind = prepare_kind
    server.backends = [extend_backend(server) for _ in range(config.spec_steps)]
    worker = draft_worker(server, server.backends)
    cls = m.runner.MultiLayerEagleMultiStepDraftExtendCudaGraphRunner
    real_allocate = cls._allocate_buffers

    def allocate(self):
        buffers = real_allocate(self)
        adopt(server, buffers)  # the buffer set every step's graphs read: redzoned statics
        return buffers
    with bound(*_bindings(server, prepare_kind), (cls, "_allocate_buffers", allocate)):
        server.runner = cls(worker)
    space.settle()
    server.width = server.runner.captured_req_width
    return server


def can_run(server: DraftServer, fb) -> bool:
    with bound(*_bindings(server, server.prepare_kind)):
        return bool(server.runner.can_run_graph(fb))


def _rotate(ids, start, lens, topk_index, select):
    modules().utils.rotate_input_ids(ids, start, lens, topk_index, select)


def replay(server: DraftServer, fb) -> list[StepResult]:
    """``prepare`` the batch, then each step's ``replay``, rotating the window's ids between steps."""
    runner, steps = server.runner, server.config.spec_steps
    views: list = []
    out = []
    with bound(*_bindings(server, server.prepare_kind), *(viewing(b, views) for b in server.backends)):
        runner.prepare(fb)
        buffers = runner.buffers
        for step in range(steps):
            n0, v0 = len(server.model.calls), len(views)
            logits, _, topk_index = runner.replay(step)
            calls = server.model.calls[n0:]
            if len(calls) != 1:
                raise OutOfStep(_MULTI + "replay", RUNNER_FILE, f"step {step}'s replay ran the model "
                                f"{len(calls)} times (its graph body runs it once)")
            view, reads = views[-1] if len(views) > v0 else (None, frozenset())
            qo, kv = backend_rows(server.backends[step], runner.bs)
            out.append(StepResult(logits.next_token_logits.clone(), logits.hidden_states.clone(), calls[0],
                                  runner.bs, view, reads, qo, kv, topk_index.clone()))
            if step < steps - 1:
                _rotate(buffers.input_ids[:runner.raw_num_tokens], buffers.extend_start_loc[:runner.raw_bs],
                        buffers.extend_seq_lens[:runner.raw_bs], topk_index, buffers.select_index[:runner.raw_bs])
    return out


def eager(server: DraftServer, fb, select_index) -> list[StepResult]:
    """The multi-layer worker's eager loop over the same batch (its ``can_run_graph`` said no)."""
    m = modules()
    fb.spec_info.select_index = select_index
    out = []
    with bound(*_bindings(server, server.prepare_kind)):
        for step in range(server.config.spec_steps):
            backend = extend_backend(server, graphs=False)
            backend.init_forward_metadata(fb)
            with attention_context(backend, fb):
                ret = server.model.forward(fb.input_ids, fb.positions, fb)
            _, topk_index = m.runner.fast_topk(torch.softmax(ret.next_token_logits, dim=-1), server.config.topk,
                                               dim=-1)
            qo, kv = backend_rows(backend, fb.batch_size)
            out.append(StepResult(ret.next_token_logits.clone(), ret.hidden_states.clone(), server.model.calls[-1],
                                  fb.batch_size, qo_indptr=qo, kv_lens=kv, topk_index=topk_index.clone()))
            if step < server.config.spec_steps - 1:
                fb.spec_info.hidden_states = ret.hidden_states
                _rotate(fb.input_ids, fb.extend_start_loc, fb.extend_seq_lens, topk_index, select_index)
    return out


def multi_layer_batch(server: DraftServer, batch: Batch, ids, loc, hidden, accept_lens):
    """The live batch the multi-layer worker hands ``prepare`` (its window is d wide: no front rows)."""
    fb = live_batch(server, batch, ids, loc, hidden, accept_lens)
    fb.spec_info.num_tokens_per_req = server.width
    fb.spec_info.num_tokens_for_logprob_per_req = 1
    return fb
