"""DSpark's wiring of SGLang's target verify runner: its metadata glue and early verify metadata, switched on.

A DSpark server's target verify ``DecodeCudaGraphRunner`` prepares its
attention metadata through a glue graph of its own
(``SGLANG_OPT_DSV41_TARGET_VERIFY_METADATA_GLUE``, where the backend's
``glue_target_verify_metadata`` answers empty), re-copies no verify inputs a
pre-planned load already copied (``SGLANG_OPT_DSV41_DSPARK_SKIP_PREFILLED_INPUTS``),
and can stage a step's verify inputs and glue replay on a side stream while the
draft graph runs (``SGLANG_OPT_DSV41_TARGET_METADATA_EARLY``:
``stage_verify_metadata_early``, taken or discarded by the next ``load_batch``).
``switched_on`` sets the three through SGLang's own ``envs`` for the runner's
``__init__`` (on some servers also ``SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW``: a
glued load replays its captured graph by key, with no view); ``stage`` calls
``stage_verify_metadata_early`` as DSpark's worker does, right before the
verify step loads its batch. A server asked as ``NO_CANDIDATES_ASKED`` serves DeepSeek V4 rather than
V4.1: its config makes no candidate graph variants, so the runner finds no early variant for any batch.

The backend's two hooks the runner calls (``glue_target_verify_metadata``,
``enable_early_verify_metadata``) are DeepSeek V4's own methods, on a DeepSeek
V4 backend made by its own ``__init__`` for this server (``dsv4_backend``: a
DSpark target drafting chains, topk 1 as DSpark's arguments force it), while
the Triton backend prepares the metadata (``BackendHooks``): DeepSeek V4's
prep needs FlashMLA and its compressed indexers, which no CPU runs. Where that
backend cannot be made here, the Triton backend answers as DeepSeek V4's does
on a static-verify server (empty: its prep is host-free), and ``dsv4_not_driven``
says why.

What only the harness answers here, never judged as SGLang's:

- the speculative algorithm (``DSparkAlgorithm``): DSpark for every switch the
  runner reads (``is_dspark``), while the verify input a step carries, and the
  one the capture builds, stay EAGLE's tree (the harness's verify path); a DSpark
  server's is DFlash's block, which none of the lines driven here reads;
- a GPU of compute capability 10 for the two device tests the early path is
  built behind (``_wants_early_verify_metadata``'s, and
  ``create_dsv41_candidate_graph_variants``'s, which then makes SGLang's own
  candidate variants from a DeepSeek V4.1 config whose candidate span is the
  context); the runner's tensors stay on the CPU;
- the side stream the stage runs on: the graph stand-in's staging stream
  (``guard.graph_device``), whose work runs as it is issued: faithful because
  nothing is issued on the default stream between the stage and the load that
  waits for it (no draft graph runs between them here).
"""

from __future__ import annotations

import contextlib
import functools
from types import SimpleNamespace

import torch

from vmfuzz.harness.guard import graph_device
from vmfuzz.harness.model.glue import CAPTURE, EARLY, REPLAY
from vmfuzz.harness.targets.sglang.glue_graph import GlueWatch

RUNNER_FILE = "srt/model_executor/runner/decode_cuda_graph_runner.py"
_GLUE_FILE = "srt/model_executor/runner/metadata_glue_graph.py"
_EARLY_FILE = "srt/model_executor/runner/early_verify_metadata.py"
SWITCHES = ("SGLANG_OPT_DSV41_TARGET_VERIFY_METADATA_GLUE", "SGLANG_OPT_DSV41_TARGET_METADATA_EARLY",
            "SGLANG_OPT_DSV41_DSPARK_SKIP_PREFILLED_INPUTS")
