"""The accept and KV-location step of one EAGLE iteration, driven through SGLang's own code.

For one ``KvCase`` (``harness/model/kv_locations.py``) this runs, in SGLang's order:

1. the **allocation** sizing: ``allocation_sizing.page_aligned_decode_alloc_lens`` with the
   reserve SGLang computes (``get_alloc_reserve_per_decode``), and the ``req_to_token`` row
   headroom (``get_req_to_token_extra_context_len``), SGLang's runtime context stood in by
   the case's draft shape and page size;
2. the **draft** window: ``eagle_worker_common.prepare_for_draft`` (its contiguous Triton
   launch for P = 1 or topk 1, its torch gather and ``duplicate_prefix_tail_to_draft_branches``
   for a paged tree), ``ForwardBatch.init_new`` stood in (the forward batch is not this step's);
3. the **verify** window: ``assign_extend_cache_locs_uniform_func`` as ``eagle_prepare_for_verify``
   calls it, its Triton-device branch; then the producer with its fused outputs (``kv_translation``:
   ``plan_uniform_extend`` on a translating pool, the wrapper's fallback branch), its plan's reads
   (``kv_plan_reads``), and a DeepSeek V4 layer's sliding-window KV store of it (``swa_store``);
4. the **accept** step: ``run_eagle_verify`` itself, from the target's logits on: the real
   ``eagle_sample`` (greedy; ``verify_tree_greedy_func`` is SGLang's Triton implementation,
   the branch an XPU host takes, since this host's has no kernel), its bonus tokens
   (``fill_bonus_tokens_func`` with the stride ``run_eagle_verify`` passes), and for topk > 1
   ``_finalize_accept_tree_path`` (``move_accept_tokens_to_target_kvcache``,
   ``fill_front_out_cache_loc_func``, ``fill_accept_out_cache_loc_func``,
   ``_compact_accept_to_front``). ``eagle_prepare_for_verify`` is stood in by step 3's window
   (the forward batch it builds is not this step's) and the target forward by logits that
   accept exactly the case's paths;
5. for a chain draft (topk 1, ``d = spec_steps + 1``) ``eagle_sample`` again, on its sampling
   branch: rejection sampling (``chain_speculative_sampling_triton``, per token and with block
   verification) from point-mass distributions (the target's all on its prediction, the draft's all
   on its token), under which rejection sampling accepts exactly the greedy path and resamples the
   target's prediction, whatever the coins. The temperatures are therefore not judged (a point mass
   is the same at every temperature), nor the CUDA-only target-only sampler.

``req_to_token`` is a redzoned shadow buffer whose every cell names its own row and column
(slot ``1 + row·R + column``), so any slot a kernel hands back says where it was read from;
the kernels' outputs and the accept index are redzoned too.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.kv_locations import KvCase
from vmfuzz.harness.targets.sglang.backend_init import uninstalled_stubbed
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.graph_lookups import fitted
from vmfuzz.harness.targets.sglang.kv_allocation import allocation, spec_context
from vmfuzz.harness.targets.sglang.kv_launches import draft_launch, greedy_walk
from vmfuzz.harness.targets.sglang.kv_plan_reads import PlanReads, run_reads
from vmfuzz.harness.targets.sglang.kv_plan_reads import absent as reads_absent
from vmfuzz.harness.targets.sglang.kv_plan_reads import not_driven as reads_not_driven
from vmfuzz.harness.targets.sglang.kv_translation import Translated, run_windows
from vmfuzz.harness.targets.sglang.swa_store import SwaStores, run_stores

COMMON = "srt/speculative/eagle_worker_common.py"
#: What this module drives, for ``vmfuzz surface`` and the gate.
SURFACE: tuple = (
    ("srt/mem_cache/allocation_sizing.py", "get_alloc_len_per_decode", ("kv-location-soundness",)),
    ("srt/mem_cache/allocation_sizing.py", "get_alloc_reserve_per_decode", ("kv-location-soundness",)),
    ("srt/mem_cache/allocation_sizing.py", "page_aligned_decode_alloc_lens", ("kv-location-soundness",)),
    ("srt/mem_cache/allocation_sizing.py", "get_req_to_token_extra_context_len", ("kv-location-soundness",)),
    (COMMON, "prepare_for_draft", ("kv-location-soundness",)),
    (COMMON, "duplicate_prefix_tail_to_draft_branches", ("kv-location-soundness",)),
    (COMMON, "run_eagle_verify", ("kv-location-soundness",)),
    (COMMON, "_finalize_accept_tree_path", ("kv-location-soundness",)),
    (COMMON, "_compact_accept_to_front", ("kv-location-soundness",)),
    ("kernels/ops/speculative/cache_locs.py", "assign_draft_cache_locs_contiguous_func", ("kv-location-soundness",)),
    ("kernels/ops/speculative/cache_locs.py", "assign_draft_cache_locs_contiguous", ("kv-location-soundness",)),
    ("kernels/ops/speculative/cache_locs.py", "assign_extend_cache_locs_uniform", ("kv-location-soundness",)),
    ("kernels/ops/speculative/cache_locs.py", "assign_extend_cache_locs_uniform_func", ("kv-location-soundness",)),
    ("kernels/ops/speculative/cache_locs.py", "assign_extend_cache_locs_func", ("kv-location-soundness",)),
    ("kernels/ops/speculative/cache_locs.py", "assign_extend_cache_locs", ("kv-location-soundness",)),
    ("srt/mem_cache/kv_index_translator.py", "KVIndexTranslator.plan_uniform_extend", ("kv-location-soundness",)),
    ("srt/mem_cache/kv_index_translator.py", "KVIndexTranslator.plan", ("kv-location-soundness",)),
    ("kernels/ops/speculative/cache_locs.py", "fill_front_out_cache_loc_func", ("kv-location-soundness",)),
    ("srt/speculative/spec_utils.py", "move_accept_tokens_to_target_kvcache", ("kv-location-soundness",)),
    ("srt/speculative/eagle_utils.py", "eagle_sample", ("kv-location-soundness",)),
    ("kernels/ops/speculative/eagle.py", "fill_bonus_tokens_func", ("kv-location-soundness",)),
    ("kernels/ops/speculative/eagle.py", "prepare_verify_commit_outputs", ("kv-location-soundness",)),
    ("kernels/ops/speculative/eagle.py", "fill_bonus_tokens", ("kv-location-soundness",)),
    ("kernels/ops/speculative/eagle.py", "fill_accept_out_cache_loc_func", ("kv-location-soundness",)),
    ("kernels/ops/speculative/eagle.py", "fill_accept_out_cache_loc", ("kv-location-soundness",)),
    ("kernels/ops/speculative/spec_tree.py", "verify_tree_greedy_triton", ("kv-location-soundness",)),
)
#: What it reaches but does not drive, and why.
NOT_DRIVEN: tuple = (
    ("srt/speculative/eagle_utils.py", "eagle_prepare_for_verify",
     "builds the target's forward batch (a model runner's); its window is driven as it calls it, through assign_extend_cache_locs_uniform"),
)

#: A vocabulary wide enough for the tokens the driver names (draft 2000+, target 7000+).
_VOCAB_BASE_DRAFT, _VOCAB_BASE_TARGET = 2000, 7000


@dataclass
class KvWrites:
    """What SGLang's code computed and wrote for one case, as plain lists (slots are ``req_to_token``
    cells: slot ``1 + row·R + column``)."""

    reserve: int = 0
    alloc_lens: list[int] = field(default_factory=list)  # nxt per request
    alloc_asked: tuple[list[int], int] | None = None  # (cur per request, tokens asked of the allocator)
    extra_context: int = 0  # row headroom past the context length
    row_width: int = 0  # R
    pool_rows: list[int] = field(default_factory=list)  # req_to_token row of each request
    draft_slots: list[int] = field(default_factory=list)  # bs·k·n, SGLang's (b, t, i) order
    draft_copies: list[tuple[int, int]] = field(default_factory=list)  # (target, source) slot moves
    verify_slots: list[int] = field(default_factory=list)  # bs·d
    accept_index_shape: tuple[int, ...] = ()
    accept_index: list[list[int]] = field(default_factory=list)
    accept_lens: list[int] = field(default_factory=list)
    bonus_tokens: list[int] = field(default_factory=list)
    new_seq_lens: list[int] = field(default_factory=list)  # what the verify commits as each request's length
    # the same verify as a CUDA host commits it (the fused kernel), where this SGLang has that branch
    fused_bonus_tokens: list[int] | None = None
    fused_new_seq_lens: list[int] | None = None
    target_tokens: list[list[int]] = field(default_factory=list)  # what the target predicted at each node
    accept_moves: list[tuple[int, int]] | None = None  # None: no move (topk 1)
    compacted: list[int] | None = None  # predict after _compact_accept_to_front
    windows: Translated | None = None  # the verify window's producer, plain and with its fused outputs
    swa: SwaStores | None = None  # DeepSeek V4's SWA store of the verify window, per branch (``swa_store``)
    reads: PlanReads | None = None  # the plan's reads on a translating pool (None: not read, below why)
    reads_absent: str | None = None  # why this SGLang has no plan to read
    reads_not_driven: str | None = None  # why its plan, which it has, was not read
    # the sampling branch's runs: (variant, accept index rows, accept lengths, predict), or why not driven
    sampled: list[tuple[str, list[list[int]], list[int], list[int]]] = field(default_factory=list)
    sampled_not_driven: str = ""
    violations: list = field(default_factory=list)

    def slot_of(self, row: int, column: int) -> int:
        return 1 + row * self.row_width + column

    def where(self, slot: int) -> tuple[int, int] | None:
        """(row, column) a slot names, None for a value no cell of req_to_token holds."""
        if slot < 1 or slot > len(self.pool_rows_all) * self.row_width:
            return None
        return divmod(slot - 1, self.row_width)

    pool_rows_all: list[int] = field(default_factory=list)


class _KvPool:
    """The KV pool's one call these steps make: record each move (target slot, source slot)."""

    def __init__(self):
        self.moves: list[tuple[int, int]] = []

    def move_kv_cache(self, tgt, src):
        self.moves.extend(zip((int(v) for v in tgt.reshape(-1)), (int(v) for v in src.reshape(-1))))

    def get_kvcache(self):
        return self


