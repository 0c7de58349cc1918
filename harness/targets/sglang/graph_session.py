"""One server's target verify cuda graphs, for the graph-path properties (``graph_runner`` drives them).

``GraphSession`` captures the runner's graphs at every captured bs once, then
for each step makes the live batch (draft token ids and KV slots of its own,
none 0: slot 0 is where padding writes), replays it through ``execute``
(optionally over padded rows poisoned with another step's content) and runs
it eagerly for comparison. What the graph stand-in recorded (stale reads,
overruns) is handed through.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.glue import EARLY
from vmfuzz.harness.targets.sglang.graph_model import Forward
from vmfuzz.harness.model.oracle import expected
from vmfuzz.harness.targets.sglang import pp_stage
from vmfuzz.harness.targets.sglang.graph_runner import (Replayed, build, can_run, eager, idle_batch, live_batch,
                                                        modules, replay)


def captured_sizes(max_bs: int) -> list[int]:
    """The captured bs list a server of ``max_bs`` has (``readers.captured_bs``'s buckets)."""
    from vmfuzz.harness.model.readers import captured_bs
    return sorted({captured_bs(n, max_bs) for n in range(1, max_bs + 1)})


#: the runner's static buffers a padded replay leaves rows of, and the axis they are cut on
PADDED_ROWS = {"input_ids": "tokens", "positions": "tokens", "out_cache_loc": "tokens",
               "req_pool_indices": "requests", "seq_lens": "requests", "seq_lens_cpu": "requests"}


class RunnerView:
    """The graph-path properties' view of one session's runner (``self.server``): what the graph
    stand-in recorded (stale reads, overruns), the runner's static buffers, its captures' model calls."""

    server: object

    @property
    def stale(self):
        return self.server.space.stale

    @property
    def overruns(self):
        return self.server.space.overruns

    @property
    def buffers(self):
        return self.server.runner.buffers

    @property
    def captures(self) -> dict:
        return self.server.captures


class GraphSession(RunnerView):
    """One target verify runner of a server (``config``): its graphs captured at every captured bs,
    then batches replayed through ``execute`` and run eagerly for comparison.

    ``capture`` False: the runner as its own ``__init__`` sized it, no graph captured (its sizing judged).

    Each step is a live batch of ``Batch`` with draft token ids and KV slots the session makes
    (distinct, none 0: slot 0 is where padding writes) and the verify mask ``mask``.

    Given a ``stage`` (``pp_stage.Stage``: the server's verify call site is the pipeline-parallel
    rebuild), the runner is a later pipeline stage's: its replays run the verify
    input SGLang's rebuild makes from a relay labelled for another order, the length sum unknown,
    with the earlier stage's hidden states handed in (one step in two loaded ahead without them, as
    the verify preparation loads it: ``execute`` then refreshes them); the eager run is the batch as it means (the
    oracle's tokens, positions and mask) with the same hidden states.

    ``glue``: the server switches SGLang's metadata glue graph on (``glue_graph``; ``glue_watch`` is it,
    watched, or None with ``glue_not_driven`` saying why). Its graph freezes the host values of the prep
    it captures, the verify mask's address and length among them, so a replayed batch then hands its
    mask as the server's call site does: written into the backend's own mask buffer, which a graph-admitted
    batch always fits (EAGLE's and the chain's call sites; the pipeline rebuild's, SGLang's own), or a
    tensor of its own each step (the frozen-KV MTP worker's, which never passes a buffer:
    ``per_step_mask``).

    ``window_pool``: the server's KV pool keeps its window layers apart (``swa_server``; ``window_pool``
    is it, or None with ``window_pool_not_driven`` saying why): each live batch carries its KV-location
    plan, and its write slots come from the pool's ring."""

    def __init__(self, config: Config, mask, heap: ShadowHeap, stage=None, capture: bool = True,
                 glue: bool = False, window_pool: bool = False, dspark: bool | str = False):
        self.config, self.stage = config, stage
        self.pp = stage is not None
        self.server = build(config, captured_sizes(config.max_bs), mask, heap,
                            pp_size=pp_stage.PP_SIZE if self.pp else 1, capture=capture, glue=glue,
                            window_pool=window_pool, dspark=dspark)
        self.dspark = getattr(self.server.glue, "stage", None) and self.server.glue  # its watch, where staged
        self.capture_bs = self.server.capture_bs
        self.steps = 0
        self.glue_asked = glue
        self.glue_watch = self.server.glue
        self.glue_not_driven = self.server.glue_not_driven
        self.dspark_hooks = self.server.dspark_hooks
        self.staged_declined = None  # what a runner whose backend declined the glue answered a stage
        self.per_step_mask = config.call_site == "frozen_kv_mtp"
        self.window_pool = self.server.window_pool
        self.window_pool_not_driven = self.server.window_pool_not_driven
        self._staged = None  # the last live batch staged early (a DSpark server's)
        self.replayed_batch = None  # the live batch of the last replay
        self.early_expected = False  # whether its load should take the early stage (``DSparkWatch.expects_early``)

    def inputs(self, batch: Batch):
        """(draft token ids, out_cache_loc) of this step's live batch: ids in [1, 13], slots distinct and
        never 0 (step-unique, so a slot left from an earlier step is not this step's; a window pool's
        from its ring, which its slot map covers)."""
        n = batch.bs * self.config.d
        self.steps += 1
        ids = (torch.arange(n, dtype=torch.long) * 5 + self.steps) % 13 + 1
        if self.pp:  # the tokens the relayed tree carries, in the order the verify step means them
            ids = expected(self.config, batch).draft_token
        loc = (self.window_pool.slots(n) if self.window_pool is not None else
               torch.arange(n, dtype=torch.long) + 100000 * self.steps)
        return ids, loc

    def live(self, batch: Batch, mask, ids, loc, replayed: bool = False):
        """The live batch (``replayed``: the one handed to ``execute``, its mask as the call site hands it
        where the glue graph is on; else a tensor of its own, as the eager reference reads it)."""
        positions = expected(self.config, batch).positions if self.pp else None
        return live_batch(self.server, batch, self._mask(mask) if replayed else mask.clone(), ids.clone(),
                          loc.clone(), positions)

    def _mask(self, mask):
        if self.glue_watch is None or self.per_step_mask:
            return mask.clone()
        buffer = self.server.backend._verify_mask.buffer  # the call site's: written in place, handed whole
        buffer[:mask.numel()].copy_(mask)
        return buffer

    def glue_lead_ins(self, batch: Batch) -> list[Batch]:
        """The batches of ``batch``'s bs to replay before it so that its replay is one of the glue graph's
        (its warm-ups, then its capture): each request one token shorter a step back (a decode's lengths
        grow by one a step; wrapping below zero to the context's end), so what the prep reads moves
        between the capture and the replay. None where the glue is off, the batch pads (SGLang prepares a
        padded replay eagerly), or its graph is captured already."""
        watch = self.glue_watch
        if watch is None or batch.bs not in self.capture_bs:
            return []
        m, runner = modules(), self.server.runner
        # the candidate variant a DSpark server keys its glue by (a release whose runner builds no glue key of
        # its own, 0.5.22's, keys it by none)
        variant = runner._resolve_attention_variant(SimpleNamespace(seq_lens_cpu=torch.tensor(
            batch.seq_lens), spec_info=None), batch.bs) if hasattr(runner, "_glue_key") else None
        key = watch.key_for(runner, batch.bs, str(m.forward_info.ForwardMode.TARGET_VERIFY), variant)
        wrap = self.config.max_context_len + 1
        return [Batch(tuple((s - j) % wrap for s in batch.seq_lens), batch.trees)
                for j in range(watch.steps_to_replay(key), 0, -1)]

    def _proxy(self, loc):
        return self.stage.proxy(loc) if self.pp else None

    def can_run(self, batch: Batch, mask, ids, loc) -> bool:
        return can_run(self.server, self.live(batch, mask, ids, loc))

    def replay(self, batch: Batch, mask, ids, loc, poison: dict[str, torch.Tensor] | None = None) -> Replayed:
        """``execute`` the batch; ``poison``: buffer name -> values written over its rows past the
        batch's (``PADDED_ROWS``) first, as a previous, larger step would have left them."""
        fb = self.live(batch, mask, ids, loc, replayed=True)
        if self.pp:
            spec = self.stage.verify_input(batch)
            fb = live_batch(self.server, batch, mask, ids, loc.clone(), spec=spec)
        self._poison(batch, poison)
        self.replayed_batch = fb
        # a DSpark server's step is staged early from its own tensors, or, after a step that took its stage,
        # from that step's (which its load must reject)
        if self.dspark:
            self.dspark.live = fb
            own = not (self.dspark.last_outcome == EARLY and self._staged is not None)
            self.early_expected = own and self.dspark.expects_early(batch, self.config, self.capture_bs)
            self.dspark.stage(fb if own else self._staged, self.server.lookups())
            self._staged = fb
        elif getattr(self.dspark_hooks, "expect_declined", False):
            self._stage_declined(fb)
        # a stage's odd steps are loaded ahead by the verify preparation, its even ones by the forward; a
        # DSpark server's verify batches are all planned ahead
        got = replay(self.server, fb, self._proxy(loc), planned=bool(self.dspark) or self.pp and self.steps % 2 == 1)
        if self.dspark:
            self.dspark.note(batch, self.config, got.glue)
        return got

    def _stage_declined(self, fb) -> None:
        """A DSpark step on a runner whose backend declined the glue: staged as DSpark's worker stages every
        step, which such a runner must refuse (``staged_declined``: what it answered last)."""
        from vmfuzz.harness.targets.sglang.dspark_verify import stage_unwatched
        self.staged_declined = stage_unwatched(self.server.runner, fb, self.server.lookups())

    def _poison(self, batch: Batch, poison: dict[str, torch.Tensor] | None) -> None:
        for name, values in (poison or {}).items():
            buf = getattr(self.buffers, name)
            start = batch.bs * (self.config.d if PADDED_ROWS[name] == "tokens" else 1)
            tail = buf[start:start + values.numel()]
            tail.copy_(values[:tail.numel()].to(buf.dtype))

    def eager(self, batch: Batch, mask, ids, loc) -> Forward:
        return eager(self.server, self.config, batch, self.live(batch, mask, ids, loc), self._proxy(loc))

    def fallback(self, batch: Batch, mask, ids, loc):
        """A batch no graph admits, on the later stage: its verify input rebuilt (the backend's mask does
        not fit it, so the rebuild sizes its own allocation from a length bound), then run eagerly.
        Returns (the eager run, what the rebuild wrote outside its buffers); None off a pipeline stage."""
        if not self.pp:
            return None
        n0 = len(self.server.space.overruns)
        spec = self.stage.verify_input(batch)
        self.server.space.check("pp rebuild", "rebuild")
        outside = self.server.space.overruns[n0:]
        if outside:
            return None, outside
        fb = live_batch(self.server, batch, mask, ids, loc.clone(), spec=spec)
        return eager(self.server, self.config, batch, fb, self._proxy(loc)), []

    def idle(self, poison: dict[str, torch.Tensor] | None = None) -> Replayed:
        """An idle step of the later stage (no request: the rebuild's idle input) through ``execute``,
        over padded rows ``poison``ed first; None where the server is not a pipeline stage or no graph
        admits it."""
        if not self.pp:
            return None
        fb = idle_batch(self.server, self.stage.idle_input())
        if not can_run(self.server, fb):
            return None
        self._poison(Batch(()), poison)
        return replay(self.server, fb, self._proxy(torch.empty(0, dtype=torch.long)))

    def captured_view(self, graph_bs: int):
        """The capture-time ForwardBatch of the graph of ``graph_bs`` (what its body reads)."""
        for g in self.server.space.graphs:
            body = getattr(g.body, "__closure__", None)
            code = getattr(g.body, "__code__", None)
            if body is None or code is None:
                continue
            cells = dict(zip(code.co_freevars, (c.cell_contents for c in body)))
            fb = cells.get("forward_batch")
            if fb is not None and fb.batch_size == graph_bs:
                return fb
        return None