#: the switch of a glued replay with no view (``dspark="skip view"``: on for the server too)
SKIP_VIEW = "SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW"
SKIP_VIEW_ASKED = "skip view"
#: a DSpark target serving DeepSeek V4, not V4.1 (``dspark="DeepSeek V4"``): its config makes no candidate graph
#: variants, so no batch has an early variant and every stage is thrown away (and a load finds none staged)
NO_CANDIDATES_ASKED = "DeepSeek V4"
#: a DSpark target whose DeepSeek V4.1 KV pool keeps a request window (``dspark="request window"``): its backend
#: declines the glue (the window's layout is host-fed), so the runner glues nothing and stages nothing early
WINDOW_ASKED = "request window"
_PROPS = ("graph-replay-equivalence", "padding-inert", "capture-replay-agreement")
_R = "DecodeCudaGraphRunner."

#: what this module drives, on a DSpark case's server
SURFACE = tuple((RUNNER_FILE, _R + fn, _PROPS) for fn in (
    "_maybe_log_draft_glue", "_early_variant_for", "stage_verify_metadata_early", "_note_prefilled_input_skip",
    "_copy_replay_inputs")) + tuple(
    (_GLUE_FILE, "MetadataGlueGraph." + fn, _PROPS) for fn in ("replay", "reinstall")) + tuple(
    (_EARLY_FILE, "EarlyVerifyMetadata." + fn, _PROPS) for fn in ("__init__", "stage", "take", "count_variant",
                                                                   "discard"))

_DSV4_FILE = "srt/layers/attention/deepseek_v4_backend.py"
#: DeepSeek V4's hooks, asked of its backend made for a DSpark server (``BackendHooks``)
SURFACE += tuple((_DSV4_FILE, "DeepseekV4AttnBackend." + fn, _PROPS) for fn in (
    "glue_target_verify_metadata", "enable_early_verify_metadata"))


class DSparkAlgorithm:
    """The speculative algorithm the runner reads: DSpark for its switches, SGLang's EAGLE member for the rest
    (the verify input: see the module's docstring)."""

    def __init__(self, eagle):
        self._eagle = eagle

    def is_dspark(self) -> bool:
        return True

    def __getattr__(self, name):
        return getattr(self._eagle, name)

    def __repr__(self) -> str:
        return "DSPARK (EAGLE's verify input)"


def hf_config(context_len: int, dspark: bool | str = True) -> SimpleNamespace:
    """A DeepSeek V4.1 text config whose candidate span (topk blocks x block size) is the context; for a
    server asked as ``NO_CANDIDATES_ASKED``, the same config of a DeepSeek V4 model (no candidate variants)."""
    model_type = "deepseek_v4" if dspark == NO_CANDIDATES_ASKED else "deepseek_v41"
    return SimpleNamespace(architectures=["DeepseekV4ForCausalLM"], model_type=model_type,
                           candidate_source_layer_id=0, candidate_topk_blocks=max(1, context_len),
                           candidate_block_size=1, compress_ratios=[4], index_topk=0)


def switch_fields(runner_module, skip_view: bool = False) -> list:
    """SGLang's ``envs`` fields for the switches (an empty list where this release lacks one)."""
    envs = getattr(runner_module, "envs", None)
    names = SWITCHES + ((SKIP_VIEW,) if skip_view else ())
    fields = [getattr(envs, name, None) for name in names] if envs is not None else [None]
    return [] if None in fields else fields


@contextlib.contextmanager
def switched_on(runner_module, skip_view: bool = False):
    with contextlib.ExitStack() as stack:
        for field in switch_fields(runner_module, skip_view):
            stack.enter_context(field.override(True))
        yield


