"""CUDA-graph capture and replay, emulated on the CPU: what SGLang's graph runners capture with.

A real CUDA graph records the kernels one call of a function launches and
replays exactly those launches later. The launches keep reading and writing
the *same* device tensors (the runner's static buffers), so new contents a
runner copies in before a replay are seen; everything the function decided on
the host while it was captured (Python numbers, shapes, which tensor an object
held, which branch it took) is frozen into the graph and never looked at again.

This module stands in for that on a CPU with one rule: **capture runs the body
once, eagerly, and keeps it; replay runs the same body again on the same
static tensors, with the host state it reads put back to what it was at
capture.** What the body reads from the host is watched: at capture the
stand-in takes a snapshot of the body's closure (every free variable; for a
plain object, its fields; one level further for a plain object held in a
field: a ForwardBatch's spec info, a backend's metadata), recording numbers
and strings by value and tensors by identity (address, shape, strides, dtype).
At replay each watched value that changed since capture is put back for the
replay's duration, and where the body reads it (attribute reads are tracked;
a closure variable is read by its code), a ``StaleRead`` is recorded: the live
program would have used the new value, the graph uses the old one. That
disagreement is a capture/replay finding for a property to judge; it is never
dropped.

Static buffers are redzoned (``shadow.ShadowHeap``): ``GraphSpace.static``
adopts a tensor as one, and after capture and after every replay the heap is
checked, so a write that leaves a static buffer is recorded as an
``Overrun``.

Where the emulation cannot be faithful it raises ``NotFaithful`` (an
``OutOfStep``: vmfuzz could not check, never a pass): a stream or an event
used for ordering (a CPU runs everything in order, so a program that depends
on a second stream's timing is not being reproduced; ``graph_device`` says
which uses are faithful: a side stream handed to ``torch.cuda.graph`` as the
capture's stream is), a graph replayed whose capture kept no body (something
captured kernels this stand-in never saw), a capture begun inside another. A
refusal raised inside a capture is also recorded (``refusals``), so a program
that catches a failed capture and goes on eagerly cannot hide it.

A capture runs its body, where a device's records it and runs nothing: the
runners' own captures follow warm-ups of the same body, so what the capture
run leaves is what the warm-ups left; a body kept with ``executes=False`` has
its contents put back after the capture run, for a program (the metadata glue
graph) that relies on replaying right after capturing.

API (small on purpose; the draft-side runners reuse it):

- ``GraphSpace(heap)``: one emulated device. ``static(name, tensor,
  redzone_cells)``, ``capturable(fn, watch=(), executes=True)``, ``settle()``
  (captures done), ``CUDAGraph``, ``graph``, ``Stream``, ``refusals``,
  ``graph_pool_handle``, ``device_module()`` (what a runner's
  ``device_module`` is), ``stale``, ``overruns``, ``capturing``.
- ``Graph``: ``capture_begin``, ``capture_end``, ``replay``, ``reset``,
  ``pool``, ``capture(fn, watch=())`` (begin, run, keep, end in one).
- ``StaleRead``, ``Overrun``: the records; ``NotFaithful``: the refusal.
"""

from __future__ import annotations

import contextlib
import itertools
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from vmfuzz.harness.guard.graph_device import (CAPTURE_ERROR_MODES, CAPTURING_SPACES, FILE, SEAM, DefaultStream, Event,
                                               NotFaithful, SideStream, capture_stream_ok, check_staged_joined, refuse)
from vmfuzz.harness.guard.graph_state import (ACTIVE, GONE, ReadLog, Watched, described, put_back, reachable_contents,
                                              shown, snapshot)
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.outputs import Violation

# NotFaithful, SEAM and FILE are this module's names for their users; the device around the graphs
# (streams, events, refusals) lives in graph_device
__all__ = ["FILE", "SEAM", "Graph", "GraphSpace", "NotFaithful", "Overrun", "StaleRead", "rewrite"]


