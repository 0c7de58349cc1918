"""kv-location-soundness: every KV location the draft and accept steps write lies inside its
request's ``req_to_token`` row and inside the pool, and the accepted path's moves are the meaning's.

Judged against ``harness/model/kv_locations.py`` (columns from sequence lengths, page size and
draft shape; moves from the accepted paths), never against SGLang's own index arithmetic. Slots
name their cell (``1 + row·R + column``), so a slot from another row, from past the row's
allocation or from outside the table is told apart from a wrong column. Sub-checks:

* ``draft window``: each (request, branch, step)'s slot and, for a paged tree, the prefix-tail copies;
* ``verify window``: each tree node's slot;
* ``fused window``: the verify window's producer asked for more in the same launch, as a
  translating pool asks it (``plan_uniform_extend``) and as its branch for a host with no Triton
  device runs: each node's slot in the full and the sliding-window sub-pools (the same offset in
  the page the sub-pool's page table maps it to; slot 0 for a page it does not hold,
  ``physical_slot``), its position (its column), and each request's anchor in column 0 of its
  row (the row's other columns untouched);
* ``plan reads``: the same window's plan on a page-aligned translating pool, read by each
  sub-pool (full, sliding-window): its page table (``read_table``; one row past the batch, the
  padding lane, all sink) holds the physical page of each page the request reads this iteration
  (its length plus the window), the sink (0) past them; its token stream (``pack_read_stream``,
  before the table is built and packed from it after), and its read source (``read_source``,
  before its own table) hold each resident token's slot at the same offset in its physical page,
  a page the sub-pool does not hold read in the padding page 0; and the same for a second reader
  of the plan with a sliding-window sub-pool of its own (a later multi-layer draft depth's); and the
  tables a captured graph reads (``copy_page_table``: built in place, with no host lengths, a later
  reader's copy, a table grown for more rows): each request's pages then the sink, padding lanes sink;
* ``swa store``: the same window as a DeepSeek V4 layer's KV store writes it into its sliding-window pool
  (``store_cache`` through ``get_swa_out_cache_loc``, on a backend made by its own ``__init__``), per branch:
  translated, its metadata's cached locations, a stale cache of another length, a deferred commit's hook, a
  late-layer tail's own rows, a pool's request window, an idle forward: each row at its node's own cell
  translated through the SWA page table the driver handed the pool (``physical_slot``; an idle row at the
  dummy slot 0), inside the SWA pool; on a request window, the workspace row past one window of history per
  request, in query order, under the batch's layout; a deferred commit joined once, before the store;
* ``accept moves``: the accept index and lengths, the KV moves (``bs·(n + 1)`` pairs, real ones
  first) and the compacted predictions;
  For a chain draft (topk 1, ``d = spec_steps + 1``: the only draft SGLang's server lets rejection
  sampling verify) also the verify step's rejection-sampling branch, per token and with block
  verification, from point masses (the target's on its prediction, the draft's on its token): it
  accepts the same path and lengths and predicts the same tokens, the last one resampled from the
  target (rejection sampling keeps a point-mass proposal exactly when the target puts its mass there);
* ``bonus stride``: each request's bonus token is the target's prediction at its last accepted node, on the
  plain commit and, where the release has it, a CUDA host's fused one (``accept moves`` also judges both
  commits' lengths: each request's length plus its accepted path);
* ``allocation width``: every draft and verify column lies below the request's allocation ``nxt``,
  and ``nxt <= R`` for a request at the context length where SGLang relies on it (P > 1, topk > 1);
  the token count the sizing asks the allocator for is what the rows grow by, the sum of ``nxt - cur``.

Each case of the engine's configs is run at page sizes ``PAGE_SIZES``; the accepted path of
request b goes down its tree by a rule of its sequence length (``accepted_path``).
"""

from __future__ import annotations

from collections import Counter

from vmfuzz.harness.guard.shadow import ShadowHeap, describe_all
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.kv_locations import (PAGE_SIZES, KvCase, accept_moves, allocated_columns, bonus_nodes,
                                               draft_columns, physical_slot, tail_copies, verify_columns)
