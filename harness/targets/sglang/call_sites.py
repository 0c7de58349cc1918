"""SGLang's call sites: where a verify step decides reuse or fallback with ``fits``.

The call site, not this harness, decides: the harness builds the stand-ins a
call site reads (batch, worker, scheduler, model runner, attention backend
holding the verify mask) and calls SGLang's own function. ``Config.call_site``
picks which one runs, so a repro replays through the call site that failed:

- ``eagle``: ``eagle_worker_common.build_eagle_verify_input`` when drafting,
  ``EAGLEWorkerV2._build_trivial_verify_input`` when d = 1;
- ``chain``: ``build_eagle_verify_input`` on its ``build_chain_tree`` branch.
  A CUDA host takes that branch on its own for a topk-1 chain in QLEN_ONLY; on
  CPU the batch's ``seq_lens`` is presented as a CUDA tensor for the one check
  that reads it (the branch condition), so the same branch runs;
- ``pp``: ``Scheduler._pp_spec_rebuild_verify_input``, the pipeline-parallel
  rebuild every stage runs from the relayed draft tree;
- ``frozen_kv_mtp``: ``FrozenKVMTPDraftWorker.draft``, which hands the wrapper
  no buffer (and its default layout, FULL_MASK): every step takes the per-batch
  fallback, so what it risks is that allocation, not reuse.

The stand-ins always carry what the chain branch reads (``req_pool_indices``,
``req_to_token_pool``, ``model_is_mrope``), so on CUDA, where the ``eagle``
site takes the chain branch unasked, it has all it needs.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
from pathlib import Path

import torch

from vmfuzz.harness.guard.chain_write import chain_inputs
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang import host_default
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.reach import lookup_patches
from vmfuzz.harness.targets.sglang.seams import call_method, call_with, where
from vmfuzz.harness.targets.sglang.stand_in import StandIn, recorded
from vmfuzz.harness.model.trees import draft_tokens, tree_tensors

#: (SGLang file, function, properties that drive it): what ``vmfuzz surface`` lists.
_THROUGH_A_CALL_SITE = ("no-oob-write", "fallback-equivalence", "reference-agreement", "multi-step-reuse")
SURFACE = (
    ("srt/speculative/eagle_worker_common.py", "build_eagle_verify_input", _THROUGH_A_CALL_SITE),
    ("srt/speculative/eagle_worker_v2.py", "EAGLEWorkerV2._build_trivial_verify_input", ("trivial-path",)),
    ("srt/managers/scheduler_pp_mixin.py", "Scheduler._pp_spec_rebuild_verify_input",
     _THROUGH_A_CALL_SITE + ("trivial-path", "chain-writer")),
    ("srt/speculative/pp_spec_relay.py", "PPSpecRelayInput.topology",
     _THROUGH_A_CALL_SITE + ("trivial-path", "chain-writer")),
    ("srt/speculative/frozen_kv_mtp_worker_v2.py", "FrozenKVMTPDraftWorker.draft", _THROUGH_A_CALL_SITE),
)

#: (sglang-relative path, what, why not driven)
NOT_DRIVEN = (
    ("srt/speculative/frozen_kv_mtp_worker_v2.py", "FrozenKVMTPDraftWorker.draft_forward",
     "the draft model's loop is a stand-in (its cuda-graph runner returns the case's draft tree); "
     "draft() from there on, the wrapper's fallback and the verify input, is SGLang's"),
)


class _SeenAsCuda(torch.Tensor):
    """A CPU tensor whose ``is_cuda`` answers True: the chain branch's condition, bound for one call.

    Torch functions on it return plain tensors, so nothing past that one check
    (the kernel launch included) sees anything but the CPU tensor it is.
    """

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def is_cuda(self) -> bool:  # noqa: D401
        return True


def available(sg) -> tuple[str, ...]:
    """The call sites this SGLang has, found from its code, not its version.

    The pp rebuild is looked for in the mixin's source text, so a run that never
    draws it does not pay for importing the scheduler stack.
    """
    sites = ["eagle"]
    if sg.build_chain_tree is not None and getattr(sg.call_site, "build_chain_tree", None) is not None:
        sites.append("chain")
    if "def _pp_spec_rebuild_verify_input" in _source_of("sglang.srt.managers.scheduler_pp_mixin") \
            and importlib.util.find_spec("sglang.srt.speculative.pp_spec_relay") is not None:
        sites.append("pp")
    frozen = _source_of("sglang.srt.speculative.frozen_kv_mtp_worker_v2")
    if "class FrozenKVMTPDraftWorker" in frozen and "build_tree_kernel_efficient(" in frozen:
        sites.append("frozen_kv_mtp")
    return tuple(sites)


def _source_of(module: str) -> str:
    """A module's source text, found without importing it ("" when it is absent)."""
    spec = importlib.util.find_spec(module)
    try:
        return Path(spec.origin).read_text() if spec and spec.origin else ""
    except OSError:
        return ""


