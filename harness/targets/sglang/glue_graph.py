"""SGLang's metadata glue graph on the target verify runner: switched on as a server switches it, watched.

``DecodeCudaGraphRunner.__init__`` makes a ``MetadataGlueGraph`` when
``envs.SGLANG_ENABLE_METADATA_GLUE_GRAPH`` reads true (not for the DFlash
family). A replay whose batch fills its graph (``raw_bs == bs``, no TBO,
pdmux, LoRA) then hands the backend's out-of-graph metadata prep to the
glue's ``run``: two eager warm-ups per key, a capture of the prep into a
graph of its own, and from then on a replay of that graph with each
backend's ``forward_metadata`` re-installed; a padded replay is prepared
eagerly (``note_not_routed``). ``switched_on`` sets the switch through
SGLang's own ``envs`` object for the runner's ``__init__`` (the only place
it is read) and restores it after.

What a device does with the glue graph, and how it is stood in for
(``GlueWatch``): the capture records the prep's device work on the capture
step's replay view and runs none of it (``GraphSpace.capturable`` with
``executes=False``); a replay reruns that work on the same static buffers
while every host value the prep read (the view's fields, its verify input's
fields, the backend's) is the capture's. The glue's ``run`` is handed each
step's own view; on a device that view's host values are never looked at once
the graph is captured. So before each glued replay the live view's fields are
mirrored into the captured view (its verify input field by field), and the
graph stand-in puts the capture's values back for the replay and records
each one the prep read (``StaleRead``): a host value a device would replay
frozen. The capture's view is the harness's copy of SGLang's (the same
fields, in a class whose reads the stand-in tracks), so the live step's
objects are never written.

Not driven here: ``SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW`` (a glued replay with
no view), TBO, pdmux, LoRA (switched off on this server); DSpark's target glue
switch and its early verify metadata are ``dspark_verify``'s; and,
on a server with one ordinary KV pool, the KV-location plan a ForwardBatch
carries (None there: the backend's KV-id gather is the harness's; a
window-pool server's batches carry SGLang's own plan, ``swa_server``).
"""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace

from vmfuzz.harness.model.glue import CAPTURE, FAILED, GLUE, NOT_ROUTED, REPLAY, WARM_UP

GLUE_FILE = "srt/model_executor/runner/metadata_glue_graph.py"
RUNNER_FILE = "srt/model_executor/runner/decode_cuda_graph_runner.py"
#: the switch SGLang reads in the runner's ``__init__``
SWITCH = "SGLANG_ENABLE_METADATA_GLUE_GRAPH"
_PROPS = ("graph-replay-equivalence", "padding-inert", "capture-replay-agreement")
_GLUE = "MetadataGlueGraph."

#: What this module drives: the glue graph of a case whose server switches it on, through the runner's glue
#: route (the runner's own functions on that route are graph_runner's, ``_init_replay_attn_metadata`` and
#: ``_glue_key`` among them).
SURFACE = tuple((GLUE_FILE, _GLUE + fn, _PROPS) for fn in (
    "__init__", "note_not_routed", "_leaves", "is_captured", "run")) + tuple(
    (RUNNER_FILE, "DecodeCudaGraphRunner." + fn, _PROPS) for fn in ("_glue_draft_inputs", "_prep_attention_variant"))

NOT_DRIVEN = (
    (GLUE_FILE, _GLUE + "reset", "nothing in this SGLang calls it (a runner's graphs are captured once)"),
)


def switch(runner_module):
    """SGLang's switch (an ``envs`` field), or None where this release has no metadata glue graph."""
    envs = getattr(runner_module, "envs", None)
    return getattr(envs, SWITCH, None) if envs is not None else None


@contextlib.contextmanager
def switched_on(runner_module):
    """The glue graph switched on for what runs inside (the runner's ``__init__``), as a server's
    environment switches it, and restored after."""
    field = switch(runner_module)
    with field.override(True):
        yield


class GlueView(SimpleNamespace):
    """A replay view's fields, held for the glue graph's body: a class of the harness's own, so the
    graph stand-in can track which fields the prep reads (``SimpleNamespace``'s own instances cannot
    change class)."""