from vmfuzz.harness.model.trees import parents, trees_of
from vmfuzz.harness.properties.kit import (Observation, fail, fail_overrun, known_goes_on, sub_check_absent,
                                           sub_check_done, sub_check_skipped)
from vmfuzz.harness.properties.kv_swa_store import judge_swa_store

PROP = "kv-location-soundness"
SUB_CHECKS = ("draft window", "verify window", "fused window", "plan reads", "swa store", "accept moves",
              "bonus stride", "allocation width")
WRITERS = {"draft window": "prepare_for_draft", "verify window": "assign_extend_cache_locs_uniform",
           "fused window": "assign_extend_cache_locs_uniform fused outputs",
           "plan reads": "KVIndexTranslator reads of the iteration's plan",
           "swa store": "DeepseekV4AttnBackend.get_swa_out_cache_loc",
           "accept moves": "run_eagle_verify accept step", "bonus stride": "run_eagle_verify bonus tokens",
           "allocation width": "allocation sizing"}


def accepted_path(par: tuple[int, ...], s: int, b: int, steps: int) -> tuple[int, ...]:
    """A path down the tree from the root: at each level the child ``(s + level) mod children``, for
    ``1 + (s + b) mod (steps + 1)`` nodes or until a leaf."""
    want, path = 1 + (s + b) % (steps + 1), [0]
    while len(path) < want:
        kids = [c for c in range(len(par)) if c and par[c] == path[-1]]
        if not kids:
            break
        path.append(kids[(s + len(path)) % len(kids)])
    return tuple(path)


def cases_of(config: Config, batch: Batch, page_sizes=PAGE_SIZES) -> list[KvCase]:
    trees = trees_of(config, batch)
    pars = tuple((-1, *parents(t, config.topk)[1:]) for t in trees)  # the root has no parent
    paths = tuple(accepted_path(p, s, b, config.spec_steps) for b, (p, s) in enumerate(zip(pars, batch.seq_lens)))
    return [KvCase(topk=config.topk, spec_steps=config.spec_steps, num_draft_tokens=config.d, page_size=p,
                   context_len=config.max_context_len, seq_lens=tuple(batch.seq_lens), parents=pars,
                   paths=paths).validate() for p in page_sizes]


def _fail(sub: str, case: KvCase, detail: str, *, buffer: str, cell: str, effect: str = "wrong"):
    where = (f"(bs {case.bs}, seq_lens {list(case.seq_lens)}, topk {case.topk}, spec_steps {case.spec_steps}, "
             f"d {case.d}, page size {case.page_size}, context {case.context_len})")
    fail(PROP, f"{sub}: {detail} {where}", effect=effect, writer=WRITERS[sub], buffer=buffer, cell=cell, stage=sub)


def _name(w, slot: int) -> str:
    at = w.where(slot)
    return f"slot {slot} (outside req_to_token)" if at is None else f"slot {slot} (row {at[0]}, column {at[1]})"


