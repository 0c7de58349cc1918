"""SGLang's routers, built for real over stand-in children.

``HybridAttnBackend``, ``TboAttnBackend``, ``HybridLinearAttnBackend`` and Dots'
``DotsSWAMLAAttnBackend`` are constructed with their own ``__init__`` over children that each hold a
different verify mask (and the context they were sized for). What is read back
is what the call site reads: the ``verify_mask`` property and
``max_context_len``; and which child a TARGET_VERIFY forward is dispatched to
(``forward_extend``, the path target verify takes); which children a cuda-graph
replay's verify-buffer fix-up (``update_verify_buffers_to_fill_after_draft``)
reaches, and which get their cuda-graph state (``init_cuda_graph_state``), with
what arguments. A verify step then runs
SGLang's call site with the router itself as the model runner's attention
backend and the batch's length sum unknown, as under overlap scheduling, so a
FULL_MASK fallback is sized from the context the router reports.

The server-wide lookups the constructors make (``get_spec`` for the
speculative attention mode, ``check_cuda_graph_backend`` for breakable prefill
graphs) are bound for the construction only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from typing import Any

import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.outputs import StepOutput
from vmfuzz.harness.model.routing import (CAPTURE, FIXUP_GRAPH_BS, FIXUP_ROUTERS, FIXUP_SPEC, ROUTERS, Child, Nest,
                                   ReplayView, Routing, check_args)
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.reach import lookup_patches
from vmfuzz.harness.targets.sglang.seams import call_method, call_with, require_taken, where
from vmfuzz.harness.targets.sglang.stand_in import StandIn
from vmfuzz.harness.model.trees import draft_tokens, tree_tensors

_ATTN = "srt/layers/attention/"
_CONTEXT, _CALL_SITE = "srt/runtime_context.py", "srt/speculative/eagle_worker_common.py"

#: (sglang-relative path, what is driven, properties that drive it)
SURFACE: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (_ATTN + "hybrid_attn_backend.py", "HybridAttnBackend.__init__", ("routing",)),
    (_ATTN + "hybrid_attn_backend.py", "HybridAttnBackend.verify_mask", ("routing",)),
    (_ATTN + "hybrid_attn_backend.py", "HybridAttnBackend._select_backend", ("routing",)),
    (_ATTN + "hybrid_attn_backend.py", "HybridAttnBackend.forward_extend", ("routing",)),
    (_ATTN + "hybrid_attn_backend.py", "HybridAttnBackend.update_verify_buffers_to_fill_after_draft", ("routing",)),
    (_ATTN + "hybrid_attn_backend.py", "HybridAttnBackend.init_cuda_graph_state", ("routing",)),
    (_ATTN + "tbo_backend.py", "TboAttnBackend.__init__", ("routing",)),
    (_ATTN + "tbo_backend.py", "TboAttnBackend.verify_mask", ("routing",)),
    (_ATTN + "tbo_backend.py", "TboAttnBackend.__getattr__", ("routing",)),
    (_ATTN + "tbo_backend.py", "TboAttnBackend.forward_extend", ("routing",)),
    (_ATTN + "tbo_backend.py", "TboAttnBackend.init_cuda_graph_state", ("routing",)),
    # a TARGET_VERIFY cuda-graph replay split across the overlap children
    (_ATTN + "tbo_backend.py", "TboAttnBackend.init_forward_metadata_out_graph", ("routing",)),
    (_ATTN + "tbo_backend.py", "TboAttnBackend._dispatch_children_from_replay_view", ("routing",)),
    (_ATTN + "tbo_backend.py", "_build_tbo_child_replay_fb_view", ("routing",)),
    (_ATTN + "hybrid_linear_attn_backend.py", "HybridLinearAttnBackend.__init__", ("routing",)),
    (_ATTN + "hybrid_linear_attn_backend.py", "HybridLinearAttnBackend.verify_mask", ("routing",)),
    (_ATTN + "hybrid_linear_attn_backend.py", "HybridLinearAttnBackend.forward_extend", ("routing",)),
    (_ATTN + "hybrid_linear_attn_backend.py", "HybridLinearAttnBackend.update_verify_buffers_to_fill_after_draft",
     ("routing",)),
    (_ATTN + "hybrid_linear_attn_backend.py", "HybridLinearAttnBackend.init_cuda_graph_state", ("routing",)),
    (_ATTN + "dots_hybrid_backend.py", "DotsSWAMLAAttnBackend.__init__", ("routing",)),
    (_ATTN + "dots_hybrid_backend.py", "DotsSWAMLAAttnBackend.verify_mask", ("routing",)),
    (_ATTN + "dots_hybrid_backend.py", "DotsSWAMLAAttnBackend.forward_extend", ("routing",)),
    (_ATTN + "dots_hybrid_backend.py", "DotsSWAMLAAttnBackend.update_verify_buffers_to_fill_after_draft",
     ("routing",)),
    (_ATTN + "dots_hybrid_backend.py", "DotsSWAMLAAttnBackend.init_cuda_graph_state", ("routing",)),
    # DFlash's custom-mask policy, resolved over each router to the backend it names
    ("srt/speculative/dflash_utils.py", "resolve_dflash_verify_mask_policy", ("routing",)),
    # the call site, with the router as model_runner.attn_backend and the length sum unknown
    ("srt/speculative/eagle_worker_common.py", "build_eagle_verify_input", ("routing",)),
)

_MODULES = {
    "hybrid": ("sglang.srt.layers.attention.hybrid_attn_backend", "HybridAttnBackend"),
    "tbo": ("sglang.srt.layers.attention.tbo_backend", "TboAttnBackend"),
    "hybrid-linear": ("sglang.srt.layers.attention.hybrid_linear_attn_backend", "HybridLinearAttnBackend"),
    "dots-swa": ("sglang.srt.layers.attention.dots_hybrid_backend", "DotsSWAMLAAttnBackend"),
}

def present() -> tuple[str, ...]:
    """The router kinds this SGLang has (Dots' wrapper came in 0.5.19): a release
    without a router is not out of step, it has nothing there to check."""
    from importlib.util import find_spec
    out = []
    for kind, (module, _) in _MODULES.items():
        try:
            if find_spec(module) is not None:
                out.append(kind)
        except ImportError:
            pass
    return tuple(out)


#: the one full-attention layer the stand-in hybrid-linear model has
_FULL_LAYER = 0


class ChildBackend:
    """A stand-in attention backend: only what the routers read of a child.

    ``forward_extend`` records that this child was asked to run a forward, which
    is how the router's TARGET_VERIFY dispatch is observed; the cuda-graph fix-up
    and set-up record what this child was handed.
    """

    needs_cpu_seq_lens = False
    use_captured_forward_metadata_for_breakable_cuda_graph = False
    extend_dummy_seqs_capped_by_req_pool = False
    supports_ragged_verify_graph = False
    token_to_kv_pool = None
    req_to_token_pool = None
    kv_index_translator = None

    def __init__(self, child: Child, served: list[str], graphs: dict | None = None):
        self.role = child.role
        self.verify_mask = child.verify_mask
        if child.max_context_len is not None:
            self.max_context_len = child.max_context_len
        self._served = served
        self._graphs = {"fixups": [], "graph_states": []} if graphs is None else graphs

    def forward_extend(self, *args, **kwargs):
        self._served.append(self.role)

    def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs):
        self._graphs["fixups"].append((self.role, spec_info, cuda_graph_bs))

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        self._graphs["graph_states"].append((self.role, max_bs, max_num_tokens))

    def supports_prefill_graph_extend(self) -> bool:
        return False


def _class(router: str):
    from vmfuzz.harness.targets.sglang.imports import sglang_module
    module, name = _MODULES[router]
    mod = sglang_module(module)  # its raise on import: a stage-import finding, or out of step (imports.decide)
    return mod, getattr(mod, name)


def build(sg, router: str, spec_mode: str, children: dict, context_len: int) -> Routing:
    """SGLang's router of kind ``router`` over stand-ins of ``children`` (routers of their own
    where a child is a ``Nest``), and what it answers."""
    check_args(router, spec_mode, children)
    served: list[str] = []
    made: dict = {}
    graphs: dict = {"fixups": [], "graph_states": []}
    backend = _router(router, spec_mode, _kids(sg, router, spec_mode, children, context_len, served, made, graphs),
                      context_len)
    at = where(type(backend))
    call_method(backend, "forward_extend", q=None, k=None, v=None,
                layer=StandIn("RadixAttention", at, layer_id=_FULL_LAYER),
                forward_batch=StandIn("ForwardBatch", at, forward_mode=sg.forward_info.ForwardMode.TARGET_VERIFY))
    resolved, custom_mask = _dflash_resolves(backend, made)
    fixed_up = _drive_graphs(router, spec_mode, backend)
    return Routing(router, spec_mode, backend, backend.verify_mask, getattr(backend, "max_context_len", None),
                   served[0] if served else None, bool(getattr(backend, "needs_cpu_seq_lens", True)),
                   resolved, custom_mask, tuple(served), fixups=tuple(graphs["fixups"]) if fixed_up else None,
                   graph_states=tuple(graphs["graph_states"]))


def _drive_graphs(router: str, spec_mode: str, backend) -> bool:
    """The router's cuda-graph set-up, then a replay's fix-up of the verify buffers after the draft
    (where it hands one on): what reaches each leaf is recorded by the leaf. False: no fix-up run
    (a release whose backends have none has no plan stream to fix up after)."""
    fixes = router in FIXUP_ROUTERS and hasattr(type(backend), "update_verify_buffers_to_fill_after_draft")
    name, file = type(backend).__name__, where(type(backend))
    with bound(*_hybrid_lookups(spec_mode)), _lookups_taken(f"{name}.init_cuda_graph_state", file):
        max_bs, max_num_tokens = CAPTURE
        call_with(backend.init_cuda_graph_state, f"{name}.init_cuda_graph_state", file, max_bs=max_bs,
                  max_num_tokens=max_num_tokens)
        if fixes:
            call_with(backend.update_verify_buffers_to_fill_after_draft,
                      f"{name}.update_verify_buffers_to_fill_after_draft", file, spec_info=FIXUP_SPEC,
                      cuda_graph_bs=FIXUP_GRAPH_BS)
    return fixes


def _hybrid_lookups(spec_mode: str) -> list:
    """The server-wide lookups the hybrid router makes, bound to an EAGLE server in ``spec_mode``
    without a diffusion LLM; only those this release has, bound wherever the real function is held
    (imported by name, or reached through the module that defines it)."""
    mod, _ = _class("hybrid")
    spec = StandIn("get_spec()", _CONTEXT, speculative_attention_mode=spec_mode, speculative_algorithm="EAGLE",
                   dllm_algorithm=None)
    exec_ = StandIn("get_exec()", _CONTEXT, dllm=StandIn("get_exec().dllm", _CONTEXT, dllm_algorithm=None))
    answers = {"get_spec": lambda: spec, "get_exec": lambda: exec_}
    return lookup_patches([mod], answers)


def _kids(sg, router: str, spec_mode: str, children: dict, context_len: int, served: list, made: dict,
          graphs: dict) -> dict:
    """The backends under a router: a stand-in per leaf, SGLang's own router per ``Nest``."""
    kids = {}
    for role in ROUTERS[router]:
        child = children[role]
        if isinstance(child, Nest):
            inner = _kids(sg, child.router, spec_mode, child.children, context_len, served, made, graphs)
            kids[role] = _router(child.router, spec_mode, inner, context_len)
        else:
            # One class per role (named after the backend it stands for, where it stands for one),
            # so a policy that answers with a class name names the child.
            kids[role] = made[child.role] = _role_class(child.backend or f"ChildBackend[{child.role}]")(
                child, served, graphs)
    return kids


