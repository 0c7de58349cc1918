"""SGLang's target ``DecodeCudaGraphRunner`` in TARGET_VERIFY, captured and replayed on the CPU.

The runner is made by its own ``__init__`` (``verify_runner_init``) over a
stand-in model runner of a single-GPU EAGLE target (no DP, TBO, LoRA, DLLM,
ragged verify; the metadata glue graph only where a case's server switches it
on, ``glue_graph``): SGLang picks its captured batch sizes from the
server's configured list, sizes ``max_bs`` and its tokens a request, sets up
the Triton attention backend's graph state (its own ``init_cuda_graph_state``;
the backend is the one ``readers.triton_backend`` builds, the KV-id gather
standing in), creates its static buffers and hands them to the process-wide
pool, here the session's ``guard.graph.GraphSpace``, where each becomes a
redzoned static buffer; its graph backend is SGLang's own
``FullCudaGraphBackend``, whose ``torch.cuda`` is the graph stand-in. The
capture ``__init__`` ends with is held back and run right after
(``capture_graphs``), so what ``__init__`` sized can be judged first
(graph-buffer-soundness). Then SGLang's code runs as a server's would:
``capture()`` captures one graph per captured bs (largest first), and
``execute(live_batch)`` replays a live verify batch in the smallest graph that
holds it (``load_batch`` copies the batch in through the buffer registry, the
Triton replay metadata copies the verify mask in, the graph replays, the
outputs are cut to the raw rows).

Where a release's ``__init__`` cannot be driven over the stand-ins, the runner
is assembled by hand (``_assembled``: ``object.__new__`` and the fields a
single-GPU EAGLE target's ``__init__`` sets, buffers at sizes vmfuzz computes);
``GraphServer.init_not_driven`` then says why, and the graph properties report
the set-up not driven (never held).

The model forward is ``graph_model.RecordingModel``: per token it reads the attention
metadata the backend holds (which KV slots and which draft tokens the mask lets
the token see), writes the token's KV at its ``out_cache_loc`` slot, and hands
back hidden states and logits that are a deterministic function of what it
read. So a replay that feeds a token the wrong slots, the wrong mask row or the
wrong position gives a different number, and the eager run of the same batch
(``eager``: the backend's eager TARGET_VERIFY metadata, the same model) is what
the replay must give on the real rows.

On a window-pool server (``swa_server``; one glued case in two) the backend
is built over SGLang's ``SWAKVPool``, and each live batch carries its KV-location plan.

Not driven here: the process-wide buffer sharing with other runners (the pool
is scoped to this runner's session: nothing else aliases its buffers), streams
and events (``NotFaithful``), and every configuration the stand-ins switch off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from vmfuzz.harness.guard.graph import GraphSpace
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.model.readers import pool_slots
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.graph_model import HIDDEN, VOCAB, Forward, RecordingModel
from vmfuzz.harness.targets.sglang.graph_lookups import (adopt_static, attention_context, fitted, keep_bodies,
                                                        runner_lookups, static, verify_modules)
from vmfuzz.harness.targets.sglang.stand_in import StandIn
from vmfuzz.harness.targets.sglang import swa_server

RUNNER_FILE = "srt/model_executor/runner/decode_cuda_graph_runner.py"
_GRAPH_PROPS = ("graph-replay-equivalence", "padding-inert", "capture-replay-agreement")
_INIT_PROPS = _GRAPH_PROPS + ("graph-buffer-soundness",)

#: What this module drives: (path under the sglang package, function, properties).
SURFACE = tuple((RUNNER_FILE, fn, _GRAPH_PROPS) for fn in (
    "build_replay_fb_view", "DecodeCudaGraphRunner.capture", "DecodeCudaGraphRunner._capture",
    "DecodeCudaGraphRunner._capture_one_stream", "DecodeCudaGraphRunner.capture_one_shape",
    "DecodeCudaGraphRunner.capture_prepare", "DecodeCudaGraphRunner.get_spec_info",
    "DecodeCudaGraphRunner.can_run_graph", "DecodeCudaGraphRunner.load_batch",
    "DecodeCudaGraphRunner._init_replay_attn_metadata", "DecodeCudaGraphRunner._init_replay_attn_metadata_from_view",
    "DecodeCudaGraphRunner.execute", "DecodeCudaGraphRunner._run_in_graph_metadata_prep",
    "DecodeCudaGraphRunner._record_in_graph_metadata_prep_done", "DecodeCudaGraphRunner._make_graph_key",
    "DecodeCudaGraphRunner._capture_graph_size", "DecodeCudaGraphRunner._glue_key",
    "DecodeCudaGraphRunner._resolve_shared_read_ends", "DecodeCudaGraphRunner._publish_read_done",
    "DecodeCudaGraphRunner._take_early_verify_metadata",
)) + tuple(("srt/model_executor/runner_backend/full_cuda_graph_backend.py", fn, _GRAPH_PROPS) for fn in (
    "FullCudaGraphBackend.__init__", "FullCudaGraphBackend.capture_session", "FullCudaGraphBackend.capture_one",
    "FullCudaGraphBackend.replay", "FullCudaGraphBackend.can_run",
)) + (
    ("srt/model_executor/cuda_graph_buffer_registry.py", "CudaGraphBufferRegistry.fill_from", _GRAPH_PROPS),
    ("srt/model_executor/cuda_graph_buffer_registry.py", "GraphSlot.reset_padding", _GRAPH_PROPS),
    ("srt/model_executor/cuda_graph_buffer_registry.py", "build_decode_registry", _GRAPH_PROPS),
    ("srt/model_executor/runner_utils/buffers.py", "DecodeInputBuffers.create", _GRAPH_PROPS),
    ("srt/model_executor/runner_utils/pool.py", "get_or_create_global_graph_memory_pool", _GRAPH_PROPS),
    ("srt/model_executor/runner/base_cuda_graph_runner.py", "BaseCudaGraphRunner._pad_to_bucket", _GRAPH_PROPS),
    ("srt/model_executor/runner/base_runner.py", "BaseRunner.model_context", _GRAPH_PROPS),
) + tuple((path, fn, _INIT_PROPS) for path, fn in (
    # the runner's own set-up (verify_runner_init), whose sizing graph-buffer-soundness judges
    (RUNNER_FILE, "DecodeCudaGraphRunner.__init__"), (RUNNER_FILE, "_lora_backend_skips_inactive"),
    (RUNNER_FILE, "ragged_verify_compact_graphs_enabled"),
    (RUNNER_FILE, "DecodeCudaGraphRunner.decode_graph_gather_requirements"),
    (RUNNER_FILE, "DecodeCudaGraphRunner._next_token_logits_buffer_capacity_rows"),
    (RUNNER_FILE, "DecodeCudaGraphRunner.maybe_init_pdmux"), (RUNNER_FILE, "DecodeCudaGraphRunner._cache_loc_dtype"),
    (RUNNER_FILE, "DecodeCudaGraphRunner._wants_early_verify_metadata"),
    (RUNNER_FILE, "DecodeCudaGraphRunner._glues_draft_metadata"),
    (RUNNER_FILE, "DecodeCudaGraphRunner._glues_target_verify_metadata"),
    (RUNNER_FILE, "DecodeCudaGraphRunner._resolve_skips_prefilled_inputs"),
    ("srt/model_executor/runner/base_cuda_graph_runner.py", "get_batch_sizes_to_capture"),
    ("srt/model_executor/runner/base_runner.py", "BaseRunner.__init__"),
    ("srt/model_executor/input_buffers.py", "ForwardInputBuffers.share_buffers"),
))

#: SGLang's modules the target verify runner lives in (imported on first use)
modules = verify_modules


# -- the runner ---------------------------------------------------------------------------------------

@dataclass
class Replayed:
    """One replay through the runner: what ``execute`` returned, the model call the graph ran, the view
    the backend's replay metadata was built from, the padded bs."""

    logits: torch.Tensor
    hidden: torch.Tensor
    forward: Forward
    graph_bs: int
    view: SimpleNamespace | None
    #: what the metadata glue graph did for this replay's prep (``glue_graph``'s outcomes; None: no glue)
    glue: str | None = None