def run_case(sg, case: KvCase, heap: ShadowHeap) -> KvWrites:
    """Drive one case through SGLang's code (``sg``: the modules, ``kv_modules``)."""
    w = KvWrites()
    w.reserve, w.alloc_lens, w.extra_context, w.alloc_asked = allocation(sg, case)
    bs, k, n, d, R = case.bs, case.topk, case.spec_steps, case.d, case.context_len + w.extra_context
    w.row_width = R
    rows = bs + 1  # row 0 stays the pool's reserved row; request b gets row bs - b (not its index)
    w.pool_rows = [bs - b for b in range(bs)]
    w.pool_rows_all = list(range(rows))
    table = heap.alloc("req_to_token", (rows, R), torch.int32, redzone_cells=4 * R + 64)
    table.copy_(1 + torch.arange(rows * R, dtype=torch.int32).view(rows, R))
    rpi = torch.tensor(w.pool_rows, dtype=torch.int64)
    seq_lens = torch.tensor(case.seq_lens, dtype=torch.int64)
    pool = _KvPool()

    # -- the draft window
    common = sg.common
    batch = SimpleNamespace(forward_mode=sg.ForwardMode.DECODE, seq_lens=seq_lens.clone(), req_pool_indices=rpi,
                            seq_lens_cpu=seq_lens.clone(), device="cpu", multimodal_inputs=[None] * bs,
                            token_to_kv_pool_allocator=SimpleNamespace(page_size=case.page_size), out_cache_loc=None,
                            # the pool a release's accept-move reads its targets from (0.5.22: the rows, not the window)
                            req_to_token_pool=SimpleNamespace(req_to_token=table),
                            # no hybrid (mamba) layers: the fused commit of a chain tracks no mamba state
                            mamba_track_indices=None)
    runner = SimpleNamespace(model_config=SimpleNamespace(model_is_mrope=False), token_to_kv_pool=pool,
                             spec_algorithm=SimpleNamespace(is_standalone=lambda: False))
    stand_in_batch = SimpleNamespace(init_new=lambda *a, **kw: SimpleNamespace(stand_in="draft forward batch"))
    with bound((common, "ForwardBatch", stand_in_batch), draft_launch(common, heap, reach=4 * k * n)):
        common.prepare_for_draft(SimpleNamespace(), SimpleNamespace(req_to_token=table), batch, None, runner, k, n)
    w.draft_slots = [int(v) for v in batch.out_cache_loc.reshape(-1)]
    w.draft_copies, pool.moves = pool.moves, []

    # -- the verify window: SGLang's wrapper as eagle_prepare_for_verify calls it, then its fused launches
    w.windows = run_windows(sg, heap, table, rpi, seq_lens, d, case.page_size)
    w.verify_slots = w.windows.plain
    # the plan's reads, where this SGLang has a plan: 0.5.22's reads it though its producer has no fused launch
    w.reads_absent = reads_absent(sg)
    w.reads_not_driven = None if w.reads_absent else reads_not_driven(sg)
    if not w.reads_absent and not w.reads_not_driven:
        w.reads = run_reads(sg, heap, rows, R, rpi, seq_lens, d, case.page_size)
    # the accept step reads the window as the verify forward left it: redzoned, so a read past it is seen
    window = heap.adopt("verify out_cache_loc", torch.tensor(w.verify_slots, dtype=torch.int64), 4 * d)
    w.swa = run_stores(case, window, w.pool_rows, rows * R + 1)  # as a DeepSeek V4 layer's SWA store writes it

    # -- the accept step
    _accept(sg, case, w, heap, batch, window, pool)
    _sampled_accept(sg, case, w)
    w.violations = heap.check()
    return w