def _router(router: str, spec_mode: str, kids: dict, context_len: int):
    """SGLang's router class of kind ``router``, constructed by its own ``__init__`` over ``kids``,
    each handed by the parameter name the constructor gives it (``seams.call_with``)."""
    mod, cls = _class(router)
    seam, file = f"{cls.__name__}.__init__", where(cls)
    if router == "hybrid":
        spec = StandIn("ServerArgs", file, speculative_attention_mode=spec_mode, speculative_algorithm="EAGLE",
                       dllm_algorithm=None)
        # The mode is read from the server's spec (get_spec(), 0.5.23) or, in older
        # releases, from the model runner's server_args: both carry it.
        runner = StandIn("ModelRunner", file, kv_cache_dtype=torch.bfloat16, token_to_kv_pool=None,
                         req_to_token_pool=None,
                                 kv_index_translator=None, server_args=spec, dllm_config=None,
                         model_config=StandIn("ModelConfig", file, context_len=context_len))
        with bound(*_hybrid_lookups(spec_mode)), _lookups_taken(seam, file):
            return call_with(cls, seam, file, model_runner=runner, prefill_backend=kids["prefill"],
                             decode_backend=kids["decode"])
    if router == "tbo":
        with _lookups_taken(seam, file):
            return call_with(cls, seam, file, primary=kids["primary"],
                             children=[kids["tbo-child-0"], kids["tbo-child-1"]])
    if router == "dots-swa":
        with _lookups_taken(seam, file):
            return call_with(cls, seam, file, backend=kids["wrapped"])
    # A server-wide lookup only some releases' constructor makes (0.5.21 has none): bound
    # wherever this release holds it, none where it has no such function.
    lookup = lookup_patches([mod], {"check_cuda_graph_backend": lambda *a, **k: False})
    with bound(*lookup), _lookups_taken(seam, file):
        return call_with(cls, seam, file, full_attn_backend=kids["full"], linear_attn_backend=kids["linear"],
                         full_attn_layers=[_FULL_LAYER])


