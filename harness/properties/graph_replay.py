"""The target verify cuda-graph path: SGLang's ``DecodeCudaGraphRunner`` captured, then replayed.

One session per case (``target.graph_session``): the runner's graphs are
captured at every captured bs, then each batch a graph admits is replayed at
its padded bs through the runner's own ``execute`` and run eagerly (the
backend's eager TARGET_VERIFY metadata, the same recording model). Three
properties judge the replay:

- ``graph-replay-equivalence``: on the real rows, the replay gives exactly
  what the eager run gives: logits, hidden states, what attention was handed
  per token (its prefix KV slots, the draft tokens its mask row shows) and
  the KV writes.
- ``padding-inert``: the padded rows of the runner's static buffers hold
  another step's content (real KV slots, long lengths, other pool rows)
  before the replay; the real rows give what the eager run gives, no padded
  token writes KV into a slot of the batch, and no write leaves a static
  buffer (the graph stand-in's redzones).
- ``capture-replay-agreement``: what the replay hands the backend for bs B
  agrees with what the capture of B had (batch size, the lengths of every
  per-request and per-token field, the length sum equal to the lengths' sum),
  and the replay read no host value the live program changed after capture
  (the graph stand-in's stale reads, a ``capture-replay`` origin); and what
  ``can_run_graph`` admits agrees with what was captured: a batch no wider
  than the largest captured graph is admitted (``refused_though_captured``).

Each then judges the draft-decode runner the same way (``draft_graph.judge_draft``).

One case in ``graph_glue.GLUE_SHARE`` switches SGLang's metadata glue graph on
(``graph_glue``): its batches of a captured bs are then replayed after lead-ins
that make their own replay's prep a replay of the glue graph, judged by the same
three properties.
"""

from __future__ import annotations

import torch

from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.oracle import expected
from vmfuzz.harness.properties import graph_glue as glue
from vmfuzz.harness.properties.draft_graph import judge_draft
from vmfuzz.harness.properties.graph_shared import (AGREEMENT, EQUIVALENCE, INIT_SUB_CHECK, PADDING, built,
                                                    read_layout, refused_though_captured)
from vmfuzz.harness.properties.kit import Observation, allocated, fail, sub_check_done, sub_check_skipped

REPLAY = "cuda-graph replay"
#: the cell class of a value the replay read that changed since its capture
CAPTURE_REPLAY = "capture-replay"


def _session(prop: str, target, config: Config):
    def make():
        heap = ShadowHeap()
        return target.graph_session(config, allocated(prop, target, config, heap), heap,
                                    **glue.session_options(config))
    return built(("target verify", config), make)


def _steps(prop: str, target, config: Config, batches: list[Batch], obs: Observation):
    """Each admitted batch of the case, each preceded by the lead-ins its glue graph needs (``graph_glue``):
    (session, batch, mask, ids, loc)."""
    session = _session(prop, target, config)
    note_set_up(session, obs)
    glue.note_case(obs, session, config)
    _overruns(prop, session, "capture")
    for batch in (step for b in batches for step in (*glue.lead_ins(session, b), b)):
        mask = expected(config, batch).tree_mask
        ids, loc = session.inputs(batch)
        if not session.can_run(batch, mask, ids, loc):
            obs.classes.add("not admitted by can_run_graph (eager)")
            if prop == AGREEMENT and not session.pp:
                refused_though_captured(AGREEMENT, "target verify", batch.bs, session.capture_bs)
            if prop == EQUIVALENCE and session.pp:
                _judge_stage_fallback(session, batch, mask, ids, loc, obs)
            continue
        yield session, batch, mask, ids, loc


def note_set_up(session, obs: Observation) -> None:
    """Whether the runner is its own ``__init__``'s (a sub-check): one vmfuzz assembled by hand, on a
    release whose ``__init__`` it cannot drive, leaves that ``__init__`` not driven, said."""
    why = session.server.init_not_driven
    if why:
        sub_check_skipped(obs, INIT_SUB_CHECK, f"the runner was assembled by vmfuzz: {why}")
    else:
        sub_check_done(obs, INIT_SUB_CHECK)