def _verify_input(sg, case: KvCase):
    """The verify input's tree as the tree kernel lays it out: node x of request b is ``b·d + x``,
    children linked in ascending order; draft token of node x ``2000 + b·d + x``."""
    bs, d = case.bs, case.d
    nxt = torch.full((bs, d), -1, dtype=torch.int64)
    sib = torch.full((bs, d), -1, dtype=torch.int64)
    for b, par in enumerate(case.parents):
        for p in range(d):
            kids = [c for c in range(1, d) if par[c] == p]
            if kids:
                nxt[b, p] = kids[0]
            for a, c in zip(kids, kids[1:]):
                sib[b, a] = c
    draft = torch.tensor([_VOCAB_BASE_DRAFT + b * d + x for b in range(bs) for x in range(d)], dtype=torch.int64)
    return SimpleNamespace(draft_token=draft, draft_token_num=d, max_tree_depth=case.spec_steps + 1,
                           tree_topk=case.topk, retrieve_index=torch.arange(bs * d, dtype=torch.int64).view(bs, d),
                           retrieve_next_token=nxt, retrieve_next_sibling=sib, custom_mask=None, positions=None,
                           prepared_out_cache_loc=None, kv_loc_plan=None, prepared_mrope_positions=None,
                           seq_lens_cpu=None, seq_lens_sum=None)