@dataclass
class GraphServer:
    """A target verify runner captured at every captured bs, with what its captures recorded."""

    config: Config
    runner: object
    space: GraphSpace
    model: RecordingModel
    backend: object
    capture_bs: list[int]
    captures: dict[int, Forward] = field(default_factory=dict)
    replay_views: list[SimpleNamespace] = field(default_factory=list)
    #: pipeline stages of the server (> 1: this runner is a later stage's, fed proxy hidden states)
    pp_size: int = 1
    #: what the runner's set-up sized (``verify_runner_init.Sizing``)
    sizing: object = None
    #: why the runner's ``__init__`` was not driven (None: the runner is its own ``__init__``'s)
    init_not_driven: str | None = None
    #: the lookups its set-up was made under, which its captures and replays are made under too
    set_up: list = field(default_factory=list)
    #: the runner's metadata glue graph, watched (``glue_graph.GlueWatch``; None: not switched on)
    glue: object = None
    #: why the glue graph asked for is not driven (None: driven, or not asked for)
    glue_not_driven: str | None = None
    #: the server's window pool (``swa_server.WindowPool``; None: one ordinary pool), or why it is not driven
    window_pool: object = None
    window_pool_not_driven: str | None = None
    dspark_hooks: object = None  # a DSpark server's backend hooks (``dspark_verify.BackendHooks``)

    def lookups(self) -> list[tuple]:
        return list(self.set_up)