@dataclass(frozen=True)
class StaleRead:
    """A replay read host state that changed since capture: the graph used ``at_capture``.

    ``path`` names the value from the body's closure (``forward_batch.seq_lens_sum``);
    ``read`` is False where the value changed but nothing showed the body read it
    (an object whose reads cannot be tracked: kept, so that it is never lost)."""

    graph: Any  # the key the graph was captured under
    path: str
    at_capture: Any
    at_replay: Any
    read: bool = True
    #: changed after every capture was done (``GraphSpace.settle``): the live program moved it on,
    #: not a later capture (a shared object another graph's capture overwrote)
    after_captures: bool = True

    def describe(self) -> str:
        how = "read" if self.read else "changed (read not tracked)"
        return f"{self.path} {how} at replay of graph {self.graph!r}: captured {self.at_capture}, now {self.at_replay}"


@dataclass(frozen=True)
class Overrun:
    """A write that left a static buffer, seen after a capture or a replay of graph ``graph``."""

    graph: Any
    phase: str  # "capture" or "replay"
    violation: Violation


class Graph:
    """Stands in for ``torch.cuda.CUDAGraph``: one captured body, replayed on the same static tensors."""

    _ids = itertools.count()

    def __init__(self, space: "GraphSpace", key: Any = None):
        self.space = space
        self.key = key if key is not None else f"graph{next(self._ids)}"
        self.body: Callable | None = None
        self._watch: tuple = ()
        self.watched: list[Watched] = []
        self.capturing = False
        self.captured = False
        self._pool = None
        #: what the body returned at capture: a replay writes its results into these same tensors
        self.outputs: Any = None

    # -- torch.cuda.CUDAGraph's methods ------------------------------------------------
    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        if self.space.capturing is not None:
            raise NotFaithful("a capture begun inside another capture (nested graphs are not emulated)")
        self.space.capturing, self.capturing = self, True
        CAPTURING_SPACES.add(id(self.space))
        self._pool = pool if pool is not None else self.space.graph_pool_handle()

    def capture_end(self) -> None:
        if self.space.capturing is not self:
            raise NotFaithful("capture_end of a graph that is not capturing")
        self.space.capturing, self.capturing, self.captured = None, False, True
        CAPTURING_SPACES.discard(id(self.space))
        if self.body is not None:
            # what the graph keeps is the host state as the capture run left it
            self.watched = snapshot(self.body, self._watch)
        self.space.check(self.key, "capture")

    def replay(self) -> None:
        if not self.captured:
            raise NotFaithful(f"graph {self.key!r} replayed before it was captured")
        check_staged_joined()
        if self.body is None:
            raise NotFaithful(f"graph {self.key!r} was captured, but no body this stand-in can run was called "
                              "inside the capture (only a GraphSpace.capturable callable is kept)")
        log = ReadLog()
        changed = []
        for w in self.watched:
            now = w.owner.cell_contents if w.name is None else w.owner.__dict__.get(w.name, GONE)
            if now is w.value and not isinstance(now, torch.Tensor):
                continue  # the same object: what changed inside it is watched as its own fields
            if described(now) != w.described:
                changed.append((w, now))
                self._put(w, w.value)  # the graph reads what capture saw
        for w, _ in changed:
            if w.name is not None:
                log.track(w.owner)
        ACTIVE.append(log)
        try:
            rewrite(self.outputs, self.body())
        finally:
            ACTIVE.pop()
            log.restore()
            for w, now in changed:  # the live program's state again, as the replay found it
                self._put(w, now)
        for w, now in changed:
            if w.name is None:
                read = True  # a free variable is referenced by the body's own code
            elif id(w.owner) in log.untracked:
                read = False
            else:
                read = (id(w.owner), w.name) in log.reads
            settled = self.space.settled.get((id(self), w.path), GONE)
            after = settled is GONE or described(now) != settled
            self.space.stale.append(StaleRead(self.key, w.path, shown(w.value), shown(now), read, after))
        self.space.check(self.key, "replay")

    def reset(self) -> None:
        self.body, self.watched, self.captured = None, [], False

    def pool(self):
        return self._pool

    # -- the stand-in's own ----------------------------------------------------------------
    def keep(self, fn: Callable, watch: Iterable[tuple[str, Any]] = ()) -> None:
        """Keep ``fn`` as the body this graph replays; the host state it reads is snapshotted when the
        capture ends."""
        if not self.capturing:
            raise NotFaithful(f"a body kept for graph {self.key!r} outside its capture")
        if self.body is not None and self.body is not fn:
            raise NotFaithful(f"two different bodies ran inside one capture of graph {self.key!r}")
        self.body, self._watch = fn, tuple(watch)

    def capture(self, fn: Callable, watch: Iterable[tuple[str, Any]] = ()):
        """Capture ``fn``: run it once, eagerly, keep it. Returns what the capture run returned."""
        self.capture_begin()
        try:
            self.keep(fn, watch)
            out = fn()
        finally:
            if self.space.capturing is self:
                self.capture_end()
        return out

    @staticmethod
    def _put(w: Watched, value) -> None:
        if w.name is None:
            w.owner.cell_contents = value
        elif value is GONE:
            w.owner.__dict__.pop(w.name, None)
        else:
            w.owner.__dict__[w.name] = value


