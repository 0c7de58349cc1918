"""The draft-extend cuda-graph path: SGLang's draft-extend runners captured, then replayed at padded sizes.

The three graph properties (``graph_replay``) judge the target verify graph;
``with_draft_extend`` makes each of them judge, on the same case, the
draft-extend runners too, one sub-check each (``SUB_CHECKS``): SGLang's EAGLE
v2 ``EAGLEDraftExtendCudaGraphRunner`` and the multi-layer multi-step runner
with its Triton ``prepare`` and with the native torch one an NPU build binds.
Per runner (``target.draft_extend_session``), each batch a graph admits is
replayed at its padded bs and run as the worker's eager path runs it:

- ``graph-replay-equivalence``: on the real rows, every step's logits, hidden
  states and top-k equal the eager run's, each token is handed the same
  query rows and prefix KV slots and writes the same KV, and the rows the
  logits processor's ``select_index`` pruning keeps are the worker's rows;
  on a multi-step runner, in the replay and in the eager loop alike, each
  request's token ids at step i+1 are step i's window shifted left by one
  with step i's top-1 pick at its accepted row (``_rotation``: the meaning
  of ``rotate_input_ids``, which both share).
- ``padding-inert``: the padded rows of every buffer a step writes hold what
  a previous, larger step leaves (the batch's own KV slots, a live request's
  pool row, long lengths, stale picks); the real rows still equal the eager
  run, no padded token writes KV anywhere but slot 0, no padded request reads
  a live request's KV, and no write leaves a static buffer.
- ``capture-replay-agreement``: the view the backend's replay metadata is built
  from has the bucket's batch size and a length sum equal to its padded
  lengths, the fields the runner hands at the graph's size (``_SIZED``:
  every runner's per-request ``spec_info`` counts and extend lengths hold B
  rows; the multi-layer runners' ``input_ids``, ``out_cache_loc`` and
  ``spec_info`` positions and hidden states B·w), read or not, hold them;
  every other per-token field the backend reads holds B·w cells (one it does
  not read is recorded, not judged), ``qo_indptr`` steps by the
  captured width w and equals the eager ``cumsum(extend_seq_lens)`` on the
  real rows, the real rows' KV lengths are the eager ones, every request's
  ``select_index`` (padded ones too) lies in its own window ``[b·w, (b+1)·w)``,
  and the replay read no host value the live program changed after capture.
"""

from __future__ import annotations

import torch

from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.readers import kv_slot_stride
from vmfuzz.harness.properties.draft_graph import draft_window
from vmfuzz.harness.properties.graph_replay import AGREEMENT, CAPTURE_REPLAY, EQUIVALENCE, PADDING, judge_stale_reads
from vmfuzz.harness.properties.graph_shared import INIT_SUB_CHECK, built
from vmfuzz.harness.properties.kit import Observation, fail, known_goes_on, sub_check_done, sub_check_skipped

#: the runners judged, as the target's sessions name them (a sub-check each), after the verify graph's
RUNNERS = ("draft extend", "multi-layer draft extend", "multi-layer draft extend, native prepare")
SUB_CHECKS = ("target verify", INIT_SUB_CHECK) + RUNNERS