class GlueWatch:
    """One runner's ``MetadataGlueGraph`` (``glue``), watched: what each replay's prep did (``outcome``),
    the capture's views the glue graphs were recorded on (``captured``), each glued replay's live view
    mirrored into them first."""

    def __init__(self, glue, space, views: list):
        self.glue, self.space, self.views = glue, space, views
        self.captured: dict = {}  # glue key -> the GlueView its graph was recorded on
        self.outcome: str | None = None
        self._recorded: GlueView | None = None
        self._routed: dict = {}  # bs -> the key the runner last routed a prep of that bs under

    def key_for(self, runner, bs: int, actual_mode: str, variant):
        """The glue key the runner routes a full ``bs`` batch's prep under: its own ``_glue_key`` where
        this release has one; else (SGLang 0.5.22 builds the key inline) the key its last routed prep of
        that bs was run under, None before any (no state: every warm-up still to come)."""
        own = getattr(runner, "_glue_key", None)
        if own is not None:
            return own(bs, actual_mode, variant)
        return self._routed.get(bs)

    def lookups(self) -> list[tuple]:
        """The patches a replay runs under (``binding.bound``): the glue's ``run`` and
        ``note_not_routed``, watched (a release whose glue is told of no unrouted prep, 0.5.22's: its
        ``run`` alone)."""
        out = [(self.glue, "run", self.run)]
        if hasattr(self.glue, "note_not_routed"):
            out.append((self.glue, "note_not_routed", self.not_routed))
        return out

    def steps_to_replay(self, key) -> int:
        """How many more routed preps of ``key`` the glue takes before one is a replay of its graph
        (its warm-ups left, then the capture); 0 once captured or where it gave up."""
        st = self.glue._states.get(key)
        if self.glue.disabled or (st is not None and st["graph"] is not None):
            return 0
        warmups = st["warmups"] if st is not None else 0
        return max(0, type(self.glue).NUM_WARMUP - warmups) + 1

    def _captured(self, key) -> bool:
        """Whether ``key``'s prep is a graph now: the glue's own answer, or (a release whose glue gives
        none, 0.5.22's) its state for the key read as ``steps_to_replay`` reads it."""
        own = getattr(self.glue, "is_captured", None)
        if own is not None:
            return own(key)
        state = self.glue._states.get(key)
        return not self.glue.disabled and state is not None and state["graph"] is not None

    def not_routed(self):
        self.outcome = NOT_ROUTED
        return type(self.glue).note_not_routed(self.glue)

    def run(self, attn_backend, fb_view, key):
        real = type(self.glue).run
        self._routed[getattr(fb_view, "batch_size", None)] = key
        if self._captured(key):
            self.outcome = REPLAY
            self.views.append(fb_view)  # the view this replay's metadata is prepared from
            captured = self.captured.get(key)
            if captured is not None:  # else no body was kept: the stand-in's replay refuses (NotFaithful)
                self._mirror(captured, fb_view)
            return real(self.glue, attn_backend, fb_view, key)
        self._recorded = None
        out = real(self.glue, attn_backend, fb_view, key)
        if self._captured(key):
            self.outcome = CAPTURE
            graph = self.glue._states[key]["graph"]
            graph.key = (GLUE, key)
            self.captured[key] = self._recorded
        else:
            self.outcome = FAILED if self.glue.disabled else WARM_UP
        return out

    def capture_body(self, backend, fb_view, prep):
        """The prep called inside the glue's capture: kept as the glue graph's body, over the harness's
        copy of the capture's view (its verify input copied too), recorded without leaving contents."""
        view = GlueView(**vars(fb_view))
        if getattr(fb_view, "spec_info", None) is not None:
            view.spec_info = copy.copy(fb_view.spec_info)
        self._recorded = view

        def glue_prep():
            return prep(backend, view)
        return self.space.capturable(glue_prep, executes=False)()

    @staticmethod
    def _mirror(view: GlueView, live) -> None:
        """The live view's host values into the capture's (its verify input field by field, the same
        object kept), so the graph stand-in sees which of them moved since the capture."""
        spec = getattr(view, "spec_info", None)
        for name, value in vars(live).items():
            if name == "spec_info" and spec is not None and value is not None and type(value) is type(spec):
                fields = vars(value)
                for gone in set(vars(spec)) - set(fields):
                    delattr(spec, gone)
                for k, v in fields.items():
                    setattr(spec, k, v)
            else:
                setattr(view, name, value)