def rewrite(kept, fresh) -> None:
    """A replay's results written into the capture's output tensors: a graph's kernels write the same
    memory on every replay, while the re-run body allocates new tensors (torch ops outside the static
    buffers). Tensors in tuples and lists are matched by place; a tensor the body returned at capture
    that is the fresh one already (a static buffer) is left as it is."""
    if isinstance(kept, torch.Tensor) and isinstance(fresh, torch.Tensor):
        if kept.data_ptr() != fresh.data_ptr() or kept.stride() != fresh.stride():
            if kept.shape != fresh.shape:
                raise NotFaithful(f"a replay returned a {tuple(fresh.shape)} output where its capture "
                                  f"returned {tuple(kept.shape)} (a graph's outputs keep their shapes)")
            kept.copy_(fresh)
    elif isinstance(kept, (tuple, list)) and isinstance(fresh, (tuple, list)) and len(kept) == len(fresh):
        for a, b in zip(kept, fresh):
            rewrite(a, b)


class GraphSpace:
    """One emulated device: its static buffers (redzoned on ``heap``), its graphs, what they recorded."""

    def __init__(self, heap: ShadowHeap | None = None):
        self.heap = heap if heap is not None else ShadowHeap()
        self.capturing: Graph | None = None
        self.stale: list[StaleRead] = []
        self.overruns: list[Overrun] = []
        self._reported = 0  # violations already recorded (a heap keeps reporting them)
        self._pools = itertools.count(1)
        self.graphs: list[Graph] = []
        #: (graph, path) -> the watched value's description once every capture was done
        self.settled: dict[tuple[int, str], Any] = {}
        #: every NotFaithful raised inside a capture, kept though the program under test caught it
        self.refusals: list[NotFaithful] = []

    def settle(self) -> None:
        """Every capture is done: what each graph's watched state holds now is the capture phase's
        end, so a later replay can tell a value the live program changed from one another capture left."""
        memo: dict = {}  # nothing changes while the capture phase's end is recorded
        for g in self.graphs:
            for w in g.watched:
                now = w.owner.cell_contents if w.name is None else w.owner.__dict__.get(w.name, GONE)
                self.settled[(id(g), w.path)] = described(now, memo=memo)

    # -- static buffers ----------------------------------------------------------------------
    def static(self, name: str, tensor: torch.Tensor, redzone_cells: int = 64) -> torch.Tensor:
        """A redzoned copy of ``tensor`` (same shape, dtype, contents) to be a graph's static buffer."""
        return self.heap.adopt(name, tensor, redzone_cells)

    def check(self, key, phase: str) -> None:
        found = self.heap.check()
        for v in found[self._reported:]:
            self.overruns.append(Overrun(key, phase, v))
        self._reported = max(self._reported, len(found))

    # -- bodies --------------------------------------------------------------------------------
    def capturable(self, fn: Callable, watch: Iterable[tuple[str, Any]] = (), executes: bool = True) -> Callable:
        """``fn``, kept as the body of whichever graph is capturing when it is called.

        ``executes`` False: the capture run leaves no contents behind, as a device's capture (which
        records and runs nothing): every tensor the body reaches through its closure and ``watch``
        (``graph_state.DEPTH`` deep) holds afterwards what it held before (the run is still needed, for
        the host state a graph keeps). A program that relies on its capture having run shows it; a write
        into a tensor the body reaches otherwise (a module global) would stay, which no body the
        harness keeps this way makes. The runners' own captures run warm-ups of the same body first,
        so they keep the default."""
        watch = tuple(watch)

        def body(*args, **kwargs):
            if args or kwargs:
                raise NotFaithful("a captured body called with arguments (a graph replays with none)")
            graph = self.capturing
            if graph is not None:
                graph.keep(fn, watch)
            saved = reachable_contents(fn, watch) if graph is not None and not executes else []
            try:
                out = fn()
            finally:
                put_back(saved)
            if graph is not None:  # what the capture returned is the graph's output memory
                graph.outputs = out
            return out
        body.__wrapped__ = fn
        return body

    # -- torch.cuda's names --------------------------------------------------------------------
    def CUDAGraph(self, *args, **kwargs) -> Graph:  # noqa: N802 - torch's name
        g = Graph(self)
        self.graphs.append(g)
        return g

    @contextlib.contextmanager
    def graph(self, cuda_graph: Graph, pool=None, stream=None, capture_error_mode: str = "global", **_):
        """``torch.cuda.graph``: capture what runs inside into ``cuda_graph`` (on the default stream, or on a
        side stream this space made: ``graph_device``'s docstring says why that is faithful). A refusal
        raised inside is recorded (``refusals``) before it leaves, so a caller that swallows a failed
        capture (falling back to eager) cannot make it silent."""
        try:
            capture_stream_ok(stream)
            if capture_error_mode not in CAPTURE_ERROR_MODES:
                raise NotFaithful(f"capture_error_mode {capture_error_mode!r} is none torch knows")
            cuda_graph.capture_begin(pool=pool, capture_error_mode=capture_error_mode)
        except NotFaithful as exc:
            self.refusals.append(exc)
            raise
        try:
            yield cuda_graph
        except NotFaithful as exc:
            self.refusals.append(exc)
            raise
        finally:
            if self.capturing is cuda_graph:
                cuda_graph.capture_end()

    def Stream(self, *args, **kwargs) -> SideStream:  # noqa: N802 - torch's name
        """``torch.cuda.Stream()``: a side stream, faithful only as a capture's stream (``graph_device``)."""
        return SideStream(*args, **kwargs)

    def graph_pool_handle(self):
        return ("graph-pool", next(self._pools))

    def device_module(self) -> types.SimpleNamespace:
        """What a runner's ``device_module`` (``torch.cuda``) is, on this emulated device."""
        default = DefaultStream()
        return types.SimpleNamespace(
            CUDAGraph=self.CUDAGraph, graph=self.graph, graph_pool_handle=self.graph_pool_handle,
            synchronize=lambda *a, **k: None,  # one in-order stream: everything has run
            is_current_stream_capturing=lambda: self.capturing is not None,
            current_stream=lambda *a, **k: default, default_stream=lambda *a, **k: default,
            stream=refuse("torch.cuda.stream"), Stream=self.Stream, Event=Event)
