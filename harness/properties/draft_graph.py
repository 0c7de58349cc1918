"""The draft-decode cuda-graph path: SGLang's ``EAGLEDraftCudaGraphRunner`` captured, then replayed.

The graph properties' second runner (``graph_replay`` judges the target verify runner, then
calls ``judge_draft`` here with its own property's name), and ``graph-buffer-soundness``:

- ``graph-replay-equivalence``: on the real rows a replay at the padded bs
  drafts what ``draft_forward`` drafts eagerly on the raw batch: parents,
  top scores, draft tokens, and per step each real branch's attended KV slots
  and KV write; and in both, step i hands each real branch the position its
  token has by the meaning, ``s_b + i`` (one past the last one it drafted from);
- ``padding-inert``: every static buffer's padded rows hold poisoned content
  first (live requests' KV slots, lengths at the limit, pool rows of live
  requests, token ids past the vocabulary); the real rows still draft what the
  eager run drafts, padded branches write only slot 0, no padded token id
  leaves the vocabulary (an embedding gather out of bounds on a device), and
  no padded branch reads KV it does not own: not past the cells the metadata
  kernel wrote for it this replay (its ``kv_indptr`` range, from ``positions``,
  against the kernel's offsets, from ``seq_lens``), not a live request's pool row;
- ``capture-replay-agreement``: the view the replay hands the backend's
  out-of-graph metadata has ``batch_size = B``, ``seq_lens_sum`` = the sum of
  its (padded) ``seq_lens``, ``out_cache_loc`` of ``B·k·n`` ids, ``positions``
  of ``B·k``; and it is judged before anything SGLang asserts afterwards;
  FlashInfer's multi-step draft backend, handed the same view, plans each real
  branch's prefix and chain, from a host indptr that agrees with the device's;
  and ``can_run_graph`` admits every batch no wider than the largest captured graph;
- ``graph-buffer-soundness``: each static buffer, the backend's ``kv_indices``
  rows and ``kv_indptr`` included, holds what the largest admitted bucket needs
  with every request at the longest prefix a drafting request has (``C - 1``:
  a request of ``C`` tokens is finished), by the meaning's arithmetic
  (``model.draft_graph.footprints``) and by the redzones at a replay of it.
"""

from __future__ import annotations

import os
import zlib

import torch

from vmfuzz.harness.model.config import Batch, Config, num_candidates
from vmfuzz.harness.model.draft_graph import DraftShape, branch_read_columns, window_reads
from vmfuzz.harness.properties.graph_shared import built, refused_though_captured
from vmfuzz.harness.properties.kit import DONE, SUB_CHECK, Observation, fail
from vmfuzz.harness.properties.verify_graph_buffers import judge_verify_buffers

BUFFERS = "graph-buffer-soundness"
REPLAY = "draft cuda-graph replay"
#: the page sizes a server's draft graphs are judged at (unpaged, and pages a branch's steps straddle)
PAGE_SIZES = (1, 4)