@contextlib.contextmanager
def _lookups_taken(seam: str, file: str):
    """A server-wide lookup the constructor made that vmfuzz's stand-ins did not answer reached the
    real one, which finds no server: vmfuzz out of step with where the lookup now is, not a
    routing defect."""
    try:
        yield
    except (ValueError, RuntimeError) as exc:
        if "not published" in str(exc):
            raise OutOfStep(seam, file, f"the constructor made a server-wide lookup vmfuzz does not stand in "
                            f"for: {exc}") from None
        raise


_ROLE_CLASSES: dict[str, type] = {}


def _role_class(name: str) -> type:
    if name not in _ROLE_CLASSES:
        _ROLE_CLASSES[name] = type(name, (ChildBackend,), {})
    return _ROLE_CLASSES[name]


_DFLASH = "sglang.srt.speculative.dflash_utils"


def _dflash_resolves(backend, kids: dict) -> tuple[str | None, bool | None]:
    """The role DFlash's verify-mask policy resolves ``backend`` to (its class name if no child's),
    and whether it builds a custom mask there; (None, None) where there is no policy."""
    from importlib.util import find_spec

    from vmfuzz.harness.model.errors import OutOfStep
    if find_spec(_DFLASH) is None:
        return None, None  # an SGLang without DFlash: nothing there to observe
    from vmfuzz.harness.targets.sglang.imports import sglang_module
    try:
        # SGLang's own raise is a finding (imports.decide); anything else is out of step, as here
        dflash = sglang_module(_DFLASH, importlib.import_module)
    except OutOfStep as exc:  # present but not importable here: its policy goes unchecked
        raise OutOfStep("resolve_dflash_verify_mask_policy", "srt/speculative/dflash_utils.py",
                        f"DFlash's policy module does not import here ({exc.why}), so "
                        "vmfuzz cannot check what it resolves each router to") from None
    resolve = getattr(dflash, "resolve_dflash_verify_mask_policy", None)
    if resolve is None:
        return None, None
    name, custom_mask = call_with(resolve, "resolve_dflash_verify_mask_policy", "srt/speculative/dflash_utils.py",
                                  attn_backend=backend)
    roles = {type(kid).__name__: role for role, kid in kids.items()}
    return roles.get(name, name), custom_mask


