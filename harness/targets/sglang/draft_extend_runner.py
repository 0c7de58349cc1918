"""SGLang's ``EAGLEDraftExtendCudaGraphRunner`` (DRAFT_EXTEND_V2), captured and replayed on the CPU.

The runner is made by its own ``__init__`` over a stand-in EAGLE draft worker
(``draft_worker``): SGLang sizes and fills its static buffers, picks its
captured batch sizes, sets up the Triton backend's graph state and captures
one graph per captured bs through its own ``FullCudaGraphBackend``, whose
``torch.cuda`` is the graph stand-in. Where the runner hands its buffers to
the process-wide pool (``share_buffers``) each becomes a redzoned static
buffer of the session's ``GraphSpace``, shared by (name, size, dtype) within
the session as SGLang shares them within a process. Then ``execute(live,
select_index)`` replays a live draft-extend batch as the EAGLE v2 worker's
``_draft_extend_for_decode`` does.

The model is ``draft_extend_model.DraftExtendModel`` (SGLang's own logits
pruning over a deterministic stand-in forward). The eager reference
(``eager``) is the worker's eager path: the Triton backend's eager
DRAFT_EXTEND_V2 metadata, the full-width forward, then the rows gathered at
``select_index``.

Where the case's draft model has window layers (``window``, the same choice
as its draft-decode model's) the backend has a sliding window: a replay
refills its window rail (the slots of each request's last ``window`` prefix
tokens and where that window starts), which the model's window layers read,
as they read the eager path's own rail.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import torch

from vmfuzz.harness.guard.graph import GraphSpace
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.draft_extend_model import DraftExtendModel
from vmfuzz.harness.targets.sglang.draft_worker import (DraftServer, StepResult, backend_rows, bindings, draft_worker,
                                                        extend_backend, viewing)
from vmfuzz.harness.targets.sglang.graph_lookups import attention_context, module_set

RUNNER_FILE = "srt/speculative/eagle_draft_extend_cuda_graph_runner.py"
_PROPS = ("graph-replay-equivalence", "padding-inert", "capture-replay-agreement")

#: What this module drives: (path under the sglang package, function, properties).
SURFACE = tuple((RUNNER_FILE, fn, _PROPS) for fn in (
    "resolve_draft_extend_seq_len_fill_value", "EAGLEDraftExtendCudaGraphRunner.__init__",
    "EAGLEDraftExtendCudaGraphRunner._replay_graph", "EAGLEDraftExtendCudaGraphRunner._cache_loc_dtype",
    "EAGLEDraftExtendCudaGraphRunner._make_graph_key", "EAGLEDraftExtendCudaGraphRunner.can_run_graph",
    "EAGLEDraftExtendCudaGraphRunner.capture_one_shape", "EAGLEDraftExtendCudaGraphRunner.execute",
)) + (
    ("srt/layers/attention/triton_backend.py", "TritonAttnBackend._update_draft_extend_buffers", _PROPS),
    ("srt/layers/logits_processor.py", "LogitsMetadata.from_forward_batch", _PROPS),
    ("srt/layers/logits_processor.py", "LogitsProcessor._get_pruned_states", _PROPS),
    ("srt/model_executor/input_buffers.py", "ForwardInputBuffers.share_buffers", _PROPS),
)


modules = module_set(dict(
    runner="sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
    forward_info="sglang.srt.model_executor.forward_batch_info",
    forward_context="sglang.srt.model_executor.forward_context",
    eagle_info="sglang.srt.speculative.eagle_info"))


def build(config: Config, capture_bs: list[int], heap: ShadowHeap | None = None, window: int = 0) -> DraftServer:
    """An ``EAGLEDraftExtendCudaGraphRunner`` for ``config``'s server, made by its own ``__init__``
    (which captures a graph at every bs of ``capture_bs``). ``window``: the draft model has window
    layers of that many tokens, which read the backend's window rail (its graph refill)."""
    m = modules()
    space = GraphSpace(heap or ShadowHeap())
    model = DraftExtendModel(space)
    server = DraftServer(config, space, model, sorted(set(capture_bs)), window=window)
    backend = extend_backend(server)
    worker = draft_worker(server, [backend])
    with bound(*bindings(server, [m.runner])):
        n0 = len(model.calls)
        server.runner = m.runner.EAGLEDraftExtendCudaGraphRunner(worker)
    space.settle()
    server.backends = [backend]
    calls = model.calls[n0:]
    server.captures = {bs: calls[3 * i + 2] for i, bs in enumerate(reversed(server.runner.capture_bs))}
    return server