def judge_case(target, case: KvCase, obs: Observation) -> None:
    heap = ShadowHeap()
    try:
        w = target.kv_locations(case, heap)
    finally:
        heap.release()
    if w.violations:
        fail_overrun(PROP, f"a write left its buffer: {describe_all(w.violations)}", w.violations,
                     writer="kv-location step")
    bs, k, n, d, rows = case.bs, case.topk, case.spec_steps, case.d, w.pool_rows
    slot = w.slot_of
    # -- allocation width (first: a row too narrow is the cause of the windows reading past it)
    for b, s in enumerate(case.seq_lens):
        top = max(draft_columns(case, s) + verify_columns(case, s))
        if top >= w.alloc_lens[b]:
            _fail("allocation width", case, f"request {b} (length {s}) writes column {top}, its allocation ends "
                  f"at {w.alloc_lens[b]}", buffer="req_to_token", cell="past the allocation")
    at_context = allocated_columns(case, case.context_len, None)
    if case.paged_tree and at_context > w.row_width:
        _fail("allocation width", case, f"a request at the context length allocates {at_context} columns, "
              f"the req_to_token row holds {w.row_width} (context + {w.extra_context})", buffer="req_to_token",
              cell="row width", effect="unsound")
    if not case.paged_tree and at_context > w.row_width:
        obs.classes.add("allocation width: unpaged over-allocation at the context length past the row, not judged")
    if w.alloc_asked is None:
        obs.classes.add("allocation width: the allocator's token count not judged (this release sizes inside "
                        "the decode preparation)")
    else:
        # the allocator hands out exactly the slots the rows then record: [cur, nxt) of each request
        cur, asked = w.alloc_asked
        grow = sum(nxt - c for nxt, c in zip(w.alloc_lens, cur))
        if asked != grow:
            _fail("allocation width", case, f"the allocator is asked for {asked} tokens, the rows grow by {grow} "
                  f"(from {cur} to {w.alloc_lens})", buffer="out_cache_loc", cell="allocation count")
    sub_check_done(obs, "allocation width")
    # -- draft window
    want = [slot(rows[b], c) for b, s in enumerate(case.seq_lens) for c in draft_columns(case, s)]
    if len(w.draft_slots) != len(want):
        _fail("draft window", case, f"{len(w.draft_slots)} draft slots for bs·topk·steps = {len(want)}",
              buffer="out_cache_loc", cell="length")
    for j, (have, exp) in enumerate(zip(w.draft_slots, want)):
        if have != exp and w.where(exp) is None and not case.paged_tree:
            # the meaning's own column lies past the row: the unpaged over-allocation at the context
            # length above (not judged until a server is shown to admit that length), not this window's
            obs.classes.add("draft window: a column past the req_to_token row at the context length, not judged")
            continue
        if have != exp:
            b, t, i = j // (k * n), j // n % k, j % n
            _fail("draft window", case, f"request {b}'s branch {t} step {i} writes {_name(w, have)}, its own is "
                  f"{_name(w, exp)}", buffer="out_cache_loc",
                  cell="another row" if w.where(have) is None or w.where(have)[0] != rows[b] else "column")
    copies = [(slot(rows[b], t), slot(rows[b], f)) for b, s in enumerate(case.seq_lens) for t, f in tail_copies(case, s)]
    if Counter(w.draft_copies) != Counter(copies):
        _fail("draft window", case, f"prefix-tail copies {w.draft_copies}, the meaning's {copies}",
              buffer="move_kv_cache", cell="prefix tail")
    sub_check_done(obs, "draft window")
    obs.classes.add(f"draft window: page size {case.page_size}, topk {'1' if k == 1 else '> 1'}")
    # -- verify window
    want_v = [[slot(rows[b], c) for c in verify_columns(case, s)] for b, s in enumerate(case.seq_lens)]
    flat = [v for row in want_v for v in row]
    for j, (have, exp) in enumerate(zip(w.verify_slots, flat)):
        if have != exp:
            _fail("verify window", case, f"request {j // d}'s node {j % d} is written at {_name(w, have)}, its own "
                  f"is {_name(w, exp)}", buffer="out_cache_loc", cell="column")
    if len(w.verify_slots) != len(flat):
        _fail("verify window", case, f"{len(w.verify_slots)} verify slots for bs·d = {len(flat)}",
              buffer="out_cache_loc", cell="length")
    sub_check_done(obs, "verify window")
    _judge_fused(case, w, flat, obs)
    judge_swa_store(case, w, obs, _fail)
    _judge_accept(case, w, want_v, obs)
    # last, and a known defect of one reader of the plan (0.5.22's second reader) ends only the reads: a
    # replay, which names a known defect only after the case ends, has judged every other sub-check first
    with known_goes_on(target, obs, "plan reads") as met:
        _judge_reads(case, w, obs)
    if met.name:  # judged, up to that reader's defect
        sub_check_done(obs, "plan reads")