def build(config: Config, capture_bs: list[int], mask, heap: ShadowHeap | None = None,
          pp_size: int = 1, capture: bool = True, glue: bool = False, window_pool: bool = False,
          dspark: bool | str = False) -> GraphServer:
    """A ``DecodeCudaGraphRunner`` for a TARGET_VERIFY EAGLE target of ``config``'s shape, made by its own
    ``__init__`` (``verify_runner_init``) for a server configured to capture ``capture_bs`` (the buckets
    and buffers are what that ``__init__`` decides), its graphs then captured at each of its buckets
    (largest first, as SGLang captures; ``capture`` False: held back, the runner as ``__init__`` sized
    it). Where this release's ``__init__`` cannot be driven, the runner is assembled by hand
    (``_assembled``) and ``init_not_driven`` says why. ``mask``: the verify mask the target's
    allocation made, which only the hand-assembled runner's backend is handed (an ``__init__``-made one
    gets the mask its own graph set-up allocates); on ``heap`` with the other static buffers.
    ``pp_size`` > 1: the runner of a later pipeline stage, its graphs reading the proxy hidden states
    it is handed. ``glue``: the server switches the metadata glue graph on (``glue_graph``) for the
    runner's ``__init__``; ``window_pool``: its KV pool keeps window layers apart (``swa_server``);
    ``dspark``: a DSpark server's target, its own glue graph and early verify metadata on (``dspark_verify``)."""
    from vmfuzz.harness.targets.sglang import dspark_verify, glue_graph
    from vmfuzz.harness.targets.sglang import verify_runner_init as init
    from vmfuzz.harness.targets.sglang.readers import triton_backend
    space = GraphSpace(heap or ShadowHeap())
    capture_bs = sorted(set(capture_bs))
    model = RecordingModel(space, config.d)
    pool, pool_why = swa_server.asked(config, capture_bs[-1], window_pool)
    backend = (pool.backend(config, capture_bs[-1], space.heap, graphs=False) if pool is not None else
               triton_backend(None, config, capture_bs[-1], torch.device("cpu"), space.heap, graphs=False))
    why = None
    glue_why, switches, hooks = dspark_verify.asked(modules().runner, glue, dspark, backend, config)
    glue = glue or dspark
    try:
        with switches:
            # a DSpark target only where this release has its wiring (else the glue asked for says why not)
            runner, lookups = init.made_by_init(config, capture_bs, space, model, backend, pp_size,
                                                dspark if glue_why is None else False)
    except init.NotDriven as exc:
        why = str(exc)
        space = GraphSpace(space.heap)  # what the failed __init__ left in its space is no graph's
        model = RecordingModel(space, config.d)
        lookups = runner_lookups(config, capture_bs, space, pp_size)
        runner, backend = _assembled(config, capture_bs, mask, space, model, lookups, pp_size)
        glue_why = glue_why or (f"the runner was assembled by hand ({why})" if glue else None)
        pool, pool_why = None, pool_why or (f"the runner was assembled by hand ({why})" if pool is not None else None)
    server = GraphServer(config, runner, space, model, backend, list(runner.capture_bs), pp_size=pp_size,
                         sizing=init.Sizing.of(runner), init_not_driven=why, set_up=lookups, glue_not_driven=glue_why,
                         window_pool=pool, window_pool_not_driven=pool_why, dspark_hooks=hooks)
    if pool is not None:
        pool.adopt(runner, space)
    made = getattr(runner, "_metadata_glue", None)
    if glue and not glue_why:
        if made is None:
            server.glue_not_driven = f"the runner's __init__ made no metadata glue graph with {glue_graph.SWITCH} on"
        else:
            server.glue = dspark_verify.watch(made, space, server.replay_views, runner, hooks, server.set_up, dspark)
    if capture:
        capture_graphs(server)
    return server


