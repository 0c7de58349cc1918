"""The CUDA-graph stand-in (harness/guard/graph.py) against programs whose replay semantics are known.

A real graph replays the launches it recorded on the same device tensors: new
contents of a static tensor are seen, a Python number or a tensor object the
body picked on the host is the one it had at capture. Each test states what a
replay must give and checks the stand-in gives it, records what it must, and
refuses what it cannot reproduce.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vmfuzz.harness.guard.graph import GraphSpace, NotFaithful
from vmfuzz.harness.model.errors import OutOfStep


def test_replay_sees_new_static_contents_and_writes_the_same_static_output():
    space = GraphSpace()
    x = space.static("x", torch.arange(4, dtype=torch.float32))
    out = space.static("out", torch.zeros(4))
    g = space.CUDAGraph()
    g.capture(lambda: out.copy_(x * 2))
    assert out.tolist() == [0, 2, 4, 6]
    x.copy_(torch.tensor([10.0, 20.0, 30.0, 40.0]))
    g.replay()
    assert out.tolist() == [20, 40, 60, 80]  # the static input's new contents, into the same output
    assert space.stale == [] and space.overruns == []


def test_a_python_number_read_at_replay_keeps_its_capture_value_and_the_read_is_recorded():
    space = GraphSpace()
    out = space.static("out", torch.zeros(3, dtype=torch.long))
    scale = 3

    def body():
        out.fill_(scale)

    g = space.CUDAGraph()
    g.capture(body)
    scale = 7  # the live program moved on; the graph baked 3
    out.zero_()
    g.replay()
    assert out.tolist() == [3, 3, 3]
    assert scale == 7  # the live value is back after the replay
    [stale] = space.stale
    assert (stale.path, stale.at_capture, stale.at_replay, stale.read) == ("scale", 3, 7, True)


def test_a_field_read_from_a_batch_object_is_stale_and_an_unread_change_is_no_read():
    space = GraphSpace()
    out = space.static("out", torch.zeros(1, dtype=torch.long))

    class Batch:  # a ForwardBatch-like plain object
        def __init__(self):
            self.seq_lens_sum, self.batch_size = 10, 2

    fb = Batch()
    g = space.CUDAGraph()
    g.capture(lambda: out.fill_(fb.seq_lens_sum))
    fb.seq_lens_sum, fb.batch_size = 99, 4
    g.replay()
    assert out.item() == 10 and fb.seq_lens_sum == 99
    by_path = {s.path: s for s in space.stale}
    assert by_path["fb.seq_lens_sum"].read is True
    assert by_path["fb.batch_size"].read is False  # changed, but the body never looked at it
    assert (by_path["fb.seq_lens_sum"].at_capture, by_path["fb.seq_lens_sum"].at_replay) == (10, 99)


def test_a_tensor_object_swapped_after_capture_is_not_what_the_graph_reads():
    space = GraphSpace()
    a = space.static("a", torch.ones(2))
    b = space.static("b", torch.full((2,), 5.0))
    out = space.static("out", torch.zeros(2))
    holder = SimpleNamespace(src=a)
    g = space.CUDAGraph()
    g.capture(lambda: out.copy_(holder.src))
    holder.src = b  # a real graph keeps reading a's address
    g.replay()
    assert out.tolist() == [1.0, 1.0]
    [stale] = [s for s in space.stale if s.path == "holder.src"]
    assert stale.at_capture != stale.at_replay
    assert stale.read is False  # SimpleNamespace reads cannot be tracked: kept as a change, never dropped


def test_a_new_object_holding_the_same_tensors_and_numbers_is_no_change():
    space = GraphSpace()
    buf = space.static("buf", torch.arange(3))
    out = space.static("out", torch.zeros(3, dtype=torch.long))

    class Meta:
        def __init__(self, t, n):
            self.t, self.n = t, n

    owner = SimpleNamespace(meta=Meta(buf, 3))
    g = space.CUDAGraph()
    g.capture(lambda: out.copy_(owner.meta.t[:owner.meta.n]))
    owner.meta = Meta(buf, 3)  # rebuilt each replay, same static buffer, same length
    g.replay()
    assert space.stale == []


def test_an_overrun_of_a_static_buffer_at_replay_is_caught_by_its_redzone():
    space = GraphSpace()
    out = space.static("out", torch.zeros(4, dtype=torch.long), redzone_cells=16)
    idx = space.static("idx", torch.tensor([0, 1, 2, 3]))
    g = space.CUDAGraph()
    g.capture(lambda: space.heap.store(out, idx, 1))  # a pointer write at indices held in a static tensor
    assert space.overruns == []
    idx.copy_(torch.tensor([2, 3, 4, 5]))  # the live batch asks two cells past the buffer
    g.replay()
    [overrun] = space.overruns
    assert overrun.phase == "replay" and overrun.violation.buffer == "out"
    assert (overrun.violation.side, overrun.violation.start, overrun.violation.stop) == ("back", 4, 6)


def test_capture_through_torch_names_keeps_the_capturable_body():
    space = GraphSpace()
    x = space.static("x", torch.zeros(2))
    body = space.capturable(lambda: x.add_(1))
    g = space.CUDAGraph()
    with space.graph(g, pool=space.graph_pool_handle()):
        body()
    assert x.tolist() == [1, 1]
    g.replay()
    g.replay()
    assert x.tolist() == [3, 3]
    assert g.pool() is not None


def test_what_cannot_be_emulated_is_refused_never_passed():
    space = GraphSpace()
    g = space.CUDAGraph()
    with space.graph(g):
        torch.zeros(1)  # work the stand-in never saw as a body
    with pytest.raises(NotFaithful):
        g.replay()
    with pytest.raises(NotFaithful):
        space.CUDAGraph().replay()  # never captured
    dev = space.device_module()
    side = dev.Stream()  # made: only capturing on it is faithful
    for use in (lambda: side.wait_stream(dev.current_stream()), lambda: dev.current_stream().wait_stream(side),
                lambda: dev.Event().record(side), side.synchronize, lambda: dev.stream(side)):
        with pytest.raises(NotFaithful):
            use()
    with pytest.raises(NotFaithful):
        dev.Event(external=True)
    event = dev.Event()
    event.record()  # on the one in-order stream: everything before it has run
    assert event.query()
    with space.graph(space.CUDAGraph()):
        with pytest.raises(NotFaithful):
            dev.Event().record()  # a node inside a graph
    with pytest.raises(NotFaithful):
        with space.graph(space.CUDAGraph(), stream=object()):
            pass
    outer = space.CUDAGraph()
    with space.graph(outer):
        with pytest.raises(NotFaithful):
            space.CUDAGraph().capture_begin()
    assert issubclass(NotFaithful, OutOfStep)  # could not check (exit 3), never a finding or a pass


def test_reset_drops_the_body():
    space = GraphSpace()
    x = space.static("x", torch.zeros(1))
    g = space.CUDAGraph()
    g.capture(lambda: x.add_(1))
    g.reset()
    with pytest.raises(NotFaithful):
        g.replay()


def test_a_capture_on_a_side_stream_is_faithful_and_a_refusal_inside_one_is_kept_though_caught():
    """What SGLang's metadata glue graph does: capture on a side stream of its own, thread-local errors,
    and on any failure of the capture fall back to eager work. The capture's stream orders nothing (it
    runs nothing, and replay is on the current stream); a refusal the program catches is still kept."""
    space = GraphSpace()
    x = space.static("x", torch.zeros(2))
    dev = space.device_module()
    side = dev.Stream()
    g = space.CUDAGraph()
    with space.graph(g, stream=side, capture_error_mode="thread_local"):
        space.capturable(lambda: x.add_(1))()
    g.replay()
    assert x.tolist() == [2, 2] and side.captures == 1 and space.refusals == []
    try:  # the program under test swallows the failed capture, as the glue graph does
        with space.graph(space.CUDAGraph(), stream=side):
            side.wait_stream(dev.current_stream())
    except Exception:  # noqa: BLE001 - the program's own fallback
        pass
    [kept] = space.refusals
    assert isinstance(kept, NotFaithful) and "wait_stream" in kept.why
    with pytest.raises(NotFaithful):
        with space.graph(space.CUDAGraph(), capture_error_mode="lenient"):
            pass


def test_a_body_kept_as_not_executing_leaves_its_contents_as_it_found_them():
    """A device's capture records and runs nothing: a program that relies on replaying right after its
    capture (the glue graph: "capture records without executing") must be seen to need that replay."""
    space = GraphSpace()
    holder = SimpleNamespace(buf=torch.zeros(3))
    out = space.static("out", torch.zeros(3))
    src = space.static("src", torch.tensor([1.0, 2.0, 3.0]))

    def prep():
        holder.buf.copy_(src)
        out.copy_(src * 2)
    g = space.CUDAGraph()
    with space.graph(g):
        space.capturable(prep, executes=False)()
    assert holder.buf.tolist() == [0, 0, 0] and out.tolist() == [0, 0, 0]  # recorded, not run
    g.replay()
    assert holder.buf.tolist() == [1, 2, 3] and out.tolist() == [2, 4, 6]