def _judge_fused(case: KvCase, w, flat: list[int], obs: Observation) -> None:
    """The producer's fused outputs: sub-pool slots from the page tables the driver handed it, positions,
    anchors; on the translating pool's launch and on the branch for a host with no Triton device."""
    t, d, sub = w.windows, case.d, "fused window"
    if t.absent:
        sub_check_absent(obs, sub, t.absent)
        return
    if t.not_driven:
        sub_check_skipped(obs, sub, t.not_driven)
        return

    def first_wrong(what: str, got: list, want: list, buffer: str) -> None:
        if len(got) != len(want):
            _fail(sub, case, f"{what}: {len(got)} cells, the window has {len(want)}", buffer=buffer, cell="length")
        j = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if j is not None:
            _fail(sub, case, f"{what}: request {j // d}'s node {j % d} holds {got[j]}, its own is {want[j]}",
                  buffer=buffer, cell="column")
    first_wrong("the translating pool's virtual window", t.virtual, flat, "out_cache_loc")
    for name, got, page_map in (("full", t.full, t.full_map), ("sliding-window", t.swa, t.swa_map)):
        want = [physical_slot(v, page_map, t.page_size) for v in flat]
        first_wrong(f"the {name} sub-pool's slots", got, want, f"{name} out")
        if name == "sliding-window" and 0 in want:
            obs.classes.add("fused window: a page the sliding-window sub-pool does not hold")
    columns = [c for s in case.seq_lens for c in verify_columns(case, s)]
    anchors = [v for a in t.anchor_src for v in [a] + [0] * (len(t.anchors[0]) - 1 if t.anchors else 0)]
    if t.fallback is None:
        _fail(sub, case, "the branch for a host with no Triton device returned no window", buffer="out_cache_loc",
              cell="length")
    for where, positions, rows in (("the translating pool's launch", t.positions, t.anchors),
                                   ("the host-without-Triton branch", t.fallback_positions, t.fallback_anchors)):
        first_wrong(f"{where}: positions", [v for row in positions for v in row], columns, "positions_out")
        first_wrong(f"{where}: anchors", [v for row in rows for v in row], anchors, "anchor_out")
    first_wrong("the host-without-Triton branch's window", t.fallback, flat, "out_cache_loc")
    sub_check_done(obs, sub)
    obs.classes.add(f"fused window: page size {t.page_size}")