def capture_graphs(server: GraphServer) -> None:
    """The runner's capture (held back from its ``__init__``, or the hand-assembled runner's first)."""
    from vmfuzz.harness.targets.sglang import verify_runner_init as init
    n0 = len(server.model.calls)
    init.capture(server.runner, server.lookups())
    server.space.settle()
    _note_captures(server, n0)


def _assembled(config: Config, capture_bs: list[int], mask, space: GraphSpace, model, lookups, pp_size: int):
    """The runner made with ``object.__new__`` and the fields a single-GPU EAGLE target's ``__init__``
    sets, its buffers SGLang's own ``DecodeInputBuffers.create`` and ``build_decode_registry`` at sizes
    vmfuzz computes (``max_bs`` the largest of ``capture_bs``, ``d`` tokens a request): the fallback
    for a release whose ``__init__`` cannot be driven, whose sizing is then the harness's, not judged."""
    from vmfuzz.harness.targets.sglang.readers import triton_backend
    m = modules()
    max_bs, d = capture_bs[-1], config.d
    max_num_token = max_bs * d
    backend = triton_backend(mask, config, max_bs, torch.device("cpu"), space.heap, graphs=True)
    model_runner = StandIn(
        "ModelRunner", "srt/model_executor/model_runner.py",
        device="cpu", gpu_id=0, is_draft_worker=False,
        spec_algorithm=m.spec_info.SpeculativeAlgorithm.EAGLE, model=model, dtype=torch.float32,
        model_config=StandIn("ModelConfig", "srt/configs/model_config.py", hidden_size=HIDDEN, vocab_size=VOCAB,
                             dtype=torch.float32, is_encoder_decoder=False, context_len=config.max_context_len),
        kv_index_translator=SimpleNamespace(bind_runner_slots=lambda fb: None),
        hisparse_coordinator=None, capture_head_hooks=[], capture_tail_hooks=[], canary_manager=None,
        lora_manager=None, attn_tp_sequence_sharded=lambda n: False, device_timer=None,
        shared_read_done_event=None, attn_backend=backend)
    R = m.runner.DecodeCudaGraphRunner
    runner = object.__new__(R)
    fill = backend.get_cuda_graph_seq_len_fill_value()
    fields = dict(
        model_runner=model_runner, device="cpu", device_module=space.device_module(), num_dp_ranks=1, pp_size=pp_size,
        enable_pdmux=False, return_hidden_states_mode=m.forward_info.CaptureHiddenMode.NULL,
        enable_return_hidden_states=False, attn_tp_size=1, tbo_plugin=SimpleNamespace(
            capture_one_batch_size=lambda *a, **k: None, replay_prepare=lambda *a, **k: None),
        record_nolora_graph=False, in_graph_metadata_prep_done=None, _prefilled_inputs=None,
        num_prefilled_input_skips=0, _metadata_prep_fork=None, _metadata_prep_fork_resolved=False,
        enable_torch_compile=False, disable_padding=False, is_encoder_decoder=False,
        require_mlp_tp_gather=False, require_attn_tp_gather=False, require_gathered_buffer=False,
        require_mlp_sync=False, enable_two_batch_overlap=False, use_ngram_embedding=False,
        speculative_algorithm=model_runner.spec_algorithm, enable_profile_cuda_graph=False,
        enable_prefill_cp=False, deepep_adapter=SimpleNamespace(capture=lambda **k: None, replay=lambda: None),
        dllm_config=None, is_dllm=False, dllm_input_preparation=None, dllm_uses_input_embeds=False,
        attn_backend=backend, speculative_num_steps=config.spec_steps, speculative_num_draft_tokens=d,
        capture_forward_mode=m.forward_info.ForwardMode.TARGET_VERIFY,
        capture_hidden_mode=m.forward_info.CaptureHiddenMode.NULL, captured_req_width=d,
        dllm_attention=None, attention_graph_variants=None, capture_bs=capture_bs, compile_bs=[],
        max_bs=max_bs, ragged_verify_mode=False, capture_num_tokens=None, _ragged_graph_size=0,
        _captured_ragged_layouts={}, max_num_token=max_num_token, seq_len_fill_value=fill,
        encoder_len_fill_value=0, _metadata_glue=None, _draft_metadata_glue=False, _target_metadata_glue=False,
        _draft_glue_logged=0, _skips_prefilled_inputs=False, _skip_glued_replay_view=False,
        _early_verify_metadata=None)
    for k, v in fields.items():
        setattr(runner, k, v)
    with bound(*lookups):
        buffers = fitted(m.buffers.DecodeInputBuffers.create, "DecodeInputBuffers.create")(
            device="cpu", max_bs=max_bs, max_num_token=max_num_token, hidden_size=HIDDEN,
            next_token_logits_buffer=torch.zeros(max_num_token, VOCAB, dtype=torch.float32),
            dtype=torch.float32, num_dp_ranks=1, pp_size=pp_size, is_encoder_decoder=False,
            require_mlp_tp_gather=False, seq_len_fill_value=fill, encoder_len_fill_value=0,
            num_tokens_per_req=d, cache_loc_dtype=torch.int64, enable_mamba_track=False)
        adopt_static(buffers, space)
        if buffers.pp_proxy_tensors:  # a later stage's inputs from the earlier one: static buffers too
            buffers.pp_proxy_tensors = {k: static(space, f"pp_proxy_tensors.{k}", v)
                                        for k, v in buffers.pp_proxy_tensors.items()}
        runner.buffers = buffers
        runner.buffer_registry = fitted(m.registry.build_decode_registry, "build_decode_registry")(
            device="cpu", max_bs=max_bs, max_num_token=max_num_token, seq_len_fill_value=fill,
            cache_loc_dtype=torch.int64, enable_mamba_track=False, is_encoder_decoder=False,
            encoder_len_fill_value=0, enable_num_token_non_padded=False, require_gathered_buffer=False,
            enable_prefill_cp=False, require_mlp_tp_gather=False, attn_tp_sharded_fn=lambda n: False,
            num_dp_ranks=1, source=buffers)
        runner.backend = m.full.FullCudaGraphBackend(runner)
        keep_bodies(runner.backend, space)
    return runner, backend