def _judge_stage_fallback(session, batch: Batch, mask, ids, loc, obs: Observation) -> None:
    """A pipeline stage's batch no graph admits: the rebuild writes inside the allocation it sized, and
    the eager run of what it rebuilt is the eager run of the batch as it means."""
    got, outside = session.fallback(batch, mask, ids, loc)
    where = f"eager run of bs {batch.bs} on the pipeline stage (no graph admits it)"
    if outside:
        v = outside[0].violation
        fail(EQUIVALENCE, f"{where}: the verify input's rebuild wrote outside {v.buffer}: {v.describe()}",
             effect="overrun", writer="pp rebuild", buffer=v.buffer,
             side="below" if v.side == "front" else "above", stage="rebuild")
    want = session.eager(batch, mask, ids, loc)
    for name, a, b in (("logits", got.logits, want.logits), ("hidden_states", got.hidden, want.hidden)):
        if a.shape != b.shape or not torch.equal(a, b):
            fail(EQUIVALENCE, f"{where}: {name} of the rebuilt batch differ from the batch as it means",
                 effect="wrong", writer="pp rebuild", buffer=name, cell="real row", stage="rebuild")
    obs.classes.add("pipeline stage: eager, rebuilt with the length bound")


def _overruns(prop: str, session, where: str) -> None:
    if session.overruns:
        o = session.overruns[0]
        v = o.violation
        fail(prop, f"the {o.phase} of graph {o.graph!r} wrote outside a static buffer: {v.describe()}",
             effect="overrun", writer=REPLAY if o.phase == "replay" else "cuda-graph capture", buffer=v.buffer,
             side="below" if v.side == "front" else "above", stage=o.phase)


def _compare_rows(prop: str, got, want, n: int, d: int, where: str, writer: str = REPLAY) -> None:
    """The replay's real rows against the eager run (n tokens); ``writer``: who prepared its metadata."""
    for name, a, b in (("logits", got.logits, want.logits), ("hidden_states", got.hidden, want.hidden)):
        if tuple(a.shape) != tuple(b.shape):
            fail(prop, f"{where}: {name} has {tuple(a.shape)} rows, the eager run {tuple(b.shape)}",
                 effect="wrong", writer=writer, buffer=name, cell="rows", stage="replay")
        if not torch.equal(a, b):
            row = int((a != b).any(dim=-1).nonzero()[0])
            fail(prop, f"{where}: {name} row {row} (request {row // d}) differs from the eager run", effect="wrong", writer=writer, buffer=name,
                 cell="real row", stage="replay")
    attended = got.forward.attended[:n]
    for i, (a, b) in enumerate(zip(attended, want.attended)):
        if a != b:
            fail(prop, f"{where}: token {i} is handed {a} by the replay's attention metadata, {b} eagerly",
                 effect="wrong", writer=writer, buffer="attention", cell="real row", stage="replay")
    for buffer, says, a, b in (("out_cache_loc", " writes", got.forward.kv_writes, want.kv_writes),
                               ("swa_out_cache_loc", "'s window layers write", got.forward.window_writes,
                                want.window_writes)):
        if a[:n] != b:  # (slot, value) per token; a window pool's window layers write slots of their own
            i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            fail(prop, f"{where}: token {i}{says} KV {a[i] if i < len(a) else None}, eagerly "
                       f"{b[i] if i < len(b) else None}",
                 effect="wrong", writer=writer, buffer=buffer, cell="real row", stage="replay")


def _where(batch: Batch, got) -> str:
    return f"replay of bs {batch.bs} in the graph captured at bs {got.graph_bs}{glue.where(got, batch)}"


