"""The device around the CUDA-graph stand-in (``graph``): its streams, its events, and its refusals.

A CPU has one stream and runs everything on it in order. What a program does
with a stream or an event is faithful here only where that one stream gives the
same order a device would; elsewhere the stand-in refuses (``NotFaithful``, an
``OutOfStep``: vmfuzz could not check, never a pass):

- the default stream: waiting on it, synchronizing it, recording an event on
  it: faithful (everything before has run);
- a side stream (``torch.cuda.Stream()``, ``SideStream``): made, and handed to
  ``torch.cuda.graph`` as the stream a capture is recorded on, faithful (the
  capture executes nothing, ``torch.cuda.graph`` synchronizes the device
  before it begins, and the graph replays on the current stream, so the
  capture's stream orders nothing); any other use of it (waiting on it, it
  waiting, an event recorded on it, work run on it) depends on a second
  stream's timing: refused;
- an event recorded inside a capture (a graph node), an interprocess or
  external event: refused;
- a staging stream (``StagingStream``, made only where a driver asks for one):
  its work runs when it is issued, after everything issued before it, which is
  what a device gives only while the default stream issues nothing until it
  waits for that work. So a graph replayed on the default stream while a
  staging stream's work is not yet waited for refuses (``check_staged_joined``);
  what ran beside it on a device (a draft graph) is not emulated.
"""

from __future__ import annotations

from vmfuzz.harness.model.errors import OutOfStep

#: what every NotFaithful names as its seam
SEAM, FILE = "cuda-graph stand-in", "torch/cuda/graphs.py"


class NotFaithful(OutOfStep):
    """The emulation cannot reproduce what a real device would do here: vmfuzz could not check."""

    def __init__(self, why: str):
        super().__init__(SEAM, FILE, why)

    def __reduce__(self):
        return (NotFaithful, (self.why,))


#: spaces with a capture in progress (an event recorded then would be a node of the graph)
CAPTURING_SPACES: set[int] = set()


class DefaultStream:
    """The one in-order stream a CPU has: waiting on it, or on itself, is trivially faithful."""

    def synchronize(self):
        return None

    def wait_stream(self, other):
        if not isinstance(other, DefaultStream):
            raise NotFaithful("waiting on a side stream")

    def wait_event(self, event):
        joined(event)


class SideStream:
    """``torch.cuda.Stream()``: a second stream. Only handing it to ``torch.cuda.graph`` as the capture's
    stream is faithful on one in-order stream (see the module's docstring); every other use refuses."""

    def __init__(self, *args, **kwargs):
        self.captures = 0  # the captures recorded on it

    def _refuse(self, what: str):
        raise NotFaithful(f"a side stream's {what}: ordering against a second stream needs a device")

    def wait_stream(self, other):
        self._refuse("wait_stream")

    def wait_event(self, event):
        self._refuse("wait_event")

    def record_event(self, event=None):
        self._refuse("record_event")

    def synchronize(self):
        self._refuse("synchronize")

    def query(self):
        self._refuse("query")

    def __enter__(self):
        self._refuse("work (a stream context)")

    def __exit__(self, *exc):
        return False


#: staging streams whose work the default stream has not yet waited for
UNJOINED: set[int] = set()
#: the staging streams whose context the running code is inside (work issued now is theirs)
STAGING: list = []


class StagingStream(SideStream):
    """A side stream whose work runs as it is issued (see the module's docstring for when that is faithful):
    it may wait on an event, run work as a stream context, and record an event the default stream then
    waits on (which joins it)."""

    def wait_event(self, event):
        if not getattr(event, "recorded", False):
            raise NotFaithful("a staging stream waiting on an event never recorded")

    def __enter__(self):
        STAGING.append(self)
        UNJOINED.add(id(self))
        return self

    def __exit__(self, *exc):
        STAGING.remove(self)
        return False


def staging_context(stream):
    """``torch.cuda.stream(stream)``: a staging stream's context; any other stream's refuses."""
    if not isinstance(stream, StagingStream):
        raise NotFaithful("work on a side stream: ordering against a second stream needs a device")
    return stream


def record_stream(tensor, stream) -> None:
    """``Tensor.record_stream``: on one in-order stream no allocation is reused under pending work."""
    if not isinstance(stream, (StagingStream, DefaultStream)):
        raise NotFaithful(f"a tensor's use recorded on a stream the stand-in did not make ({type(stream).__name__})")


def check_staged_joined() -> None:
    """A graph replayed on the default stream: refused while a staging stream's work is not waited for."""
    if UNJOINED and not STAGING:
        raise NotFaithful("the default stream replays a graph before waiting for a staging stream's work: "
                          "their order needs a device")


class Event:
    """An event on the one in-order stream: by the time it is recorded everything before it has run,
    so recording, querying and waiting on it are faithful. An external or interprocess event (another
    process or a graph node waits on it) is not."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False):
        if interprocess or external:
            raise NotFaithful("an interprocess or external event needs a device")
        self.recorded = False
        self.on = None

    def record(self, stream=None):
        if stream is not None and not isinstance(stream, DefaultStream):
            raise NotFaithful("an event recorded on a side stream")
        if CAPTURING_SPACES:
            raise NotFaithful("an event recorded inside a graph capture (a graph node) needs a device")
        self.recorded = True
        self.on = STAGING[-1] if STAGING else None  # a staging stream's event: waiting on it joins that stream

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def wait(self, stream=None):
        if stream is not None and not isinstance(stream, DefaultStream):
            raise NotFaithful("a side stream waiting on an event")
        joined(self)


def joined(event) -> None:
    """The default stream waits on ``event``: a staging stream it was recorded on is joined."""
    on = getattr(event, "on", None)
    if on is not None:
        UNJOINED.discard(id(on))


#: ``torch.cuda.graph``'s capture error modes: how other threads' CUDA calls are treated while one thread
#: captures. The stand-in's process captures on one thread, so each mode is the same here.
CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")


def capture_stream_ok(stream) -> None:
    """The stream ``torch.cuda.graph`` is asked to capture on: the default stream, or a side stream this
    stand-in made (faithful, see the module's docstring); anything else refuses."""
    if stream is None or isinstance(stream, DefaultStream):
        return
    if isinstance(stream, SideStream):
        stream.captures += 1
        return
    raise NotFaithful(f"capture on a stream the stand-in did not make ({type(stream).__name__})")


def refuse(what: str):
    def refusing(*args, **kwargs):
        raise NotFaithful(f"{what}: streams and events need a device")
    return refusing