def _judge_reads(case: KvCase, w, obs: Observation) -> None:
    """Each sub-pool's reads of the plan: page table and token streams, from the page tables the driver
    handed the translating pool (``kv_plan_reads``)."""
    r, sub, P = w.reads, "plan reads", w.reads.page_size if w.reads else 1
    if r is None:
        if w.reads_absent:
            sub_check_absent(obs, sub, w.reads_absent)
        else:
            sub_check_skipped(obs, sub, w.reads_not_driven or "no plan was read")
        return
    row_pages = r.row_width // P
    _judge_captured(case, r, obs)
    for name, page_map in r.maps.items():
        def page_of(b: int, column: int) -> int | None:
            q = r.virtual_slot(r.pool_rows[b], column) // P
            return page_map[q] if 0 <= q < len(page_map) and page_map[q] >= 0 else None
        if r.physical[name] != (True, True):
            _fail(sub, case, f"the {name} sub-pool's token streams say physical {r.physical[name]} on a translating "
                  "pool", buffer=f"{name} read stream", cell="is physical")
        want = [(b, c, page_of(b, c)) for b, s in enumerate(case.seq_lens) for c in range(s)]
        for when, got in (("before its page table", r.streams_before[name]), ("packed from it", r.streams_after[name]),
                          ("through its read source", r.sources[name])):
            if len(got) != len(want):
                _fail(sub, case, f"the {name} token stream {when}: {len(got)} ids for {len(want)} resident tokens",
                      buffer=f"{name} read stream", cell="length")
            for (b, c, page), have in zip(want, got):
                if (0 <= have < P) if page is None else have == page * P + c % P:
                    continue
                own = "in the padding page 0" if page is None else str(page * P + c % P)
                _fail(sub, case, f"the {name} token stream {when}: request {b}'s column {c} reads {have}, its own "
                      f"is {own}", buffer=f"{name} read stream", cell="token id")
        table = r.tables[name]
        if len(table) != case.bs + 1 or any(table[case.bs]):
            _fail(sub, case, f"the {name} page table has {len(table)} rows for bs {case.bs} plus a padding lane, "
                  f"that lane {table[-1] if table else []} (all sink)", buffer=f"{name} page table", cell="padding lane")
        for b, s in enumerate(case.seq_lens):
            pages = min(-(-(s + case.d) // P), row_pages)  # the iteration reads its length plus the window
            exp = [page_of(b, j * P) or 0 for j in range(pages)]
            row = table[b]
            if row[:pages] != exp or any(row[pages:]):
                _fail(sub, case, f"the {name} page table's row {b} is {row}, its own pages {exp} then the sink",
                      buffer=f"{name} page table", cell="page")
    sub_check_done(obs, sub)
    obs.classes.add(f"plan reads: page size {P}")


def _judge_captured(case: KvCase, r, obs: Observation) -> None:
    """The page tables a captured graph reads: request b's row its own pages then the sink, every padding lane
    the sink, across the widest request's pages (the columns past them are not read, and not judged)."""
    P, sub = r.page_size, "plan reads"
    row_pages = r.row_width // P
    pages = [min(-(-(s + case.d) // P), row_pages) for s in case.seq_lens]
    widest = max(pages)
    for label, table in r.captured.items():
        page_map = r.maps["sliding-window" if label.startswith("sliding-window") else "full"]
        buffer = f"{label.split(',')[0]} captured page table"
        if len(table) < case.bs + 1:
            _fail(sub, case, f"the {label} page table has {len(table)} rows for bs {case.bs} and its padding "
                  "lanes", buffer=buffer, cell="padding lane")
        for b, row in enumerate(table):
            if b < case.bs:
                exp = [max(page_map[q], 0) if 0 <= (q := r.virtual_slot(r.pool_rows[b], j * P) // P) < len(page_map)
                       else 0 for j in range(pages[b])] + [0] * (widest - pages[b])
            else:
                exp = [0] * widest
            if row[:widest] != exp:
                _fail(sub, case, f"the {label} page table's row {b} starts {row[:widest]}, its own "
                      f"{'pages then the sink' if b < case.bs else 'sink (a padding lane)'} {exp}", buffer=buffer,
                      cell="page" if b < case.bs else "padding lane")
        obs.classes.add(f"plan reads: captured table, {label.split(', ', 1)[1]}")


def _judge_accept(case: KvCase, w, want_v, obs: Observation) -> None:
    """The accept index and lengths, the KV moves and compaction, and the bonus tokens."""
    bs, n, d = case.bs, case.spec_steps, case.d
    if w.accept_index_shape != (bs, n + 1):
        _fail("accept moves", case, f"accept_index is {w.accept_index_shape}, not (bs, spec_steps + 1) = "
              f"{(bs, n + 1)}", buffer="accept_index", cell="shape")
    for b, path in enumerate(case.paths):
        exp = [b * d + x for x in path] + [-1] * (n + 1 - len(path))
        if w.accept_index[b] != exp or w.accept_lens[b] != len(path):
            _fail("accept moves", case, f"request {b} accepts {w.accept_index[b]} ({w.accept_lens[b]} tokens), "
                  f"its path {list(path)} is {exp}", buffer="accept_index", cell="accepted path")
    if w.accept_moves is not None:
        moves = accept_moves(case, want_v)
        if len(w.accept_moves) != len(moves):
            _fail("accept moves", case, f"{len(w.accept_moves)} KV move pairs, the accept index holds "
                  f"bs·(spec_steps + 1) = {len(moves)}", buffer="move_kv_cache", cell="length")
        for j, (have, exp) in enumerate(zip(w.accept_moves, moves)):
            if have != exp:
                _fail("accept moves", case, f"move {j} is {_name(w, have[1])} -> {_name(w, have[0])}, the "
                      f"accepted path's is {exp[1]} -> {exp[0]}", buffer="move_kv_cache", cell="move pair")
        for b, path in enumerate(case.paths):
            front = w.compacted[b * d: b * d + len(path)]
            exp = [w.target_tokens[b][x] for x in path]
            if front != exp:
                _fail("accept moves", case, f"request {b}'s compacted predictions start {front}, its accepted "
                      f"path's are {exp}", buffer="predict", cell="compacted front")
        obs.classes.add("accept moves: tree path compacted")
    _judge_sampled(case, w, obs)
    # the committed lengths: each request's length plus its accepted path, on the plain and the fused commit
    for how, lens in (("", w.new_seq_lens), (" (fused commit)", w.fused_new_seq_lens)):
        want = [s + len(path) for s, path in zip(case.seq_lens, case.paths)]
        if lens is not None and lens != want:
            _fail("accept moves", case, f"the verify{how} commits lengths {lens}, each request's length plus its "
                  f"accepted path is {want}", buffer="new_seq_lens", cell="committed length")
    sub_check_done(obs, "accept moves")
    # -- bonus tokens, as the plain commit and as a CUDA host's fused commit hands them on
    for how, bonus in (("", w.bonus_tokens), (" (fused commit)", w.fused_bonus_tokens)):
        for b, x in enumerate(bonus_nodes(case) if bonus is not None else ()):
            if bonus[b] != w.target_tokens[b][x]:
                _fail("bonus stride", case, f"request {b}'s bonus token{how} is {bonus[b]}, the target's "
                      f"prediction at its last accepted node {x} is {w.target_tokens[b][x]}", buffer="bonus_tokens",
                      cell="bonus token")
    if w.fused_bonus_tokens is not None:
        obs.classes.add("bonus stride: fused commit")
    sub_check_done(obs, "bonus stride")


def _judge_sampled(case: KvCase, w, obs: Observation) -> None:
    """The rejection-sampling branch on point masses: the greedy path's index, lengths and predictions."""
    if w.sampled_not_driven:
        # not a gap: SGLang's server refuses rejection sampling for any other draft shape
        obs.classes.add("accept moves: rejection sampling not run (not a chain of spec_steps + 1 nodes)")
        return
    n, d = case.spec_steps, case.d
    for variant, index, lens, predict in w.sampled:
        how = f"rejection sampling ({variant})"
        for b, path in enumerate(case.paths):
            exp = [b * d + x for x in path] + [-1] * (n + 1 - len(path))
            if index[b] != exp or lens[b] != len(path):
                _fail("accept moves", case, f"{how}: request {b} accepts {index[b]} ({lens[b]} tokens), its path "
                      f"{list(path)} is {exp}", buffer="accept_index", cell="accepted path")
            got, want = [predict[b * d + x] for x in path], [w.target_tokens[b][x] for x in path]
            if got != want:
                _fail("accept moves", case, f"{how}: request {b}'s predictions on its path are {got}, the target's "
                      f"{want}", buffer="predict", cell="sampled token")
        obs.classes.add(f"accept moves: rejection sampling, {variant}")


def kv_location_soundness(target, config: Config, batches, device="cpu") -> Observation:
    obs = Observation()
    if not callable(getattr(target, "kv_locations", None)):
        for name in SUB_CHECKS:  # the reference target has no model of this step: not driven, never held
            obs.classes.add(f"sub-check {name}: not driven (this target has no kv_locations seam)")
        return obs
    if config.topk > 1 and config.d < config.spec_steps + 1:
        # SGLang's _compact_accept_to_front writes the accept index's n + 1 columns into each request's
        # d-node block and raises when d < n + 1 (0.5.23); whether a server runs such a tree is not
        # settled here, so it is left unjudged and said so, never held
        for name in SUB_CHECKS:
            obs.classes.add(f"sub-check {name}: not driven (topk > 1 with num_draft_tokens < spec_steps + 1)")
        return obs
    for batch in batches:
        for case in cases_of(config, batch):
            judge_case(target, case, obs)
        obs.classes.add(f"bs {'= 1' if batch.bs == 1 else '> 1'}")
        if config.max_context_len in batch.seq_lens:
            obs.classes.add("seq_len = max_context_len")
    return obs