class BackendHooks:
    """DeepSeek V4's hooks as the runner finds them on the Triton backend: asked of ``dsv4`` (a DeepSeek V4
    backend made for the server, under ``lookups``), or, where it is None, answered as it answers on a
    static-verify server (see the module's docstring). ``glue_answer``: what the last ask answered."""

    def __init__(self, backend, dsv4=None, lookups: list | tuple = (), dsv4_not_driven: str | None = None,
                 expect_declined: bool = False):
        self.early_enabled = 0
        self.dsv4, self.lookups, self.dsv4_not_driven = dsv4, list(lookups), dsv4_not_driven
        self.expect_declined = expect_declined  # the server keeps a request window (``WINDOW_ASKED``)
        self.glue_answer = None
        backend.glue_target_verify_metadata = self._glue
        backend.enable_early_verify_metadata = self._enable

    def _glue(self) -> str:
        from vmfuzz.harness.targets.sglang.binding import bound
        if self.dsv4 is None:
            return ""
        with bound(*self.lookups):
            self.glue_answer = self.dsv4.glue_target_verify_metadata()
        return self.glue_answer

    def _enable(self):
        from vmfuzz.harness.targets.sglang.binding import bound
        self.early_enabled += 1
        if self.dsv4 is not None:
            with bound(*self.lookups):
                self.dsv4.enable_early_verify_metadata()


def dsv4_hooks(backend, config, dspark: bool | str = True) -> BackendHooks:
    """``BackendHooks`` asking a DeepSeek V4 backend made by its own ``__init__`` for a DSpark server of
    ``config``'s capture, context and draft width (``dsv4_backend``; topk 1: DSpark's), its pool keeping a
    request window where asked (``WINDOW_ASKED``: what the backend reads of it is only that there is one), or
    answering themselves where that backend cannot be made here (``dsv4_not_driven`` says why)."""
    from vmfuzz.harness.model.allocation import ServerNumbers
    from vmfuzz.harness.model.errors import OutOfStep
    from vmfuzz.harness.targets.sglang import dsv4_backend
    from vmfuzz.harness.targets.sglang.graph_lookups import verify_modules
    from vmfuzz.harness.targets.sglang.imports import NotInRelease, sglang_module
    try:
        mod = sglang_module("sglang.srt.layers.attention.deepseek_v4_backend")
    except NotInRelease:  # a release without it: the runner's hooks are answered here
        return BackendHooks(backend, dsv4_not_driven=f"{_DSV4_FILE} is not in this release")
    cls = getattr(mod, "DeepseekV4AttnBackend", None)
    if cls is None or not hasattr(cls, "glue_target_verify_metadata"):
        return BackendHooks(backend, dsv4_not_driven=f"{_DSV4_FILE} has no DeepseekV4AttnBackend with the glue hook")
    n = ServerNumbers(config.max_bs, config.max_context_len, config.d, 1, config.spec_steps)
    algorithm = DSparkAlgorithm(verify_modules().spec_info.SpeculativeAlgorithm.EAGLE)
    window = dspark == WINDOW_ASKED
    try:
        dsv4 = dsv4_backend.built_by_init(mod, cls, n, spec_algorithm=algorithm,
                                          request_window=RequestWindow() if window else None)
    except OutOfStep as exc:
        return BackendHooks(backend, dsv4_not_driven=f"DeepseekV4AttnBackend.__init__ is not driven here ({exc})")
    return BackendHooks(backend, dsv4, dsv4_backend.lookups(mod, cls, n), expect_declined=window)


class RequestWindow:
    """A DeepSeek V4.1 KV pool's request window, as the backend's glue hook sees it: there is one."""


def stage_unwatched(runner, fb, lookups: list) -> bool:
    """``stage_verify_metadata_early`` for ``fb``'s tensors, as DSpark's worker calls it after every draft
    launch, on a runner that glued nothing (its backend declined): what it answered (staged or not)."""
    from vmfuzz.harness.targets.sglang.binding import bound
    with bound(*lookups, *replay_lookups()):
        after = torch.cuda.Event()
        after.record()
        return runner.stage_verify_metadata_early(
            seq_lens=fb.seq_lens, req_pool_indices=fb.req_pool_indices, out_cache_loc=fb.out_cache_loc,
            positions=fb.positions, after=after,
            max_seq_len=int(fb.seq_lens_cpu.max()) if fb.seq_lens_cpu.numel() else None)