def _target_tokens(case: KvCase) -> list[list[int]]:
    """What the target predicts at each node: the next node of the accepted path's draft token along
    the path, a token no draft node carries elsewhere (so the walk stops where the path ends)."""
    out = []
    for b, path in enumerate(case.paths):
        row = [_VOCAB_BASE_TARGET + b * case.d + x for x in range(case.d)]
        for here, there in zip(path, path[1:]):
            row[here] = _VOCAB_BASE_DRAFT + b * case.d + there
        out.append(row)
    return out


def _accept(sg, case: KvCase, w: KvWrites, heap: ShadowHeap, batch, window, pool: _KvPool) -> None:
    bs, d = case.bs, case.d
    vocab = _VOCAB_BASE_TARGET + bs * d + 1
    w.target_tokens = _target_tokens(case)
    logits = torch.zeros((bs * d, vocab), dtype=torch.float32)
    logits[torch.arange(bs * d), torch.tensor([t for row in w.target_tokens for t in row])] = 1.0
    hidden = torch.arange(bs * d, dtype=torch.float32).view(bs * d, 1)
    verify_input = _verify_input(sg, case)
    sampling = SimpleNamespace(acc_additive_penalties=None, acc_scaling_penalties=None, logit_bias=None,
                               is_all_greedy=True, has_watermark_candidates=False)
    batch.spec_info = verify_input
    batch.sampling_info = sampling
    batch.has_grammar = False
    batch.return_logprob = False
    batch.hisparse_coordinator = None
    batch.input_ids = None
    out = {}

    def prepare_for_verify(verify_input, req_to_token_pool, batch, target_worker):
        batch.input_ids = verify_input.draft_token
        batch.out_cache_loc = window
        batch.forward_mode = sg.ForwardMode.TARGET_VERIFY
        return SimpleNamespace(stand_in="verify forward batch"), False

    def real_sample(*args, **kwargs):
        predict, accept_lens, accept_index = sg.eagle_utils.eagle_sample(*args, **kwargs)
        out["accept_index"] = accept_index.clone()
        if out.get("fused"):
            # what a CUDA host's sampler hands back: its verify then commits through the fused Triton kernel
            # (the prediction's own is_cuda is that branch's test), run here in Triton's interpreter
            from vmfuzz.harness.targets.sglang.call_sites import _SeenAsCuda
            predict = predict.as_subclass(_SeenAsCuda)
        # the same values in a redzoned allocation: a read past the accept index lands in a redzone
        return predict, accept_lens, heap.adopt(f"accept_index{' (fused commit)' if out.get('fused') else ''}",
                                                accept_index, accept_index.numel() * 4 + 64)

    forward_out = SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=hidden),
                                  routed_experts_output=None, indexer_topk_output=None)
    model_runner = SimpleNamespace(watermark_state=None, attn_backend=SimpleNamespace(verify_mask=None),
                                   spec_algorithm=SimpleNamespace(is_standalone=lambda: False))
    worker = SimpleNamespace(model_runner=model_runner, forward_batch_generation=lambda **kw: forward_out)
    spec, _, _ = spec_context(case)
    fresh = dict(vars(batch))  # a second verify of the same batch starts from what the first was handed

    def verify(on, kv_pool):
        with bound((sg.common, "eagle_prepare_for_verify", prepare_for_verify),
                   (sg.common, "eagle_sample", real_sample),
                   (sg.common, "commit_mamba_states_after_verify", lambda *a, **kw: None),
                   (sg.eagle_utils, "verify_tree_greedy_func", greedy_walk(sg)),
                   (sg.eagle_utils, "get_spec", lambda: spec),
                   *one_rank_group(sg, SimpleNamespace(world_size=1))):
            run = sg.common.run_eagle_verify
            # 0.5.17 is also handed the draft's steps; a signature that takes other arguments is refused
            # before the call (``fitted``: out of step), never a raise of SGLang's
            steps = {"num_steps": case.spec_steps} if "num_steps" in inspect.signature(run).parameters else {}
            return fitted(run, "run_eagle_verify")(
                batch=on, target_worker=worker, req_to_token_pool=SimpleNamespace(req_to_token=None),
                token_to_kv_pool_allocator=kv_pool, plan_stream=None, plan_stream_ctx=contextlib.nullcontext(),
                topk=case.topk, num_draft_tokens=d, device="cpu", metadata_ready_pre_pad=False,
                finalize_tree_path=True, **steps)
    result = verify(batch, pool)
    accept_index = out["accept_index"]
    w.accept_index_shape = tuple(accept_index.shape)
    w.accept_index = [[int(v) for v in row] for row in accept_index.view(bs, -1)]
    w.accept_lens = [int(v) for v in result.accept_lens]
    w.bonus_tokens = [int(v) for v in result.next_draft_input.bonus_tokens]
    w.new_seq_lens = [int(v) for v in result.new_seq_lens]
    if case.topk > 1:
        w.accept_moves = list(pool.moves)
        w.compacted = [int(v) for v in result.next_token_ids]
    # a CUDA host's fused commit (the kernel's wrapper among run_eagle_verify's names: 0.5.22 on)
    if callable(getattr(sg.common, "prepare_verify_commit_outputs", None)):
        out["fused"] = True
        fused = verify(SimpleNamespace(**fresh), _KvPool())
        w.fused_bonus_tokens = [int(v) for v in fused.next_draft_input.bonus_tokens]
        w.fused_new_seq_lens = [int(v) for v in fused.new_seq_lens]