_FROZEN = "srt/speculative/frozen_kv_mtp_worker_v2.py"
#: the SGLang file whose call site reads the backend's verify mask, by call site (d = 1 reads it in the worker)
_READS_THE_MASK = {"eagle": "srt/speculative/eagle_worker_common.py", "chain": "srt/speculative/eagle_worker_common.py",
                   "pp": "srt/managers/scheduler_pp_mixin.py", "trivial": "srt/speculative/eagle_worker_v2.py"}


def stand_ins(sg, mask, config: Config, batch: Batch, dev, backend=None):
    """(batch, target worker, chain inputs): only what SGLang's call sites read.

    Every call site but the frozen-KV MTP draft (which hands the wrapper no buffer)
    decides reuse from the backend's ``verify_mask``: there it is load-bearing, so a
    call site that no longer reads it there is out of step, whatever it then does.
    ``backend``: SGLang's own backend (a router) in the stand-in's place.
    """
    bs = batch.bs
    chain = chain_inputs(batch.seq_lens, config.d, config.max_context_len, dev)
    seq_lens = chain.seq_lens
    site = "trivial" if config.trivial and config.call_site == "eagle" else config.call_site
    reads = _READS_THE_MASK.get(site)
    backend = backend if backend is not None else StandIn(
        "attention backend's verify_mask", reads or _FROZEN,
                      load_bearing=("verify_mask",) if reads else (),
                      verify_mask=mask, max_context_len=config.max_context_len)
    model_runner = StandIn("model runner", reads or "", attn_backend=backend,
                           model_config=StandIn("model config", "", context_len=config.max_context_len,
                                                # the chain branch then writes M-RoPE
                                                # positions too, under the guard
                                                model_is_mrope=not config.trivial))
    target_worker = StandIn("target worker", reads or "", model_runner=model_runner)
    forward_batch = StandIn(
        "ForwardBatch", "srt/model_executor/forward_batch_info.py",
        forward_mode=sg.forward_info.ForwardMode.DECODE,
        seq_lens=seq_lens,
        # The exact sum sizes the wrapper's FULL_MASK fallback tightly, so a
        # short fallback allocation overflows instead of hiding in slack.
        seq_lens_sum=int(sum(batch.seq_lens)),
        seq_lens_cpu=seq_lens.cpu(),
        spec_info=StandIn("draft input", "srt/speculative/eagle_info.py", bonus_tokens=chain.bonus_tokens),
        multimodal_inputs=[None] * bs,
        req_pool_indices=chain.req_pool_indices,
        req_to_token_pool=StandIn("req-to-token pool", "srt/mem_cache/memory_pool.py", req_to_token=chain.req_to_token),
        reqs=[StandIn("Req", "srt/managers/schedule_batch.py", rid=f"req{b}") for b in range(bs)],
        batch_size=lambda: bs,
    )
    return forward_batch, target_worker, chain


def build_verify_input(sg, mask, config: Config, batch: Batch, dev):
    """One verify step through the call site ``config.call_site`` names."""
    forward_batch, target_worker, chain = stand_ins(sg, mask, config, batch, dev)
    if config.call_site == "pp":
        return pp_rebuild(sg, forward_batch, target_worker, chain, config, batch, dev)
    if config.call_site == "frozen_kv_mtp":
        return frozen_kv_mtp_draft(sg, forward_batch, chain, config, batch, dev)
    if config.trivial:
        return trivial(sg, forward_batch, target_worker, config, dev)
    if config.call_site == "chain" and not forward_batch.seq_lens.is_cuda:
        forward_batch.seq_lens = forward_batch.seq_lens.as_subclass(_SeenAsCuda)
    sel, par = tree_tensors(config, batch, dev)
    return verify_input_call(sg, forward_batch, StandIn("draft input", "srt/speculative/eagle_worker_common.py",
                                                        bonus_tokens=chain.bonus_tokens), par, sel,
                             draft_tokens(config, batch, dev)[1], target_worker, config, dev)


def verify_input_call(sg, forward_batch, draft_input, parent_list, top_scores_index, drafted, target_worker,
                      config: Config, dev):
    """``build_eagle_verify_input``, each argument handed by the parameter name SGLang gives it."""
    fn = sg.call_site.build_eagle_verify_input
    return call_with(fn, "build_eagle_verify_input", "srt/speculative/eagle_worker_common.py",
                     batch=forward_batch, draft_input=draft_input, parent_list=parent_list,
                     top_scores_index=top_scores_index, draft_tokens=drafted, draft_probs=None,
                     target_worker=target_worker, topk=config.topk, num_steps=config.spec_steps,
                     num_draft_tokens=config.d, tree_mask_mode=sg.Mode(int(config.mode)), device=str(dev))