def draft_window(config: Config) -> int:
    """The sliding window of the draft model a case's server runs (0: none). Every other case's model has
    window layers (chosen by the config, so a repro replays as it was judged), its window half the context:
    short requests read all they attend through it, long ones a clipped tail."""
    if (zlib.crc32(repr(config).encode()) // DRAFT_SHARE) % 2:
        return 0
    return max(1, config.max_context_len // 2)


def draft_page_size(config: Config) -> int:
    """The KV page size of the server whose draft runner the three graph properties judge. Half the windowed
    models' servers keep their KV in pages of 4 (a paged tree's branches then own whole pages: the window
    rail's paged chain), the other half unpaged (its chain slots step by the branch's number of steps: the
    only form a topk > 1 window reads on page 1); every other server's is unpaged (graph-buffer-soundness
    sizes both page sizes for every case). Chosen by the config, so a repro replays as it was judged."""
    if not draft_window(config):
        return 1
    return 4 if (zlib.crc32(repr(config).encode()) // (2 * DRAFT_SHARE)) % 2 else 1


def draft_shape(config: Config, page_size: int = 1) -> DraftShape | None:
    """The draft-decode server of ``config``, or None where SGLang builds no draft-decode runner (one
    step) or would not start (topk 1 with draft tokens other than steps + 1; more draft tokens than
    candidates)."""
    k, n, d = config.topk, config.spec_steps, config.d
    if n < 2 or k < 1 or (k == 1 and d != n + 1) or d - 1 > num_candidates(k, n):
        return None
    window = draft_window(config)
    # an unpaged windowed server keeps its window layers' KV apart (SGLang's SWAKVPool is driven unpaged here)
    return DraftShape(k, n, d, config.max_context_len, page_size, window, window_pool=bool(window) and page_size == 1,
                      seeded_sampling=draft_seeded(config))


def draft_seeded(config: Config) -> bool:
    """Whether the case's server samples its drafts for rejection sampling under deterministic inference
    (each request's draw keyed by its seed, which a replay copies into the graph): half the chain servers
    (rejection sampling verifies topk-1 chains), chosen by the config, so a repro replays as it was judged."""
    if config.topk != 1 or config.d != config.spec_steps + 1:
        return False
    return (zlib.crc32(repr(config).encode()) // (4 * DRAFT_SHARE)) % 2 == 0


def session(prop: str, target, config: Config, obs: Observation, page_size: int = 1, largest_only: bool = False):
    make = getattr(target, "draft_graph_session", None)
    shape = draft_shape(config, page_size)
    if make is None or shape is None:
        obs.classes.add("draft-decode runner: " + ("not driven by this target" if make is None else
                                                    "none for this shape (one step, or no such server)"))
        return None
    s = built(("draft decode, largest bucket" if largest_only else "draft decode", shape, config.max_bs),
              lambda: make(shape, config.max_bs, largest_only=True) if largest_only else make(shape, config.max_bs))
    for piece, why in getattr(s, "pieces_not_driven", {}).items():  # the case's server driven without it
        obs.classes.add(f"draft-decode runner: {piece} not driven ({why})")
    return s


def _overruns(prop: str, s, where: str) -> None:
    if s.overruns:
        o = s.overruns[0]
        v = o.violation
        fail(prop, f"{where}: the {o.phase} of draft graph {o.graph!r} wrote outside a static buffer: "
                   f"{v.describe()}", effect="overrun", writer=REPLAY if o.phase == "replay" else "draft cuda-graph capture",
             buffer=v.buffer, side="below" if v.side == "front" else "above", stage=o.phase)


def _windows(prop: str, drafted, raw: int, k: int, s, where: str, which: str) -> None:
    """Each real branch's window-layer reads are the last ``window`` of what it attends (the meaning's
    ``window_reads``), in the replay and in the eager draft alike (one kernel fills both). On a hybrid pool
    (``window_pool``) each is the window slot of that full slot, and each branch's window layers write at
    the window slot of its full write (both paths derive them from the step's columns of the plan)."""
    shape = s.shape
    window = shape.window
    for step in drafted.steps:
        if not window:
            continue
        if len(step.window_attended) < raw * k:
            fail(prop, f"{where}: step {step.step}: the window layers were handed no reads for the "
                       f"{raw * k} real branches ({which})", effect="wrong", writer=REPLAY,
                 buffer="window_kv_indices", cell="real row", stage="replay")
        for z in range(raw * k):
            want = window_reads(step.attended[z], window)
            if shape.window_pool:
                want = tuple(s.window_slot(slot) for slot in want)
            if step.window_attended[z] != want:
                fail(prop, f"{where}: step {step.step}, branch {z} ({which}): its window layers read "
                           f"{step.window_attended[z]}, the last {window} of what it attends are {want}"
                           + (" (their window slots)" if shape.window_pool else ""),
                     effect="wrong", writer=REPLAY, buffer="window_kv_indices", cell="real row", stage="replay")
        if shape.window_pool:
            _window_writes(prop, s, step, raw * k, where, which)


def _window_writes(prop: str, s, step, branches: int, where: str, which: str) -> None:
    for z in range(branches):
        want = s.window_slot(step.kv_writes[z][0])
        got = step.window_writes[z] if z < len(step.window_writes) else None
        if got != want:
            fail(prop, f"{where}: step {step.step}, branch {z} ({which}): its window layers write slot {got}, "
                       f"the window slot of its write (full slot {step.kv_writes[z][0]}) is {want}",
                 effect="wrong", writer=REPLAY, buffer="swa_out_cache_loc", cell="real row", stage="replay")


def _positions(prop: str, drafted, lens: list[int], k: int, where: str, which: str) -> None:
    """Step i's token of each real branch sits at ``s_b + i``: the replay and the eager draft share
    ``draft_forward``, so an off-by-one in when it advances ``positions`` makes them agree and both be
    wrong; only the meaning sees it."""
    for step in drafted.steps:
        for z in range(len(lens) * k):
            want = lens[z // k] + step.step
            if step.positions[z] != want:
                fail(prop, f"{where}: step {step.step}, branch {z} ({which}) is handed position "
                           f"{step.positions[z]}, its token's is {want} (s_b + step)", effect="wrong",
                     writer=REPLAY, buffer="positions", cell="real row", stage="replay")


def _compare(prop: str, got, want, lens: list[int], k: int, where: str, s) -> None:
    raw = len(lens)
    _windows(prop, want, raw, k, s, where, "eager")
    _windows(prop, got, raw, k, s, where, "replay")
    _positions(prop, want, lens, k, where, "eager")
    _positions(prop, got, lens, k, where, "replay")
    for name in ("parent_list", "top_scores_index", "draft_tokens"):
        a, b = getattr(got, name), getattr(want, name)
        if a.shape != b.shape or not torch.equal(a, b):
            fail(prop, f"{where}: {name} {a.tolist()} differs from the eager draft's {b.tolist()}",
                 effect="wrong", writer=REPLAY, buffer=name, cell="real row", stage="replay")
    for a, b in zip(got.steps, want.steps):
        n = raw * k
        for what, x, y in (("attended KV slots", a.attended[:n], b.attended),
                           ("KV writes", a.kv_writes[:n], b.kv_writes)):
            if x != y:
                z = next(i for i, (p, q) in enumerate(zip(x, y)) if p != q)
                fail(prop, f"{where}: step {a.step}, branch {z}: {what} {x[z]} in the replay, {y[z]} eagerly",
                     effect="wrong", writer=REPLAY, buffer="kv_indices" if what[0] == "a" else "out_cache_loc",
                     cell="real row", stage="replay")


def _poison(s, seq_lens: list[int]) -> dict[str, torch.Tensor]:
    """What a previous, larger step leaves in the padded rows: live requests' KV slots and pool rows,
    lengths and positions at the context limit, token ids past the vocabulary, scores and hidden
    states no padding holds."""
    C, cells = s.shape.context_len, 1 << 12
    live = s.slots(seq_lens)
    return {"out_cache_loc": live.repeat(cells // live.numel() + 1)[:cells],
            "seq_lens": torch.full((cells,), C), "seq_lens_cpu": torch.full((cells,), C),
            "req_pool_indices": torch.ones(cells, dtype=torch.long), "positions": torch.full((cells,), C),
            "topk_index": torch.arange(cells) + s.vocab + 100, "topk_p": torch.full((cells,), 0.5),
            "hidden_states": torch.full((cells,), 1e6)}


def _view(prop: str, s, got, raw: int, where: str) -> None:
    k, n = s.shape.topk, s.shape.steps
    B, view = got.graph_bs, got.view
    origin = dict(effect="wrong", writer=REPLAY, cell="capture-replay", stage="replay")
    if view is None:
        fail(prop, f"{where}: the backend's out-of-graph metadata was never set up", buffer="replay view", **origin)
    want = {"batch_size": B, "seq_lens": B, "req_pool_indices": B, "positions": B * k, "out_cache_loc": B * k * n}
    for name, cells in want.items():
        value = getattr(view, name)
        have = value if name == "batch_size" else value.numel()
        if have != cells:
            fail(prop, f"{where}: the replay hands the draft backend {name} of {have}, the graph of bs {B} "
                       f"was captured for {cells}", buffer=name, **origin)
    if view.seq_lens_sum is not None and view.seq_lens_sum != int(view.seq_lens.sum()):
        fail(prop, f"{where}: the replay's seq_lens_sum is {view.seq_lens_sum}, its padded seq_lens sum to "
                   f"{int(view.seq_lens.sum())} (the padding's lengths left out)", buffer="seq_lens_sum", **origin)


#: one case in this many has its draft-decode runner built, captured and replayed (chosen by the
#: case's config, so a repro replays as it was judged): a draft capture runs every bucket's draft
#: forward in Triton's interpreter, about as long as the rest of a graph check together.
#: ``VMFUZZ_DRAFT_SHARE=1`` judges every case's (a nightly, a test of a draft-side alteration).
DRAFT_SHARE = 4


def draft_share() -> int:
    try:
        return max(1, int(os.environ.get("VMFUZZ_DRAFT_SHARE") or DRAFT_SHARE))
    except ValueError:
        return DRAFT_SHARE
#: the largest captured max_bs whose draft graphs a case builds (the capture of each bucket is the cost)
DRAFT_MAX_BS = 8


def draft_judged(config: Config) -> str | None:
    """Why this case's draft runner is not judged here (None: it is)."""
    if config.max_context_len < config.spec_steps + 2:
        return "context shorter than the draft steps (no request drafts inside it)"
    if config.max_bs > DRAFT_MAX_BS:
        return f"max_bs past {DRAFT_MAX_BS} (a capture per bucket)"
    share = draft_share()
    if zlib.crc32(repr(config).encode()) % share:
        return f"not among the one case in {share} whose draft graphs are built"
    return None


def judge_draft(prop: str, target, config: Config, batches: list[Batch], obs: Observation) -> None:
    """``prop``'s checks on the draft-decode runner, over the case's admitted batches whose requests
    all draft inside their context (those past it are graph-buffer-soundness's)."""
    why = draft_judged(config)
    if why is not None:
        obs.classes.add(f"draft: not judged: {why}")
        return
    s = session(prop, target, config, obs, draft_page_size(config))
    if s is None:
        return
    _overruns(prop, s, "draft capture")
    k = s.shape.topk
    for batch in batches:
        lens = list(batch.seq_lens)
        if max(lens) > config.max_context_len - config.spec_steps:
            obs.classes.add("draft: not judged: a request drafts past its context (graph-buffer-soundness's)")
            continue
        if not s.can_run(lens):
            obs.classes.add("draft: not admitted by can_run_graph (eager)")
            if prop == "capture-replay-agreement":
                refused_though_captured(prop, "draft decode", len(lens), s.capture_bs)
            continue
        poison = _poison(s, lens) if prop == "padding-inert" else None
        got = s.replay(lens, poison)
        where = f"draft replay of bs {len(lens)} in the graph captured at bs {got.graph_bs}"
        if prop == "capture-replay-agreement":
            _view(prop, s, got, len(lens), where)
            if got.raised is None:
                _flashinfer(prop, s, got, lens, where, obs)
        if got.raised is not None:
            raise got.raised
        _overruns(prop, s, where)
        if prop == "padding-inert":
            _padded(prop, s, got, lens, where)
        if prop != "capture-replay-agreement":
            _compare(prop, got, s.eager(lens), lens, k, where, s)
        obs.classes.add("draft: padded replay" if got.graph_bs > len(lens) else "draft: exact replay")
        obs.classes.add(f"draft: page size {s.shape.page_size}")
        if s.shape.window:
            clipped = any(v + config.spec_steps > s.shape.window for v in lens)
            obs.classes.add(f"draft: window layers, {'a clipped' if clipped else 'no clipped'} window")
            obs.classes.add(f"draft: window layers' KV {'apart (a hybrid pool)' if s.shape.window_pool else 'in one pool'}")
        obs.classes.add(f"{SUB_CHECK}draft runner: {DONE}")


def _flashinfer(prop: str, s, got, lens: list[int], where: str, obs: Observation) -> None:
    """FlashInfer's multi-step draft backend handed the same replay view: each step's plan, for each real
    branch, holds its prefix then its chain so far (``branch_read_columns``), and the host indptr it plans
    from agrees with the device's on the real branches (host-indptr option off and on)."""
    make = getattr(s, "flashinfer_plans", None)
    if make is None:
        obs.classes.add("draft: FlashInfer's draft plan not driven by this target")
        return
    bs, k = len(lens), s.shape.topk
    origin = dict(writer="FlashInferMultiStepDraftBackend", stage="replay")
    for drafted in make(got.view):
        how = f"FlashInfer's draft plan ({'host' if drafted.host_indptr else 'device'} indptr)"
        if drafted.violations:
            v = drafted.violations[0]
            fail(prop, f"{where}: {how} wrote outside its buffer: {v.describe()}", effect="overrun",
                 buffer=v.buffer, side="below" if v.side == "front" else "above", **origin)
        if len(drafted.steps) != s.shape.steps - 1:
            fail(prop, f"{where}: {how} planned {len(drafted.steps)} steps, the draft runs {s.shape.steps - 1}",
                 effect="wrong", buffer="kv_indptr", cell="steps", **origin)
        for st in drafted.steps:
            for z in range(bs * k):
                b, t = divmod(z, k)
                want = [s.cell(bs, b, c) for c in branch_read_columns(s.shape, lens[b], t, st.step)]
                have = st.indices[st.indptr[z]:st.indptr[z + 1]]
                if have != want:
                    fail(prop, f"{where}: {how}, step {st.step}, branch {z}: handed KV ids {have}, its prefix and "
                               f"chain are {want}", effect="wrong", buffer="kv_indices", cell="real row", **origin)
            real = bs * k + 1
            if st.host_indptr is not None and st.host_indptr[:real] != st.indptr[:real]:
                fail(prop, f"{where}: {how}, step {st.step}: the host indptr FlashInfer plans from is "
                           f"{st.host_indptr[:real]}, the device's is {st.indptr[:real]} on the real branches",
                     effect="wrong", buffer="kv_indptr", cell="host plan", **origin)
        obs.classes.add(f"draft: FlashInfer draft plan, {'host' if drafted.host_indptr else 'device'} indptr")


def _padded(prop: str, s, got, lens: list[int], where: str) -> None:
    real = set(s.slots(lens).tolist())
    n = len(lens) * s.shape.topk
    for step in got.steps:
        if step.out_of_vocab:
            z, token = step.out_of_vocab[0]
            fail(prop, f"{where}: step {step.step}, padded branch {z} is handed token {token}, past the "
                       f"vocabulary of {s.vocab} (a device's embedding gather reads out of bounds)",
                 effect="overrun", writer=REPLAY, buffer="topk_index" if step.step == 0 else "input_ids",
                 cell="padded row", stage="replay")
        _padded_reads(prop, s, got, step, len(lens), where)
        stray = [(z, slot) for z, (slot, _) in enumerate(step.kv_writes[n:], start=n) if slot in real or slot != 0]
        if stray:
            z, slot = stray[0]
            fail(prop, f"{where}: step {step.step}, padded branch {z} writes KV into slot {slot}"
                       f"{' (a live request’s)' if slot in real else ''}, not the padding's slot 0",
                 effect="wrong", writer=REPLAY, buffer="out_cache_loc", cell="padded row", stage="replay")


def _padded_reads(prop: str, s, got, step, raw: int, where: str) -> None:
    """A padded branch reads only what the metadata kernel wrote for it this replay (its padded length, then
    its chain so far), from the padding's pool row 0. A longer ``kv_indptr`` range (built from ``positions``,
    where the kernel's offsets come from ``seq_lens``) runs into cells another branch or an earlier, larger
    replay left; a stale ``req_pool_indices`` row hands it a live request's KV. Either is a read no padding
    owns, and stale state a real batch never chose (past the buffer, a device's kernel faults)."""
    k = s.shape.topk
    seq_lens = got.view.seq_lens.tolist() if got.view is not None else []
    for z in range(raw * k, min(len(step.attended), len(seq_lens) * k)):
        attended, wrote = step.attended[z], int(seq_lens[z // k]) + step.step + 1
        if len(attended) > wrote:
            fail(prop, f"{where}: step {step.step}, padded branch {z} is handed {len(attended)} KV ids by its "
                       f"kv_indptr range, the kernel wrote {wrote} for it (seq_len {seq_lens[z // k]} + "
                       f"{step.step + 1} chain): it reads cells it does not own", effect="wrong", writer=REPLAY,
                 buffer="positions", cell="padded row", stage="replay")
        live = [slot for slot in attended if 1 <= s.pool_row(slot) <= raw]
        if live:
            fail(prop, f"{where}: step {step.step}, padded branch {z} reads KV slot {live[0]} of pool row "
                       f"{s.pool_row(live[0])}, a live request's", effect="wrong", writer=REPLAY,
                 buffer="req_pool_indices", cell="padded row", stage="replay")


def graph_buffer_soundness(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
    """Each static buffer holds what the largest batch ``can_run_graph`` admits needs, judged twice,
    since the two ask different things of SGLang's sizing:

    - ``capacity``: every request long enough to draft all ``n`` steps inside its context
      (``s_b = C - n``): a buffer short here is under-sized for what any server runs;
    - ``past context``: every request one short of its context (``s_b = C - 1``), whose draft
      steps reach past ``C``: the kv_indices width counts the context, not the steps past it.
    """
    obs = Observation()
    judge_verify_buffers(target, config, obs)
    for page_size in PAGE_SIZES:
        s = session(BUFFERS, target, config, obs, page_size, largest_only=True)  # it replays only a full bucket
        if s is None:
            return obs
        where = f"draft graphs of topk {s.shape.topk}, {s.shape.steps} steps, page size {page_size}"
        have = s.allocated()
        inside = s.shape.context_len - s.shape.steps
        sizes = ([(inside, "capacity")] if inside >= 1 else []) + [(s.shape.context_len - 1, "past context")]
        for length, cell in sizes:
            lens = [length] * s.max_bs
            for name, cells in s.needed(lens).items():
                if cells > have[name]:
                    fail(BUFFERS, f"{where}: {name} holds {have[name]} cells{' a row' if name.startswith('kv_') else ''}; "
                                  f"a replay of {s.max_bs} requests of {length} tokens needs {cells} ({cell})",
                         effect="overrun", writer=REPLAY, buffer=name, cell=cell, stage="replay")
            s.replay(lens)
            _overruns(BUFFERS, s, f"{where}, a replay of {s.max_bs} requests of {length} tokens")
            obs.add_step(config, Batch(tuple(lens)), None, config.max_bs)
            obs.classes.add(f"{cell} judged")
        obs.classes.add(f"page size {page_size}")
    return obs