def _note_captures(server: GraphServer, first_call: int) -> None:
    """The capture run of each bs: the third of its three model calls (two warm-ups, then the capture)."""
    calls = server.model.calls[first_call:]
    for i, bs in enumerate(reversed(server.capture_bs)):
        server.captures[bs] = calls[3 * i + 2]


# -- live batches ----------------------------------------------------------------------------------------

def live_batch(server: GraphServer, batch: Batch, mask: torch.Tensor, input_ids, out_cache_loc, positions=None,
               spec=None):
    """A live TARGET_VERIFY ForwardBatch of ``batch`` (pool slots last first), its verify mask ``mask``
    (``positions``: the tokens', each request's ``s .. s+d-1`` unless given; ``spec``: a verify input
    SGLang built, whose tokens and positions the batch then carries)."""
    m = modules()
    d = server.config.d
    bs = batch.bs
    seq_lens = torch.tensor(batch.seq_lens, dtype=torch.long)
    if spec is not None:
        input_ids, positions = spec.draft_token, spec.positions
    if positions is None:
        positions = torch.cat([torch.arange(d, dtype=torch.long) + s for s in batch.seq_lens])
    spec = spec or m.eagle_info.EagleVerifyInput(
        draft_token=input_ids.clone(), custom_mask=mask, positions=positions.clone(),
        retrieve_index=None, retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None,
        spec_steps=server.config.spec_steps, topk=server.config.topk, draft_token_num=d,
        capture_hidden_mode=m.forward_info.CaptureHiddenMode.NULL, seq_lens_sum=int(seq_lens.sum()),
        seq_lens_cpu=seq_lens.clone())
    return swa_server.with_plan(server.window_pool, m.forward_info.ForwardBatch(
        forward_mode=m.forward_info.ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=input_ids,
        req_pool_indices=torch.tensor(pool_slots(bs), dtype=torch.long), seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.clone(), orig_seq_lens=seq_lens, out_cache_loc=out_cache_loc,
        seq_lens_sum=int(seq_lens.sum()), return_logprob=False, positions=positions,
        spec_algorithm=server.runner.model_runner.spec_algorithm, spec_info=spec,
        capture_hidden_mode=m.forward_info.CaptureHiddenMode.NULL,
        global_forward_mode=m.forward_info.ForwardMode.TARGET_VERIFY))