def _on_a_gpu(real, model_runner_of):
    """``real`` run with the model runner's device read as a GPU of capability 10 (the harness's answer)."""
    @functools.wraps(real)
    def wrapped(*args, **kwargs):
        mr = model_runner_of(*args)
        saved = mr.device
        mr.device = "cuda"
        try:
            with _capability():
                return real(*args, **kwargs)
        finally:
            mr.device = saved
    return wrapped


@contextlib.contextmanager
def _capability():
    saved = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda *a, **k: (10, 0)
    try:
        yield
    finally:
        torch.cuda.get_device_capability = saved


def init_lookups(runner_module) -> list:
    """The patches the runner's ``__init__`` runs under on a DSpark server (the device answers)."""
    R = runner_module.DecodeCudaGraphRunner
    wants = _on_a_gpu(R._wants_early_verify_metadata, lambda self: self.model_runner)
    return [(R, "_wants_early_verify_metadata", wants),
            (runner_module, "create_dsv41_candidate_graph_variants",
             _on_a_gpu(runner_module.create_dsv41_candidate_graph_variants, lambda mr, *a: mr)),
            (torch.cuda, "Stream", graph_device.StagingStream), (torch.cuda, "Event", graph_device.Event)]


def replay_lookups() -> list:
    """The stream names a stage and the load that takes it reach (the staging stream's)."""
    return [(torch.cuda, "stream", graph_device.staging_context),
            (torch.cuda, "current_stream", lambda *a, **k: graph_device.DefaultStream()),
            (torch.cuda, "Event", graph_device.Event),
            (torch.Tensor, "record_stream", graph_device.record_stream)]


class DSparkWatch(GlueWatch):
    """The DSpark target glue graph, watched as ``GlueWatch`` watches the glue, and its early stages: the
    batch each stage was made from (``staged``), mirrored into the glue graph's capture before its replay,
    and a replay that took a stage (``EARLY``)."""

    def __init__(self, glue, space, views: list, runner, hooks: BackendHooks, candidates: bool = True):
        super().__init__(glue, space, views)
        self.runner, self.hooks = runner, hooks
        self.candidates = candidates  # the server's model makes candidate graph variants (a V4.1 config)
        self.staged = None  # (key, the ForwardBatch staged, its view) of the last stage the glue replayed
        self.taken = None  # that stage, where the last replay took it
        self.live = None  # the live batch of the replay under way (the session's)
        self.last_outcome = None  # what the glue did for the last replay's prep
        self.glued: set = set()  # the glue keys (``_key``) whose glue graph a replay was seen to capture or run
        self._staging = None
        self._replaying = False

    def lookups(self) -> list[tuple]:
        return super().lookups() + [(self.glue, "replay", self.replay), (self.glue, "reinstall", self.reinstall)]

    def replay(self, key):
        """A replay of the glue graph by key: a stage's (its batch's view mirrored in), or a load's with no
        view (``SKIP_VIEW``: the live batch's view, as the runner would have built it, mirrored in)."""
        if self._staging is not None:
            fb, view = self._staging
            self.staged = (key, fb, view)
        else:
            view = _view(self.runner, self.live, self.live.batch_size)
            self.outcome = REPLAY
            self.views.append(view)
        captured = self.captured.get(key)
        if captured is not None:
            self._mirror(captured, view)
        self._replaying = True  # its own re-install is no load's taking a stage
        try:
            return type(self.glue).replay(self.glue, key)
        finally:
            self._replaying = False

    def reinstall(self, key):
        if self._replaying:
            return type(self.glue).reinstall(self.glue, key)
        self.outcome = EARLY
        self.taken = self.staged
        if self.staged is not None:
            self.views.append(self.staged[2])  # the view the metadata was prepared from
        return type(self.glue).reinstall(self.glue, key)

    def stage(self, fb, lookups: list) -> None:
        """``stage_verify_metadata_early`` for ``fb``'s tensors, as DSpark's worker calls it after the draft
        launch (the head's event recorded on the default stream)."""
        from vmfuzz.harness.targets.sglang.binding import bound
        self.taken = None
        graph_device.UNJOINED.clear()
        r = self.runner
        bs = fb.seq_lens.shape[0]
        view = _view(r, fb, bs)
        self._staging = (fb, view)
        try:
            with bound(*lookups, *self.lookups()):
                after = torch.cuda.Event()
                after.record()
                r.stage_verify_metadata_early(
                    seq_lens=fb.seq_lens, req_pool_indices=fb.req_pool_indices, out_cache_loc=fb.out_cache_loc,
                    positions=fb.positions, after=after,
                    max_seq_len=int(fb.seq_lens_cpu.max()) if fb.seq_lens_cpu.numel() else None)
        finally:
            self._staging = None

    @staticmethod
    def _key(batch, config) -> tuple:
        """The harness's own reading of a batch's glue key: its bs, and whether its longest request with the
        step's verify tokens fits the candidate span (the context, ``hf_config``): the early variant."""
        return batch.bs, max(batch.seq_lens) + config.d <= config.max_context_len

    def expects_early(self, batch, config, capture_bs) -> bool:
        """Whether a stage made from ``batch``'s own tensors should be taken by its load: a captured bs, the
        early variant (a V4.1 server's only), and a glue graph already captured for both (seen on an earlier
        step)."""
        key = self._key(batch, config)
        return self.candidates and batch.bs in capture_bs and key[1] and key in self.glued

    def note(self, batch, config, outcome) -> None:
        self.last_outcome = outcome
        if outcome in (CAPTURE, REPLAY, EARLY):
            self.glued.add(self._key(batch, config))