def graph_replay_equivalence(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
    obs = Observation()
    config = read_layout(config)
    session = None
    for session, batch, mask, ids, loc in _steps(EQUIVALENCE, target, config, batches, obs):
        got = session.replay(batch, mask, ids, loc)
        want = session.eager(batch, mask, ids, loc)
        with glue.known_goes_on(target, obs, got):
            _compare_rows(EQUIVALENCE, got, want, batch.bs * config.d, config.d, _where(batch, got),
                          glue.writer(session, got, REPLAY))
        _overruns(EQUIVALENCE, session, "replay")
        obs.add_step(config, batch, None, config.max_bs)
        obs.classes.add("padded replay" if got.graph_bs > batch.bs else "exact replay")
        glue.note_step(obs, got)
        _note_stage(session, obs)
    _idle(EQUIVALENCE, session, obs)
    judge_draft(EQUIVALENCE, target, config, batches, obs)
    return obs


def _poison(config: Config, batch: Batch, loc: torch.Tensor, session) -> dict[str, torch.Tensor]:
    """What a previous, larger step leaves in the padded rows: this batch's own KV slots, lengths at the
    context limit, the batch's pool rows, positions and token ids no padding would hold."""
    max_tokens = config.max_bs * config.d
    reps = max_tokens // max(1, loc.numel()) + 1
    return {"out_cache_loc": loc.repeat(reps)[:max_tokens],
            "seq_lens": torch.full((config.max_bs,), config.max_context_len),
            "seq_lens_cpu": torch.full((config.max_bs,), config.max_context_len),
            "req_pool_indices": torch.zeros(config.max_bs, dtype=torch.long),
            "positions": torch.full((max_tokens,), config.max_context_len + config.d),
            "input_ids": torch.full((max_tokens,), 12)}


def padding_inert(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
    obs = Observation()
    config = read_layout(config)
    session = last = None  # the last replayed batch and its slots: what an idle step's padded rows are poisoned with
    for session, batch, mask, ids, loc in _steps(PADDING, target, config, batches, obs):
        got = session.replay(batch, mask, ids, loc, poison=_poison(config, batch, loc, session))
        want = session.eager(batch, mask, ids, loc)
        n = batch.bs * config.d
        where = _where(batch, got) + " over stale padded rows"
        _overruns(PADDING, session, "replay")
        _padded_writes(config, got, want, loc, n, where)
        with glue.known_goes_on(target, obs, got):
            _compare_rows(PADDING, got, want, n, config.d, where, glue.writer(session, got, REPLAY))
        obs.add_step(config, batch, None, config.max_bs)
        if got.graph_bs > batch.bs:
            obs.classes.add("padded replay")
        glue.note_step(obs, got)
        _note_stage(session, obs)
        last = (batch, loc)
    if last is not None:
        _idle(PADDING, session, obs, _poison(config, last[0], last[1], None), set(last[1].tolist()))
    judge_draft(PADDING, target, config, batches, obs)
    return obs


def _padded_writes(config: Config, got, want, loc: torch.Tensor, n: int, where: str) -> None:
    """No padded token writes KV into a slot of the batch's (its window layers: into a window slot the
    eager run's real tokens write)."""
    for buffer, writes, real in (("out_cache_loc", got.forward.kv_writes, loc.tolist()),
                                 ("swa_out_cache_loc", got.forward.window_writes, [s for s, _ in want.window_writes])):
        owned = set(real)
        stray = [(i, s) for i, (s, _) in enumerate(writes[n:], start=n) if s in owned]
        if stray:
            i, s = stray[0]
            fail(PADDING, f"{where}: padded token {i} writes KV into slot {s} ({buffer}), which request "
                          f"{real.index(s) // config.d} of the batch owns ({len(stray)} such writes)",
                 effect="wrong", writer=REPLAY, buffer=buffer, cell="padded row", stage="replay")


def _note_stage(session, obs: Observation) -> None:
    if session.pp:
        obs.classes.add("pipeline stage: relay re-indexed by request id, length sum unknown")


def _idle(prop: str, session, obs: Observation, poison=None, live: set | None = None) -> None:
    """A pipeline stage's idle step replayed on the case's ``session`` (its verify input the rebuild's
    idle one, every row padding, over ``poison``: a live batch's content, its KV slots ``live``): it
    hands back no row, and its padding writes no KV into a live slot and nothing outside a static buffer."""
    if session is None:
        return
    got = session.idle(poison)
    if got is None:
        return
    where = f"idle replay in the graph captured at bs {got.graph_bs}"
    _overruns(prop, session, "replay")
    if got.logits.shape[0] or got.hidden.shape[0]:
        fail(prop, f"{where}: it hands back {got.logits.shape[0]} rows of logits, an idle step has none",
             effect="wrong", writer=REPLAY, buffer="logits", cell="rows", stage="replay")
    stray = [(i, slot) for i, (slot, _) in enumerate(got.forward.kv_writes) if slot in (live or set())]
    if stray:
        fail(prop, f"{where}: padded token {stray[0][0]} writes KV into slot {stray[0][1]}, a live request's "
                   f"({len(stray)} such writes)",
             effect="wrong", writer=REPLAY, buffer="out_cache_loc", cell="padded row", stage="replay")
    obs.classes.add("pipeline stage: idle replay")


def judge_stale_reads(session, where: str, target=None, obs: Observation | None = None) -> None:
    """A host value the graph read that the live program changed after every capture: a device replays
    the capture's value, so what the replay prepared for it is not what the graph runs (a glue graph's:
    what its prep would have computed from the live view is not what it replays). Each such read is
    judged in turn; with ``target`` and ``obs``, one a known entry names is recorded and the next judged."""
    for stale in (s for s in session.stale if s.read and s.after_captures):
        with glue.known_goes_on(target, obs, stale):
            fail(AGREEMENT, f"{where}: the graph read {stale.describe()}; a device replays the capture's value",
                 effect="wrong", writer=glue.stale_writer(session, stale, REPLAY), buffer=stale.path,
                 cell=CAPTURE_REPLAY, stage="replay")


def capture_replay_agreement(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
    obs = Observation()
    config = read_layout(config)
    d = config.d
    for session, batch, mask, ids, loc in _steps(AGREEMENT, target, config, batches, obs):
        got = session.replay(batch, mask, ids, loc)
        B, view = got.graph_bs, got.view
        where = _where(batch, got)
        origin = dict(effect="wrong", writer=glue.writer(session, got, REPLAY), cell=CAPTURE_REPLAY, stage="replay")
        if view is None:
            fail(AGREEMENT, f"{where}: the backend's replay metadata was never set up", buffer="replay view",
                 **origin)
        captured = session.captured_view(B)
        want = {"batch_size": B, "seq_lens": B, "req_pool_indices": B, "positions": B * d, "input_ids": B * d}
        if captured is not None:  # what the capture of B handed the same backend
            want.update(batch_size=captured.batch_size, seq_lens=captured.seq_lens.numel(),
                        req_pool_indices=captured.req_pool_indices.numel(),
                        positions=captured.positions.numel(), input_ids=captured.input_ids.numel())
        for field, n in want.items():
            value = getattr(view, field)
            got_n = value if field == "batch_size" else value.numel()
            if got_n != n:
                fail(AGREEMENT, f"{where}: the replay hands the backend {field} of {got_n}, the capture of "
                                f"bs {B} had {n}", buffer=field, **origin)
        if view.seq_lens_sum is not None and view.seq_lens_sum != int(view.seq_lens.sum()):
            fail(AGREEMENT, f"{where}: the replay's seq_lens_sum is {view.seq_lens_sum}, its padded seq_lens "
                            f"sum to {int(view.seq_lens.sum())} (the padding's lengths left out of the sum)",
                 buffer="seq_lens_sum", **origin)
        judge_stale_reads(session, where, target, obs)
        glue.judge_declined(AGREEMENT, session, where)
        glue.judge_route(AGREEMENT, got, batch, where)
        glue.judge_early(AGREEMENT, session, got, where)
        obs.add_step(config, batch, None, config.max_bs)
        glue.note_step(obs, got)
        kept = {s.path for s in session.stale if s.read and not s.after_captures}
        obs.classes.update(f"capture-order read: {p}" for p in sorted(kept))
    judge_draft(AGREEMENT, target, config, batches, obs)
    return obs