def idle_batch(server: GraphServer, spec):
    """An idle ForwardBatch (no request), carrying the verify input ``spec`` an idle step gets."""
    m = modules()
    empty = torch.empty(0, dtype=torch.long)
    idle = m.forward_info.ForwardMode.IDLE
    return swa_server.with_plan(server.window_pool, m.forward_info.ForwardBatch(
        forward_mode=idle, batch_size=0, input_ids=empty, req_pool_indices=empty, seq_lens=empty,
        seq_lens_cpu=empty, orig_seq_lens=empty, out_cache_loc=empty, seq_lens_sum=0, return_logprob=False,
        positions=empty, spec_algorithm=server.runner.model_runner.spec_algorithm, spec_info=spec,
        capture_hidden_mode=m.forward_info.CaptureHiddenMode.NULL, global_forward_mode=idle))


def can_run(server: GraphServer, fb) -> bool:
    with bound(*server.lookups()):
        return bool(server.runner.can_run_graph(fb))


def replay(server: GraphServer, fb, proxy=None, planned: bool = False) -> Replayed:
    """``execute`` a live batch: the runner pads it to its graph, copies it in, replays (``proxy``: a
    later pipeline stage's ``PPProxyTensors``). ``planned``: the batch was loaded ahead, without the
    proxy (as the verify step's preparation loads it, then marks its metadata ready), so ``execute``
    only refreshes what the preparation could not hand it."""
    views = server.replay_views
    backend = server.backend
    real = type(backend).init_forward_metadata_out_graph
    glue = server.glue

    def recording(forward_batch, *args, **kwargs):
        if not kwargs.get("in_capture", False):
            views.append(forward_batch)
        if glue is not None and server.space.capturing is not None:  # the glue graph's capture of the prep
            return glue.capture_body(backend, forward_batch, lambda b, fb: real(b, fb, *args, **kwargs))
        return real(backend, forward_batch, *args, **kwargs)
    n0 = len(server.model.calls)
    if glue is not None:
        glue.outcome = None
    with bound(*server.lookups(), (backend, "init_forward_metadata_out_graph", recording),
               *(glue.lookups() if glue is not None else ())):
        if planned:
            server.runner.load_batch(fb)
            fb.mark_forward_metadata_ready()
        out = server.runner.execute(fb, proxy)
    if server.space.refusals:  # a capture the stand-in refused, which SGLang's fallback would hide
        raise server.space.refusals[0]
    calls = server.model.calls[n0:]
    if len(calls) != 1:
        raise OutOfStep("DecodeCudaGraphRunner.execute", RUNNER_FILE,
                        f"a replay ran the model {len(calls)} times (the graph body runs it once)")
    return Replayed(out.next_token_logits.clone(), out.hidden_states.clone(), calls[0], server.runner.bs,
                    views[-1] if views else None, glue.outcome if glue is not None else None)


def eager(server: GraphServer, config: Config, batch: Batch, fb, proxy=None) -> Forward:
    """The same batch, eagerly: the Triton backend's eager TARGET_VERIFY metadata, the same model."""
    from vmfuzz.harness.targets.sglang.readers import triton_backend
    heap, rows = ShadowHeap(), max(server.runner.max_bs, batch.bs)
    backend = (server.window_pool.backend(config, rows, heap, graphs=False) if server.window_pool is not None else
               triton_backend(None, config, rows, torch.device("cpu"), heap, graphs=False))
    backend.init_forward_metadata(fb)
    saved = fb.next_token_logits_buffer
    fb.next_token_logits_buffer = None
    try:
        with attention_context(backend, fb):
            server.model.forward(fb.input_ids, fb.positions, fb, pp_proxy_tensors=proxy)
    finally:
        fb.next_token_logits_buffer = saved
    return server.model.calls[-1]