def live_batch(server: DraftServer, batch: Batch, ids, loc, hidden, accept_lens):
    """The live DRAFT_EXTEND_V2 ForwardBatch ``prepare_for_draft_extend`` makes for ``batch`` after a
    verify that accepted ``accept_lens``: each request's d-token window (ids, KV slots ``loc``, the
    target's ``hidden`` rows) over its prefix, the forward's lengths the post-write ones. The tensors a
    prepare reads by row are cut from longer ones whose rest is poison (``past_end``)."""
    m = modules()
    d, bs, c = server.config.d, batch.bs, server.config
    prefix = torch.tensor(batch.seq_lens, dtype=torch.long)
    seq_lens = past_end(prefix + d, c.max_context_len + d, c)
    positions = past_end(torch.cat([torch.arange(d, dtype=torch.long) + s for s in batch.seq_lens]),
                         c.max_context_len + d, c)
    accept = torch.tensor(accept_lens, dtype=torch.int32)
    spec = m.eagle_info.EagleDraftExtendInput(
        hidden_states=hidden.clone(), num_correct_drafts=past_end(accept - 1, d - 1, c),
        num_accept_tokens=past_end(accept.clone(), d, c), num_tokens_per_req=d, num_tokens_for_logprob_per_req=d)
    fi = m.forward_info
    rows = request_rows(bs)
    return fi.ForwardBatch(
        forward_mode=fi.ForwardMode.DRAFT_EXTEND_V2, batch_size=bs, input_ids=past_end(ids.clone(), 12, c),
        req_pool_indices=past_end(torch.tensor(rows, dtype=torch.long), rows[0], c), seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.clone(), seq_lens_sum=int(seq_lens.sum()), out_cache_loc=past_end(loc.clone(), loc, c),
        positions=positions, extend_seq_lens=torch.full((bs,), d, dtype=torch.int32),
        extend_prefix_lens=prefix.to(torch.int32), extend_seq_lens_cpu=[d] * bs,
        extend_prefix_lens_cpu=list(batch.seq_lens), extend_num_tokens=bs * d,
        extend_start_loc=torch.arange(0, bs * d, d, dtype=torch.int32), return_logprob=False,
        spec_algorithm=server.spec_algorithm, spec_info=spec, capture_hidden_mode=fi.CaptureHiddenMode.FULL)


def past_end(values: torch.Tensor, poison, config: Config) -> torch.Tensor:
    """``values``, as the first cells of a tensor ``max_bs * d`` cells longer whose rest holds ``poison``
    (a value, or a tensor repeated): a live request's pool row, a long length, the batch's own KV slots.

    A server's live batch holds its bs rows and, past them, whatever the allocator left: a prepare
    kernel whose mask lets a padded row read its source (``i < raw_bs`` lost) reads that. Here it reads
    poison, the same in every run, so padding-inert sees a padded request take a live request's pool
    row and a long length, or a padded token a live KV slot, where unguarded memory would make the
    catch a matter of chance."""
    n, extra = values.shape[0], config.max_bs * config.d
    whole = torch.empty((n + extra,), dtype=values.dtype)
    whole[:n] = values
    tail = torch.as_tensor(poison, dtype=values.dtype).reshape(-1)
    whole[n:] = tail.repeat(extra // tail.numel() + 1)[:extra]
    return whole[:n]


def request_rows(bs: int) -> list[int]:
    """Each live request's row of req_to_token: last first, never row 0 (the reserved zero row padding
    points at), so a reader that takes a request's place in the batch for its row reads another's."""
    return list(range(bs, 0, -1))


def can_run(server: DraftServer, fb) -> bool:
    with bound(*bindings(server, [modules().runner])):
        return bool(server.runner.can_run_graph(fb))


def replay(server: DraftServer, fb, select_index) -> list[StepResult]:
    """``execute`` a live batch as the worker does: pad to a graph, copy in, replay, cut to the raw rows."""
    backend = server.backends[0]
    views: list = []
    n0 = len(server.model.calls)
    with bound(*bindings(server, [modules().runner]), viewing(backend, views)):
        out = _executed(server.runner, fb, select_index.clone())
    calls = server.model.calls[n0:]
    if len(calls) != 1:
        raise OutOfStep("EAGLEDraftExtendCudaGraphRunner.execute", RUNNER_FILE,
                        f"a replay ran the model {len(calls)} times (the graph body runs it once)")
    B = server.runner.bs
    view, reads = views[-1] if views else (None, frozenset())
    qo, kv = backend_rows(backend, B)
    return [StepResult(out.next_token_logits.clone(), out.hidden_states.clone(), calls[0], B, view, reads, qo, kv)]


def _executed(runner, fb, select_index):
    """The runner's ``execute`` as the worker calls it: handed ``select_index`` where it takes one (it then
    returns the selected rows), else every token's row, which the worker then selects (0.5.17-0.5.20)."""
    if "select_index" in inspect.signature(runner.execute).parameters:
        return runner.execute(fb, select_index)
    out = runner.execute(fb)
    return SimpleNamespace(next_token_logits=out.next_token_logits[select_index],
                           hidden_states=out.hidden_states[select_index])


def eager(server: DraftServer, fb, select_index) -> list[StepResult]:
    """The worker's eager draft extend of the same batch: the backend's eager metadata, every token
    forward, then the rows at ``select_index``."""
    backend = extend_backend(server, graphs=False)
    with bound(*bindings(server, [modules().runner])):
        backend.init_forward_metadata(fb)
        with attention_context(backend, fb):
            out = server.model.forward(fb.input_ids, fb.positions, fb)
    qo, kv = backend_rows(backend, fb.batch_size)
    return [StepResult(out.next_token_logits[select_index].clone(), out.hidden_states[select_index].clone(),
                       server.model.calls[-1], fb.batch_size, qo_indptr=qo, kv_lens=kv)]