def trivial(sg, forward_batch, target_worker, config: Config, dev):
    """``EAGLEWorkerV2._build_trivial_verify_input``: d = 1, no drafting."""
    worker_cls = sg.worker_v2.EAGLEWorkerV2
    if not callable(getattr(worker_cls, "_build_trivial_verify_input", None)):
        raise OutOfStep("EAGLEWorkerV2._build_trivial_verify_input", "srt/speculative/eagle_worker_v2.py",
                        "not found: the d = 1 call site vmfuzz drives has moved")
    worker = worker_cls.__new__(worker_cls)  # only the attributes the trivial path reads
    for attr, value in (("_target_worker", target_worker), ("target_worker", target_worker),
                        ("topk", config.topk), ("device", str(dev))):
        with contextlib.suppress(AttributeError):
            setattr(worker, attr, value)
    return call_method(worker, "_build_trivial_verify_input", batch=forward_batch)


def pp_rebuild(sg, forward_batch, target_worker, chain, config: Config, batch: Batch, dev, relay_order=None):
    """``Scheduler._pp_spec_rebuild_verify_input``: the verify input rebuilt from the relay.

    The relay carries the last stage's draft tree (tokens and topology) per
    request, as ``PPSpecRelayInput``; the scheduler stand-in has what the rebuild
    reads (its device and the target worker). ``relay_order``: the order the
    relay's rows come in (indices into the batch's requests; the batch's own by
    default), so a rebuild whose batch was recomposed behind the relay's back
    re-indexes it by request id.
    """
    pp = sg.pp()
    sel, par = tree_tensors(config, batch, dev)
    tokens = torch.cat([chain.bonus_tokens.view(-1, 1), draft_tokens(config, batch, dev)[1]], 1)
    rids = [r.rid for r in forward_batch.reqs]
    if relay_order is not None:
        take = torch.tensor(relay_order, dtype=torch.long)
        rids, tokens, par, sel = [rids[i] for i in relay_order], tokens[take], par[take], sel[take]
    forward_batch.spec_info = pp.relay(rids=rids, tokens=tokens, parents=par, top_scores=sel)
    return pp_call(sg, forward_batch, target_worker, config, dev)


def pp_call(sg, forward_batch, target_worker, config: Config, dev):
    """The pp rebuild of ``forward_batch`` (its relay already on it) on a scheduler stand-in.

    The spec config the rebuild reads through ``get_spec`` and the device's
    default layout (taken when the backend owns no mask) are bound to the
    config's for the one call.
    """
    pp = sg.pp()
    if not callable(getattr(pp.mixin, "_pp_spec_rebuild_verify_input", None)):
        raise OutOfStep("SchedulerPPMixin._pp_spec_rebuild_verify_input", "srt/managers/scheduler_pp_mixin.py",
                        "not found: the pp call site vmfuzz drives has moved")
    scheduler = pp.mixin.__new__(pp.mixin)
    scheduler.device = str(dev)
    scheduler.tp_worker = target_worker
    spec = StandIn("server's speculative config", _READS_THE_MASK["pp"], speculative_num_steps=config.spec_steps,
                   speculative_num_draft_tokens=config.d, speculative_eagle_topk=config.topk)
    layout = sg.Mode(int(config.mode))
    rebuild = pp.mixin._pp_spec_rebuild_verify_input
    answer = host_default.answering(default_layout_function(sg, rebuild), host_default.host_of(layout.name), layout)
    chosen = [(owner, name, answer) for owner, name in default_layout_holders(sg, rebuild)]
    # The rebuild reads the draft shape from get_spec: load-bearing, so a rebuild that takes it from
    # elsewhere is out of step. Bound where it reaches get_spec (its import, or its home module);
    # none found is out of step too (``bound`` says so).
    get_spec = recorded(lambda: spec, "get_spec", _READS_THE_MASK["pp"], load_bearing=True)
    asked = lookup_patches([pp.module], {"get_spec": get_spec}) or [(pp.module, "get_spec", get_spec)]
    with bound(*asked, *chosen):
        call_method(scheduler, "_pp_spec_rebuild_verify_input", batch=forward_batch)
    return forward_batch.spec_info


#: the function SGLang asks for the device's default layout
DEFAULT_LAYOUT = "default_tree_mask_mode"