def _sampled_accept(sg, case: KvCase, w: KvWrites) -> None:
    """``eagle_sample``'s rejection-sampling branch on point masses (module docstring, step 5)."""
    if case.topk != 1 or case.d != case.spec_steps + 1:
        # SGLang's chain sampler walks the candidates in index order as one chain and writes the
        # accept index at the retrieve index's stride: a chain draft's shape only
        w.sampled_not_driven = "rejection sampling verifies a chain draft (topk 1, d = spec_steps + 1)"
        return
    bs, d = case.bs, case.d
    vocab = _VOCAB_BASE_TARGET + bs * d + 1
    logits = torch.full((bs * d, vocab), -1e30, dtype=torch.float32)  # a point mass after softmax
    logits[torch.arange(bs * d), torch.tensor([t for row in w.target_tokens for t in row])] = 0.0
    verify_input = _verify_input(sg, case)
    draft = verify_input.draft_token.view(bs, d)
    # the draft's distribution at each step: all on the token it proposed for the next slot
    verify_input.draft_probs = torch.zeros((bs, d - 1, vocab), dtype=torch.float32)
    verify_input.draft_probs.scatter_(2, draft[:, 1:].unsqueeze(-1), 1.0)
    sampling = SimpleNamespace(acc_additive_penalties=None, acc_scaling_penalties=None, logit_bias=None,
                               is_all_greedy=False, has_watermark_candidates=False, need_top_k_sampling=False,
                               need_top_p_sampling=False, sampling_seed=None,
                               temperatures=torch.linspace(0.5, 1.5, bs).view(bs, 1))
    batch = SimpleNamespace(forward_mode=sg.ForwardMode.TARGET_VERIFY, device="cpu", return_logprob=False,
                            seq_lens=torch.tensor(case.seq_lens, dtype=torch.int64), sampling_info=sampling)
    one_rank = SimpleNamespace(world_size=1)  # one tensor-parallel rank: nothing to broadcast
    parallel = SimpleNamespace(tp_group=one_rank, attn_tp_group=one_rank)
    for block in (False, True):
        spec = SimpleNamespace(speculative_use_rejection_sampling=True, speculative_use_block_verification=block,
                               speculative_accept_threshold_single=1.0, speculative_accept_threshold_acc=1.0)
        output = SimpleNamespace(next_token_logits=logits.clone())
        try:
            # a release whose CPU sampling branch imports its top-k/top-p renormalisation from sgl_kernel's
            # compiled ops (0.5.21, 0.5.22) calls neither here (no top-k or top-p asked): stubbed, so the
            # branch runs as written; a call into one raises and says so
            with bound((sg.eagle_utils, "get_spec", lambda spec=spec: spec),
                       (sg.runtime_context, "get_parallel", lambda: parallel), *one_rank_group(sg, one_rank)), \
                    uninstalled_stubbed("sgl_kernel"):
                predict, accept_lens, accept_index = sg.eagle_utils.eagle_sample(verify_input, batch, output)
        except RuntimeError as exc:
            if "stub of a CUDA extension" not in str(exc):
                raise
            w.sampled, w.sampled_not_driven = [], f"this SGLang's sampling branch calls a compiled op: {exc}"
            return
        w.sampled.append(("block verification" if block else "per token",
                          [[int(v) for v in row] for row in accept_index.view(bs, -1)],
                          [int(v) for v in accept_lens], [int(v) for v in predict.reshape(-1)]))