@dataclasses.dataclass
class _VerifyInput:
    """The verify input's fields TBO's replay split slices; a dataclass, as the split ``replace``s it.
    Its custom mask is in FULL_MASK layout, the one the split computes offsets for."""

    draft_token_num: int
    draft_token: Any
    custom_mask: Any
    seq_lens_cpu: Any
    positions: Any = None
    retrieve_index: Any = None
    retrieve_next_token: Any = None
    retrieve_next_sibling: Any = None
    retrieve_cum_len: Any = None
    seq_lens_sum: Any = None


class _ReplayChild(ChildBackend):
    """A stand-in that records the view it is handed to set up a cuda-graph replay."""

    def __init__(self, role: str, seen: dict):
        super().__init__(Child(role, None, None), [])
        self._seen = seen

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        self._seen[self.role] = _view(forward_batch)


def _view(fb) -> ReplayView:
    def listed(t):
        return [] if t is None else [int(x) for x in t.reshape(-1).tolist()]
    spec = getattr(fb, "spec_info", None)
    return ReplayView(int(fb.batch_size), listed(fb.req_pool_indices), listed(fb.seq_lens),
                      listed(fb.seq_lens_cpu), None if fb.seq_lens_sum is None else int(fb.seq_lens_sum),
                      listed(fb.input_ids), listed(fb.out_cache_loc),
                      listed(getattr(spec, "draft_token", None)), listed(getattr(spec, "custom_mask", None)))