def default_layout_holders(sg, caller) -> list[tuple]:
    """(module, name) for every name the device's default-layout function is bound to in SGLang.

    The function is the one ``caller`` imports (at call time or at its module's
    import), else eagle_utils' own; binding each module that holds that very
    object follows it wherever it now lives, re-exports included, instead of
    one module's copy of its name, or the private platform flag it reads.
    """
    fn = default_layout_function(sg, caller)
    # Scanning every SGLang module's names costs more than the step it binds (about 17 ms a
    # verify step): the holders found are kept until a module is imported or one stops holding fn.
    key = (id(fn), len(sys.modules))
    held = _HOLDERS.get(key)
    if held is None or any(vars(module).get(name) is not fn for module, name in held):
        held = [(module, name) for k, module in list(sys.modules.items()) if k.split(".")[0] == "sglang"
                for name, value in list(vars(module).items()) if value is fn]
        _HOLDERS.clear()
        _HOLDERS[key] = held
    return list(held)


_HOLDERS: dict[tuple[int, int], list[tuple]] = {}


def default_layout_function(sg, caller):
    """The device's default-layout function ``caller`` reaches (its import, else eagle_utils' own)."""
    fn = _imported_by(caller, DEFAULT_LAYOUT) or getattr(sg.eagle_utils, DEFAULT_LAYOUT, None)
    if not callable(fn):
        raise OutOfStep(DEFAULT_LAYOUT, where(caller), f"{caller.__qualname__} imports no {DEFAULT_LAYOUT} and "
                        "eagle_utils has none: vmfuzz cannot choose the layout it falls back to")
    return fn


def _imported_by(caller, name: str):
    """What ``caller`` gets under ``name``: read from its ``from M import name`` (however aliased)
    in its own body, else its module's global."""
    import importlib
    code = getattr(caller, "__code__", None)
    source = _import_source(code, name) if code is not None else _import_source.__wrapped__(caller, name)
    if source is not None:
        with contextlib.suppress(Exception):
            return getattr(importlib.import_module(source), name)
    return getattr(sys.modules.get(caller.__module__), name, None)


@functools.lru_cache(maxsize=None)
def _import_source(code, name: str) -> str | None:
    """The module a function's own ``from M import name`` names, read once per code object
    (``code`` may be any object inspect finds the source of)."""
    import ast
    import textwrap

    from vmfuzz.harness.targets.sglang import source_text
    try:
        tree = ast.parse(textwrap.dedent(source_text.of(code)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level \
                and any(alias.name == name for alias in node.names):
            return node.module
    return None


class _DraftGraph:
    """Stands for the draft worker's cuda-graph runner: replays "the draft model" by handing
    out the config's draft tree, the way the captured graph returns the draft loop's output."""

    def __init__(self, parent_list, top_scores_index, draft_tokens):
        self._out = (parent_list, top_scores_index, draft_tokens)

    def can_run_graph(self, forward_batch) -> bool:
        return True

    def execute(self, forward_batch):
        return self._out


def frozen_kv_mtp_draft(sg, forward_batch, chain, config: Config, batch: Batch, dev):
    """``FrozenKVMTPDraftWorker.draft``: its draft step, ending in the wrapper call with no buffer.

    What precedes the wrapper call is the draft model's own work: the positions it
    reads, the draft-model ``ForwardBatch`` and its topk expansion, and the draft
    loop, which its cuda-graph runner replays. Those are stand-ins (the loop's
    output is the config's draft tree); everything from the wrapper call on --
    the fallback allocation sized from the batch's own length sum, the kernel,
    and the verify input it builds -- is SGLang's.
    """
    fz = sg.frozen()
    sel, par = tree_tensors(config, batch, dev)
    worker = fz.worker.__new__(fz.worker)
    graph = _DraftGraph(par, sel, draft_tokens(config, batch, dev)[1])
    for attr, value in (("topk", config.topk), ("speculative_num_steps", config.spec_steps),
                        ("speculative_num_draft_tokens", config.d), ("_model_runner", None),
                        ("cuda_graph_runner", graph),
                        ("_position_for_batch", lambda b: b.seq_lens),
                        ("_set_positions", lambda fb: None), ("_expand_for_topk_draft", lambda fb: None)):
        object.__setattr__(worker, attr, value)
    draft_input = fz.draft_input.__new__(fz.draft_input)
    draft_input.bonus_tokens = chain.bonus_tokens
    forward_batch.spec_info = draft_input
    # The draft model's ForwardBatch: only the field the draft step asserts on.
    draft_batch = StandIn("ForwardBatch", _FROZEN, init_new=lambda *a, **k: StandIn(
        "draft ForwardBatch", _FROZEN, capture_hidden_mode=fz.module.CaptureHiddenMode.LAST))
    with bound((fz.module, "ForwardBatch", draft_batch)):
        return call_method(worker, "draft", batch=forward_batch)