def one_rank_group(sg, group) -> list[tuple]:
    """The tensor-parallel group a sampler asks ``sglang.srt.distributed`` for by name (0.5.17-0.5.20
    import ``get_tp_group`` in the function; later releases read ``get_parallel().tp_group``), answered
    with ``group``; none where the package holds no such name."""
    return [(sg.distributed, "get_tp_group", lambda: group)] if hasattr(sg.distributed, "get_tp_group") else []


def kv_modules():
    """SGLang's modules this step goes through (imported after the loader set the interpreter up)."""
    from vmfuzz.harness.targets.sglang.imports import sglang_module
    return SimpleNamespace(
        sizing=sglang_module("sglang.srt.mem_cache.allocation_sizing"),
        common=sglang_module("sglang.srt.speculative.eagle_worker_common"),
        eagle_utils=sglang_module("sglang.srt.speculative.eagle_utils"),
        runtime_context=sglang_module("sglang.srt.runtime_context"),
        distributed=sglang_module("sglang.srt.distributed"),
        cache_locs=sglang_module("sglang.kernels.ops.speculative.cache_locs"),
        # the translating pool's fused verify window (0.5.23 on); None where this SGLang has none
        translator=_optional("sglang.srt.mem_cache.kv_index_translator"),
        IdSpaceKind=getattr(_optional("sglang.srt.mem_cache.kv_loc_plan"), "IdSpaceKind", None),
        IdSpace=getattr(_optional("sglang.srt.mem_cache.kv_loc_plan"), "IdSpace", None),
        spec_tree=sglang_module("sglang.kernels.ops.speculative.spec_tree"),
        ForwardMode=sglang_module("sglang.srt.model_executor.forward_batch_info").ForwardMode,
    )


def _optional(name: str):
    """An SGLang module a newer release has, or None where this one has no such module."""
    import importlib.util

    from vmfuzz.harness.targets.sglang.imports import sglang_module
    return sglang_module(name) if importlib.util.find_spec(name) is not None else None