def with_draft_extend(prop: str, verify_check):
    """``verify_check`` (one of ``graph_replay``'s), then the same property on each draft-extend runner."""
    def check(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
        obs = verify_check(target, config, batches, device)
        sub_check_done(obs, "target verify")
        for runner in RUNNERS:
            why = (target.draft_extend_not_driven(config, runner) if hasattr(target, "draft_extend_session")
                   else "the target has no draft-extend graph seam (draft_extend_session)")
            if why is not None:
                sub_check_skipped(obs, runner, why)
                continue
            with known_goes_on(target, obs, runner):
                _JUDGES[prop](runner, target, config, batches, obs)
            sub_check_done(obs, runner)
        return obs
    check.__name__ = getattr(verify_check, "__name__", prop)
    check.__doc__ = verify_check.__doc__
    return check


def _steps(prop: str, runner: str, target, config: Config, batches: list[Batch], obs: Observation):
    """Each admitted batch of the case: (session, batch, inputs)."""
    # the EAGLE runner's draft model has window layers where the case's draft-decode model has (the same
    # choice, by the config): its replay then refills the backend's window rail
    window = draft_window(config) if runner == RUNNERS[0] else 0
    session = built(("draft extend", config, runner),
                    lambda: target.draft_extend_session(config, ShadowHeap(), runner, window))
    _overruns(prop, runner, session)
    for batch in batches:
        x = session.inputs(batch)
        if not session.can_run(batch, x):
            obs.classes.add(f"{runner}: not admitted by can_run_graph (eager)")
            continue
        yield session, batch, x


def _origin(runner: str, **fields) -> dict:
    return dict(effect="wrong", writer=f"{runner} replay", stage="replay", **fields)


def _overruns(prop: str, runner: str, session) -> None:
    if session.overruns:
        o = session.overruns[0]
        v = o.violation
        fail(prop, f"{runner}: the {o.phase} of graph {o.graph!r} wrote outside a static buffer: {v.describe()}",
             **_origin(runner, buffer=v.buffer, side="below" if v.side == "front" else "above") | {
                 "effect": "overrun", "stage": o.phase})


def _where(runner: str, batch: Batch, got, step: int) -> str:
    return f"{runner}, step {step}: replay of bs {batch.bs} in the graph captured at bs {got.graph_bs}"


def _compare(prop: str, runner: str, got, want, n: int, where: str, cell: str = "real row") -> None:
    """One step's real rows against the eager run's (n tokens)."""
    pairs = [("logits", got.logits, want.logits), ("hidden_states", got.hidden, want.hidden)]
    if got.topk_index is not None:
        pairs.append(("topk_index", got.topk_index, want.topk_index))
    for name, a, b in pairs:
        if tuple(a.shape) != tuple(b.shape) or not torch.equal(a, b):
            fail(prop, f"{where}: {name} {tuple(a.shape)} differs from the eager run's {tuple(b.shape)}",
                 **_origin(runner, buffer=name, cell=cell))
    for i, (a, b) in enumerate(zip(got.forward.attended[:n], want.forward.attended[:n])):
        if a != b:
            fail(prop, f"{where}: token {i} is handed {a} by the replay's metadata, {b} eagerly",
                 **_origin(runner, buffer="attention", cell=cell))
    if got.forward.kv_writes[:n] != want.forward.kv_writes[:n]:
        i = next(i for i, (a, b) in enumerate(zip(got.forward.kv_writes, want.forward.kv_writes)) if a != b)
        fail(prop, f"{where}: token {i} writes KV {got.forward.kv_writes[i]}, eagerly {want.forward.kv_writes[i]}",
             **_origin(runner, buffer="out_cache_loc", cell=cell))
    picked, raw = got.forward.selected, len(want.logits)
    if picked is not None and want.forward.selected is not None and picked[:raw] != want.forward.selected[:raw]:
        fail(prop, f"{where}: the graph's logits keep rows {picked[:raw]}, the worker's select_index is "
                   f"{want.forward.selected[:raw]}", **_origin(runner, buffer="select_index", cell=cell))


def _rotation(runner: str, steps, select: list[int], w: int, where: str, which: str) -> None:
    """Step i+1's window of each real request is step i's rotated by the meaning of ``rotate_input_ids``:
    the multi-layer worker rotates with that one kernel in the replay and in the eager loop alike, so a
    wrong rotate makes them agree and both be wrong; only the meaning sees it. Request b's window is
    ``[b·w, (b+1)·w)``: cell j takes cell j+1's token for j < w-1, nothing shifts into the last cell (it
    keeps its token), then the accepted row ``select_index[b]`` gets step i's top-1 pick (the last cell
    too, when every draft was accepted)."""
    for step, (a, b) in enumerate(zip(steps, steps[1:]), start=1):
        old, new, picks = a.forward.input_ids, b.forward.input_ids, a.topk_index[:, 0].tolist()
        for r, row in enumerate(select):
            lo = r * w
            want = old[lo + 1:lo + w] + old[lo + w - 1:lo + w]
            want[row - lo] = picks[r]
            if new[lo:lo + w] != want:
                fail(EQUIVALENCE, f"{where}, step {step} ({which}): request {r} is handed token ids "
                                  f"{new[lo:lo + w]}, the step before's {old[lo:lo + w]} shifted left by one with "
                                  f"its pick {picks[r]} at the accepted row {row - lo} is {want}",
                     **_origin(runner, buffer="input_ids", cell="real row"))


def _equivalence(runner: str, target, config: Config, batches: list[Batch], obs: Observation) -> None:
    for session, batch, x in _steps(EQUIVALENCE, runner, target, config, batches, obs):
        got, want = session.replay(batch, x), session.eager(batch, x)
        want_picks(want, x)
        select = x["select"].tolist()
        where = f"{runner}: a batch of bs {batch.bs} (graph bs {got[0].graph_bs})"
        _rotation(runner, got, select, session.width, where, "replay")
        _rotation(runner, want, select, session.width, where, "eager")
        for step, (g, w) in enumerate(zip(got, want)):
            _compare(EQUIVALENCE, runner, g, w, batch.bs * session.width, _where(runner, batch, g, step))
        _overruns(EQUIVALENCE, runner, session)
        obs.add_step(config, batch, None, config.max_bs)
        obs.classes.add(f"{runner}: " + ("padded replay" if got[0].graph_bs > batch.bs else "exact replay"))


def want_picks(want, x) -> None:
    """The eager path gathers the worker's ``select_index`` rows after its forward: those are its picks."""
    for w in want:
        if w.forward.selected is None:
            w.forward.selected = x["select"].tolist()


def _padding(runner: str, target, config: Config, batches: list[Batch], obs: Observation) -> None:
    stride = kv_slot_stride(config.max_context_len)
    for session, batch, x in _steps(PADDING, runner, target, config, batches, obs):
        got = session.replay(batch, x, poison=session.poison(batch, x))
        want = session.eager(batch, x)
        want_picks(want, x)
        n, real = batch.bs * session.width, set(x["loc"].tolist())
        _overruns(PADDING, runner, session)
        for step, (g, w) in enumerate(zip(got, want)):
            where = _where(runner, batch, g, step) + " over stale padded rows"
            stray = [(i, s) for i, (s, _) in enumerate(g.forward.kv_writes[n:], start=n) if s != 0]
            if stray:
                i, s = stray[0]
                owner = (f"which request {x['loc'].tolist().index(s) // session.width} of the batch owns"
                         if s in real else "not the reserved slot 0")
                fail(PADDING, f"{where}: padded token {i} writes KV into slot {s}, {owner} ({len(stray)} such "
                              "writes)", **_origin(runner, buffer="out_cache_loc", cell="padded row"))
            reads = [(a.request, s) for a in g.forward.attended[n:] for s in a.prefix_slots if s // stride > 1]
            if reads:
                b, s = reads[0]
                fail(PADDING, f"{where}: padded request {b} reads KV slot {s} of pool row {s // stride - 1}, a "
                              "live request's", **_origin(runner, buffer="req_pool_indices", cell="padded row"))
            _compare(PADDING, runner, g, w, n, where)
        _stale_rows(runner, session, batch, got[0], obs)
        obs.add_step(config, batch, None, config.max_bs)
        if got[0].graph_bs > batch.bs:
            obs.classes.add(f"{runner}: padded replay")


def _stale_rows(runner: str, session, batch: Batch, got, obs: Observation) -> None:
    """What padded rows kept that no read reached: recorded, so a held case says why it held."""
    B = got.graph_bs
    kept = session.buffers.req_pool_indices[batch.bs:B]
    if kept.numel() and bool((kept != 0).any()) and not any(got.kv_lens[batch.bs:B]):
        obs.classes.add(f"{runner}: padded req_pool_indices stale, gathered by no read (KV length 0)")


def _agreement(runner: str, target, config: Config, batches: list[Batch], obs: Observation) -> None:
    for session, batch, x in _steps(AGREEMENT, runner, target, config, batches, obs):
        got, want = session.replay(batch, x), session.eager(batch, x)
        w = session.width
        for step, (g, e) in enumerate(zip(got, want)):
            where = _where(runner, batch, g, step)
            _view_agrees(runner, g, w, where, obs)
            _rows_agree(runner, g, e, batch, w, where)
        # a runner that keeps no select_index (0.5.17-0.5.20's EAGLE v2 one: it hands back every token's
        # row and the worker picks) has no picks of its own to judge
        picks = getattr(session.buffers, "select_index", None)
        if picks is None:
            obs.classes.add(f"{runner}: no select_index buffer in this SGLang's runner (the worker picks the rows)")
        sel = [] if picks is None else picks[:got[0].graph_bs].tolist()
        for b, s in enumerate(sel):
            if not b * w <= s < (b + 1) * w:
                fail(AGREEMENT, f"{_where(runner, batch, got[0], 0)}: request {b}'s select_index {s} lies outside "
                                f"its window [{b * w}, {(b + 1) * w})", **_origin(
                                    runner, buffer="select_index", cell="padded row" if b >= batch.bs else "real row"))
        judge_stale_reads(session, _where(runner, batch, got[0], 0))
        obs.add_step(config, batch, None, config.max_bs)
        obs.classes.update(f"{runner}: capture-order read: {p}" for p in
                           sorted({s.path for s in session.stale if s.read and not s.after_captures}))


#: The view's per-request (1 cell a request) and per-token (w cells) fields each runner hands the backend at
#: the graph's bs on pristine SGLang 0.5.23: judged on every replay, read or not. Measured over 5 servers
#: and 7 batch shapes, exact and padded, poisoned or not: 54 EAGLE v2 replays and 106 replayed steps of
#: each multi-layer runner, every one at B rows / B·w cells. The EAGLE v2 runner hands the live batch's
#: raw-length ``input_ids``, ``out_cache_loc`` and ``spec_info.hidden_states`` and, padded, a raw-length
#: ``spec_info.positions`` view (None when exact): those are judged only where its backend reads them.
_PER_REQUEST = {"spec_info.num_correct_drafts": 1, "spec_info.num_accept_tokens": 1,
                "spec_info.extend_seq_lens_tensor": 1}
_MULTI_LAYER = _PER_REQUEST | {"spec_info.positions": "w", "spec_info.hidden_states": "w", "input_ids": "w",
                               "out_cache_loc": "w"}
_SIZED = {RUNNERS[0]: _PER_REQUEST, RUNNERS[1]: _MULTI_LAYER, RUNNERS[2]: _MULTI_LAYER}
#: the origin's buffer where it is not the field's own name
_BUFFER = {"spec_info.extend_seq_lens_tensor": "extend_seq_lens"}


def _field(view, path: str):
    *outer, name = path.split(".")
    for part in outer:
        view = getattr(view, part, None)
    return getattr(view, name, None)


def _view_agrees(runner: str, g, w: int, where: str, obs: Observation) -> None:
    """The view handed to the backend: its size and sum, the fields the runner hands at the graph's bs
    (``_SIZED``), and each other per-token field the backend reads.

    No backend driven here reads the sized ``spec_info`` fields (Triton's draft-extend metadata takes
    only ``extend_seq_lens_tensor`` of them; FA3 and TRT-LLM none), but others do, in SGLang 0.5.23:
    ``num_accept_tokens`` in FlashInfer's sliding-window prefill plan (prefix = seq_lens -
    num_accept_tokens[:bs]), DSA's index-K pool metadata and write plan (``dsa_backend``,
    ``dsa_backend_kpool``), and Qwen sparse's MTP anchor rows, which silently fall back to each block's
    end when it has fewer than bs rows. A backend writing KV from the view's ``out_cache_loc`` would be
    handed a short tensor by a multi-layer view cut short."""
    view, B = g.view, g.graph_bs
    origin = dict(cell=CAPTURE_REPLAY)
    if view is None:
        fail(AGREEMENT, f"{where}: the backend's replay metadata was never set up",
             **_origin(runner, buffer="replay view", **origin))
    if view.batch_size != B:
        fail(AGREEMENT, f"{where}: the view's batch_size is {view.batch_size}, the graph's {B}",
             **_origin(runner, buffer="batch_size", **origin))
    if view.seq_lens_sum is not None and view.seq_lens_sum != int(view.seq_lens[:B].sum()):
        fail(AGREEMENT, f"{where}: the view's seq_lens_sum is {view.seq_lens_sum}, its padded seq_lens sum to "
                        f"{int(view.seq_lens[:B].sum())}", **_origin(runner, buffer="seq_lens_sum", **origin))
    sized = _SIZED.get(runner, _PER_REQUEST)
    for path, per in sized.items():
        value, want = _field(view, path), B * (w if per == "w" else 1)
        have = None if value is None else value.shape[0]
        unit = "cells" if per == "w" and (value is None or value.dim() == 1) else "rows"
        if have != want:
            fail(AGREEMENT, f"{where}: the view's {path} has {have} {unit}, the graph of bs {B} holds {want}",
                 **_origin(runner, buffer=_BUFFER.get(path, path.rsplit(".", 1)[-1]), **origin))
    for path in ("input_ids", "out_cache_loc", "positions", "spec_info.positions", "spec_info.hidden_states"):
        value = _field(view, path)
        if path in sized or value is None or value.shape[0] == B * w:
            continue
        # reads are recorded per field of the view: a spec_info field outside _SIZED is recorded only
        if path in g.view_reads:
            fail(AGREEMENT, f"{where}: the backend reads the view's {path} of {value.numel()} cells, the graph of "
                            f"bs {B} holds {B * w}", **_origin(runner, buffer=path, **origin))
        unit = "rows" if value.dim() > 1 else "cells"
        why = "the live batch's, not judged" if "." in path else "unread by the backend"
        obs.classes.add(f"{runner}: view {path} holds {value.shape[0]} of B*w {unit}, {why}")


def _rows_agree(runner: str, g, e, batch: Batch, w: int, where: str) -> None:
    """The backend's query rows step by the captured width and equal the eager rows; KV lengths too."""
    qo, raw = list(g.qo_indptr), batch.bs
    steps = {b - a for a, b in zip(qo, qo[1:])}
    origin = dict(cell=CAPTURE_REPLAY)
    if steps != {w}:
        fail(AGREEMENT, f"{where}: qo_indptr {qo} steps by {sorted(steps)}, the captured width is {w}",
             **_origin(runner, buffer="qo_indptr", **origin))
    if qo[:raw + 1] != list(e.qo_indptr[:raw + 1]):
        fail(AGREEMENT, f"{where}: qo_indptr {qo[:raw + 1]} on the real rows, eagerly {list(e.qo_indptr)}",
             **_origin(runner, buffer="qo_indptr", **origin))
    if list(g.kv_lens[:raw]) != list(e.kv_lens[:raw]):
        fail(AGREEMENT, f"{where}: KV lengths {list(g.kv_lens[:raw])} on the real rows, eagerly "
                        f"{list(e.kv_lens[:raw])}", **_origin(runner, buffer="kv_indptr", **origin))


_JUDGES = {EQUIVALENCE: _equivalence, PADDING: _padding, AGREEMENT: _agreement}