def _view(runner, fb, bs: int):
    """The replay view SGLang's runner would hand its prep for ``fb`` unpadded (its own
    ``build_replay_fb_view`` and ``_glue_draft_inputs``)."""
    from vmfuzz.harness.targets.sglang.graph_lookups import verify_modules
    m = verify_modules()
    view = m.runner.build_replay_fb_view(
        forward_batch=fb, buffers=runner.buffers, bs=bs, raw_bs=bs, num_tokens=bs * runner.captured_req_width,
        global_num_tokens_cpu=None, seq_len_fill_value=runner.seq_len_fill_value,
        capture_forward_mode=runner.capture_forward_mode, is_encoder_decoder=False)
    runner._glue_draft_inputs(view)
    return view


def asked(runner_module, glue: bool, dspark: bool, backend, config):
    """What a server of ``config`` asking for the glue graph (``glue``) or DSpark's wiring (``dspark``) builds
    its runner under: (why the glue graph asked for is not driven, or None; the switches' context; the
    backend's hooks, a DSpark server's only)."""
    from vmfuzz.harness.targets.sglang import glue_graph
    if dspark:
        skip_view = dspark == SKIP_VIEW_ASKED
        if not switch_fields(runner_module, skip_view):
            why = f"this SGLang lacks one of {', '.join(SWITCHES)} or {SKIP_VIEW} (no DSpark target glue)"
            return why, contextlib.nullcontext(), None
        return None, switched_on(runner_module, skip_view), dsv4_hooks(backend, config, dspark)
    if not glue:
        return None, contextlib.nullcontext(), None
    if glue_graph.switch(runner_module) is None:
        return f"this SGLang has no {glue_graph.SWITCH} (no metadata glue graph)", contextlib.nullcontext(), None
    return None, glue_graph.switched_on(runner_module), None


def watch(glue, space, views: list, runner, hooks, set_up: list, dspark: bool | str = True):
    """The runner's glue graph watched: a DSpark server's (``dspark``: as asked) with its early stages (its
    replays' lookups joined to ``set_up``), any other's as ``GlueWatch`` watches it."""
    if hooks is None:
        return GlueWatch(glue, space, views)
    set_up.extend(replay_lookups())
    return DSparkWatch(glue, space, views, runner, hooks, candidates=dspark != NO_CANDIDATES_ASKED)