def tbo_replay(sg, config: Config, batch: Batch) -> tuple[ReplayView, list]:
    """SGLang's ``TboAttnBackend`` setting up a TARGET_VERIFY cuda-graph replay of ``batch``
    over stand-ins: the view it was handed, and each overlap child's (None: not asked).

    Every per-request and per-token value is distinct, so a request handed to the
    wrong child, twice, or not at all shows in what the children record.
    """
    _, cls = _class("tbo")
    seen: dict = {}
    primary, *children = (_ReplayChild(role, seen) for role in ROUTERS["tbo"])
    backend = call_with(cls, f"{cls.__name__}.__init__", where(cls), primary=primary, children=children)
    bs, d = batch.bs, config.d
    seq_lens = torch.tensor(batch.seq_lens, dtype=torch.int64)
    mask_cells = sum((s + d) * d for s in batch.seq_lens)
    spec = _VerifyInput(d, torch.arange(bs * d) + 1000, torch.arange(mask_cells) + 10_000, seq_lens.clone())
    mode = sg.forward_info.ForwardMode.TARGET_VERIFY
    view = StandIn(
        "ForwardBatch", where(cls), batch_size=bs, forward_mode=mode, actual_forward_mode=mode, positions=None,
        input_ids=torch.arange(bs * d) + 100, req_pool_indices=torch.arange(bs) + 10, seq_lens=seq_lens.clone(),
        seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens.clone(), encoder_lens=None,
        out_cache_loc=torch.arange(bs * d) + 500, kv_loc_plan=None, kv_loc_cols=None, spec_info=spec,
        max_seq_len_override=None)
    call_with(backend.init_forward_metadata_out_graph, f"{cls.__name__}.init_forward_metadata_out_graph", where(cls),
              forward_batch=view, in_capture=False)
    return _view(view), [seen.get(role) for role in ROUTERS["tbo"][1:]]


def verify_routed(target, routing: Routing, config: Config, batch: Batch, heap) -> StepOutput:
    """SGLang's call site for one step, with ``routing.backend`` as the attention backend.

    ``seq_lens_sum`` is None, as when the scheduler skips that device-to-host
    sum (it does for a backend with ``needs_cpu_seq_lens`` False): the call
    site then sizes a FULL_MASK fallback from the backend's ``max_context_len``.
    """
    from vmfuzz.harness.targets.sglang import call_sites

    sg, dev = target.sglang, heap.device
    mask = routing.backend.verify_mask
    if mask is not None:
        target._draft_tokens[id(mask)] = config.d
    forward_batch, target_worker, chain = call_sites.stand_ins(sg, mask, config, batch, dev, routing.backend)
    if not getattr(routing, "needs_cpu_seq_lens", False):
        forward_batch.seq_lens_sum = None
    sel, par = tree_tensors(config, batch, dev)
    with target._routed(heap, mask) as taken:
        drafted = StandIn("draft input", _CALL_SITE, bonus_tokens=chain.bonus_tokens)
        vi = call_sites.verify_input_call(sg, forward_batch, drafted, par, sel, draft_tokens(config, batch, dev)[1],
                                          target_worker, config, dev)
    require_taken(taken, "routed eagle")
    reused = mask is not None and vi.custom_mask.data_ptr() == mask.buffer.data_ptr()
    return StepOutput(vi.custom_mask, vi.positions, vi.retrieve_index, vi.retrieve_next_token,
                      vi.retrieve_next_sibling, reused=reused, draft_token=vi.draft_token)


#: (sglang-relative path, what, why not driven): router paths no property reaches.
NOT_DRIVEN: tuple[tuple[str, str, str], ...] = (
    (_ATTN + "base_attn_backend.py", "AttentionBackend.verify_mask",
     "interface: declares the verify_mask property (None), holds no mask"),
    ("srt/model_executor/runner/decode_cuda_graph_runner.py", "DecodeCudaGraphRunner",
     "its TARGET_VERIFY __init__ (single-GPU EAGLE), capture and replay are driven by the graph properties "
     "(graph_runner.py, verify_runner_init.py: what ran is judged by measurement); not driven: the decode and "
     "draft modes' branches, multi-GPU, DP, LoRA, DLLM, DSpark's draft side (its target: dspark_verify), the "
     "DFlash capture-time custom_mask (driven under routing), and on a release whose __init__ vmfuzz cannot drive, "
     "that __init__ (the runner is then made with object.__new__, the graph properties say its set-up is not driven)"),
)
