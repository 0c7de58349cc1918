"""SGLang's metadata glue graph on the target verify runner, as the three graph properties drive and judge it.

``DecodeCudaGraphRunner`` can prepare a padding-free replay's out-of-graph
attention metadata through a glue graph of its own
(``SGLANG_ENABLE_METADATA_GLUE_GRAPH``; ``metadata_glue_graph.py``): two eager
warm-ups per replay key, a capture of the prep, then replays of that graph. Its
own docstring names the failure: a prep that computes on the host each replay
replays its capture-time values, silently. One case in ``GLUE_SHARE`` (chosen
by the config, so a repro replays as it was judged) builds its server's runner
with the glue graph switched on (``target.graph_session(..., glue=True)``).
Each batch whose bs is a captured one is then preceded by lead-in replays of
its bs (``session.glue_lead_ins``: its warm-ups and its capture, each request
one token longer a step), so its own replay's prep is a replay of the glue
graph, with lengths and contents other than the capture's. Every step is
judged as any replay is:

- ``graph-replay-equivalence`` and ``padding-inert``: a glued replay's real
  rows equal the eager run's;
- ``capture-replay-agreement``: the view its prep was handed agrees with the
  capture of its bs, no host value the glue graph's prep read moved since the
  glue graph's capture (the graph stand-in's stale reads of a glue graph), and
  no padded replay is routed to the glue graph (``judge_route``: the glue's
  contract keeps every Python branch of the prep constant per key only for
  padding-free replays; judged whether or not this backend's prep branches on
  the padding, as the view's other fields are).

Every other glued case (``window_pool``: the next bit of the draw that glued it) is a
window-pool server (``targets/sglang/swa_server``): its KV pool keeps the window
layers apart, so each step's window layers write through the backend's own
buffer of window slots, which its prep refills from the step's KV-location plan.
``graph-replay-equivalence`` and ``padding-inert`` then also judge where the
window layers wrote (``swa_out_cache_loc``) and what they read.

Among the glued cases on the EAGLE and chain call sites that are no window-pool server, one in two
(``dspark``) is a DSpark server's target (a draw of its own; ``targets/sglang/dspark_verify``): its
runner glues its prep behind DSpark's own switch, loads every verify batch planned ahead, and each
step is staged early first (``stage_verify_metadata_early``: from the step's own tensors, or, after a step
that took its stage, from that step's). Half of those servers also replay a captured glue graph with no
view (``SKIP_VIEW``); one in four of the others serves DeepSeek V4, not V4.1 (``NO_CANDIDATES``): its model
makes no candidate variants, so no stage has an early variant, each is thrown away, and its load finds
none staged; one in four keeps a request window in its KV pool (``REQUEST_WINDOW``), whose layout its
backend's prep reads from the host: the backend declines the glue, and the runner must then glue
nothing and stage nothing early. ``capture-replay-agreement`` also judges a replay that took an early
stage (``judge_early``): the stage it took must be this step's own (a stale one, taken, prepared
another step's metadata), and a step staged from its own batch whose glue key the harness reads as
early and captured must take it (a stage keyed, sized or variant-picked wrong is thrown away).

A DSpark server's runner asks its attention backend whether the prep may be glued
(``glue_target_verify_metadata``): DeepSeek V4's own answer, of a DeepSeek V4
backend made for the server, which here is a static-verify target on one GPU with
no request window, trtllm-gen attention or online c128 MTP, the server that
answer declares host-free. ``capture-replay-agreement`` judges that answer
(``judge_declined``): declined, every step would prepare its metadata eagerly,
the glue switched on for nothing; and, on a replay that took an early stage,
that the runner told the backend it stages early
(``enable_early_verify_metadata``) and the backend holds it (``judge_early``):
else capture and replay disagree on which metadata object the graph reads.

A failure on a step whose prep the glue graph ran names it as its writer
(``writer``), with how the step's verify mask was handed where that decides the
outcome (``PER_STEP_MASK``) and the server's pool where it keeps window layers
apart (``WINDOW_POOL``), so a known defect of one wiring excuses no other.
Each case says what the glue graph did (``note_case``, ``note_step``): off,
not driven (and why), warmed up, captured, captured and replayed, not routed (a
padded replay: SGLang prepares it eagerly by design), or its capture failed
(SGLang then prepares eagerly for good).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import zlib

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.glue import CAPTURE, EARLY, FAILED, GLUED, NOT_ROUTED, REPLAY, WARM_UP, is_glue_graph
from vmfuzz.harness.properties.kit import Observation, fail
from vmfuzz.harness.properties.kit import known_goes_on as _known_goes_on

#: one case in this many switches the glue graph on (``VMFUZZ_GLUE_SHARE=1``: every case, for a test of a
#: glue-side alteration); its lead-ins are three more replays per captured bs the case replays exactly
GLUE_SHARE = 4
#: the DSpark wirings a glued case's server may be asked for besides the plain one (``session_options``;
#: ``targets/sglang/dspark_verify`` says what each switches on)
SKIP_VIEW, NO_CANDIDATES, REQUEST_WINDOW = "skip view", "DeepSeek V4", "request window"
#: the writer of a failure on a step whose metadata the glue graph prepared
GLUE_REPLAY = "metadata glue graph replay"
#: the writer of a replay that took an early stage not made from its own batch (``judge_early``)
EARLY_STAGE = "early verify metadata stage"
#: the writer of a DSpark target's glue declined by its backend's hook (``judge_declined``)
GLUE_POLICY = "target verify glue policy"
#: the writer of a replay routed to the glue graph against its contract (``judge_route``)
GLUE_ROUTE = "metadata glue graph route"
#: said of such a step whose verify input carries a mask tensor of its own each step (frozen-KV MTP's)
PER_STEP_MASK = ", a per-step verify mask"
#: said of such a step on a server whose KV pool keeps its window layers apart (``swa_server``)
WINDOW_POOL = ", a sliding-window KV pool"
CLASS = "metadata glue graph: "
_STEP_CLASSES = {
    WARM_UP: "warm-up (eager)",
    CAPTURE: "captured, replayed at once",
    REPLAY: "captured and replayed",
    NOT_ROUTED: "not routed (a padded replay: SGLang prepares it eagerly by design)",
    FAILED: "capture failed (SGLang prepares eagerly from then on)",
    EARLY: "staged early (its glue graph replayed before the load, which took it)",
}


def glue_share() -> int:
    try:
        return max(1, int(os.environ.get("VMFUZZ_GLUE_SHARE") or GLUE_SHARE))
    except ValueError:
        return GLUE_SHARE


def _drawn(config: Config) -> int:
    return zlib.crc32(b"metadata glue graph " + repr(config).encode())


def glued(config: Config) -> bool:
    """Whether this case's server switches the metadata glue graph on (one in ``glue_share()``)."""
    return _drawn(config) % glue_share() == 0


def window_pool(config: Config) -> bool:
    """Whether this glued case's server is a window-pool server (every other glued case: the next bit of the
    draw that glued it; a second CRC of the same config would follow the first one's low bits)."""
    return glued(config) and (_drawn(config) // glue_share()) % 2 == 1


def dspark(config: Config) -> bool:
    """Whether this glued case's server is a DSpark server's target (see the module's docstring)."""
    return (glued(config) and not window_pool(config) and config.call_site in ("eagle", "chain")
            and hashlib.sha256(repr(config).encode()).digest()[0] % 2 == 0)  # a CRC's bits follow the glue draw's


def session_options(config: Config) -> dict:
    """What ``target.graph_session`` is asked besides the case (nothing for a case without the glue, so a
    target whose seam predates it still builds the others)."""
    if not glued(config):
        return {}
    if dspark(config):  # one DSpark server in two also replays its captured glue graphs with no view
        drawn = hashlib.sha256(repr(config).encode()).digest()
        if drawn[1] % 2 == 0:
            return {"glue": True, "dspark": SKIP_VIEW}
        # one in four of the others serves DeepSeek V4, whose config makes no early variant: its stages are
        # all thrown away, and each load finds none staged; one in four keeps a request window in its KV
        # pool, for which its backend declines the glue
        return {"glue": True, "dspark": {2: NO_CANDIDATES, 3: REQUEST_WINDOW}.get(drawn[2] % 4, True)}
    return {"glue": True, "window_pool": True} if window_pool(config) else {"glue": True}


def lead_ins(session, batch: Batch) -> list[Batch]:
    """The batches to replay before ``batch`` for its replay to be the glue graph's (none: no glue, a
    padded batch, its graph captured already)."""
    make = getattr(session, "glue_lead_ins", None)
    return make(batch) if make is not None else []


def _mask_wiring(session) -> str:
    mask = PER_STEP_MASK if getattr(session, "per_step_mask", False) else ""
    return mask + (WINDOW_POOL if getattr(session, "window_pool", None) is not None else "")


def writer(session, got, default: str) -> str:
    """Who prepared this replay's metadata: the glue graph (its capture or a replay), or ``default``."""
    if getattr(got, "glue", None) in GLUED:
        return GLUE_REPLAY + _mask_wiring(session)
    return default


def stale_writer(session, stale, default: str) -> str:
    """The writer of a stale read: the glue graph's replay for a read of its own graph."""
    return GLUE_REPLAY + _mask_wiring(session) if is_glue_graph(stale.graph) else default


def where(got, batch: Batch) -> str:
    """What a replay's place says of the glue graph: the lengths it replayed (a lead-in's are not the
    case's) and whether the glue graph prepared its metadata."""
    outcome = getattr(got, "glue", None)
    if outcome is None:
        return ""
    how = f"its metadata prepared by the glue graph's {outcome}" if outcome in GLUED else f"glue graph {outcome}"
    return f" (lengths {list(batch.seq_lens)}, {how})"


def note_case(obs: Observation, session, config: Config) -> None:
    if not glued(config):
        obs.classes.add(f"{CLASS}off (not among the one case in {glue_share()} whose server switches it on)")
        return
    why = getattr(session, "glue_not_driven", None)
    declined = getattr(getattr(session, "dspark_hooks", None), "expect_declined", False)  # no glue, by design
    if not declined and (why or getattr(session, "glue_watch", None) is None):
        obs.classes.add(f"{CLASS}not driven ({why or 'the target does not switch it on'})")
    if dspark(config):
        obs.classes.add(f"{CLASS}a DSpark target's (its own glue switch, early verify metadata)")
        hooks = getattr(session, "dspark_hooks", None)
        if getattr(hooks, "expect_declined", False):
            obs.classes.add(f"{CLASS}a DSpark target whose KV pool keeps a request window (its backend declines)")
        if hooks is not None and hooks.dsv4_not_driven:
            obs.classes.add(f"{CLASS}DeepSeek V4's glue hooks not driven ({hooks.dsv4_not_driven})")
    if window_pool(config):
        pool_why = getattr(session, "window_pool_not_driven", None)
        driven = getattr(session, "window_pool", None) is not None
        obs.classes.add(f"{CLASS}on a sliding-window KV pool server" if driven else
                        f"{CLASS}sliding-window KV pool not driven ({pool_why or 'the target does not build one'})")


def note_step(obs: Observation, got) -> None:
    outcome = getattr(got, "glue", None)
    if outcome in _STEP_CLASSES:
        obs.classes.add(CLASS + _STEP_CLASSES[outcome])


def known_goes_on(target, obs: Observation | None, part):
    """Judging a glued replay (``part``: what the replay returned) or a stale read of a glue graph (a
    ``StaleRead``) so that a failure a known entry names is recorded as a class and the case goes on
    (``kit.known_goes_on``): its next steps, its draft runners, a new defect on another step. Anything
    else is judged as it stands."""
    glue_part = getattr(part, "glue", None) in GLUED or is_glue_graph(getattr(part, "graph", None))
    if target is None or obs is None or not glue_part:
        return contextlib.nullcontext()
    return _known_goes_on(target, obs, CLASS.rstrip(": "))


def judge_declined(prop: str, session, where: str) -> None:
    """A DSpark target's DeepSeek V4 backend, asked by the runner whether its static verify prep may be glued,
    accepted on the server it declares that prep host-free for (see the module's docstring), and declined on
    one whose pool keeps a request window; a runner whose backend declined glued nothing and staged nothing."""
    hooks = getattr(session, "dspark_hooks", None)
    answer = getattr(hooks, "glue_answer", None)
    if getattr(hooks, "expect_declined", False):
        _judge_window(prop, session, hooks, where)
        return
    if answer:
        fail(prop, f"{where}: DeepSeek V4's backend declined the DSpark target's metadata glue graph ({answer!r}) on "
                   "a static-verify target on one GPU with no request window, trtllm-gen attention or online c128 "
                   "MTP: every step prepares its metadata eagerly", effect="unsound", writer=GLUE_POLICY,
             buffer="metadata glue graph", cell="declined", stage="replay")


def _judge_window(prop: str, session, hooks, where: str) -> None:
    said = dict(effect="unsound", buffer="metadata glue graph", stage="replay")
    if hooks.dsv4 is not None and not hooks.glue_answer:
        fail(prop, f"{where}: DeepSeek V4's backend accepted the DSpark target's metadata glue graph on a server "
                   "whose KV pool keeps a request window, whose layout its verify prep reads from the host: each "
                   "glued replay would replay the capture's window", writer=GLUE_POLICY, cell="accepted", **said)
    if getattr(session, "glue_watch", None) is not None:
        fail(prop, f"{where}: the runner glued the verify metadata prep its backend declined "
                   f"({hooks.glue_answer!r})", writer=GLUE_POLICY, cell="glued when declined", **said)
    if getattr(session, "staged_declined", None):
        fail(prop, f"{where}: the runner, with no glue graph (its backend declined it), staged a step's verify "
                   "metadata early, which only a glue graph's replay prepares", writer=EARLY_STAGE,
             cell="staged when declined", **said)


def judge_route(prop: str, got, batch: Batch, where: str) -> None:
    """A replay whose prep the glue graph ran fills its graph: the glue's contract (its module's
    docstring) routes only padding-free replays there, the padding being a host value of the view a
    captured prep may have branched on."""
    if getattr(got, "glue", None) in GLUED and got.graph_bs != batch.bs:
        fail(prop, f"{where}: a padded replay (bs {batch.bs} in the graph of bs {got.graph_bs}) was prepared by "
                   f"the glue graph, whose capture holds its host values only for padding-free replays",
             effect="unsound", writer=GLUE_ROUTE, buffer="num_padding", cell="capture-replay", stage="replay")


def judge_early(prop: str, session, got, where: str) -> None:
    """A replay that took an early stage (``EARLY``) took the one made from its own batch: a stage made from
    another step's tensors holds that step's inputs in the staged slots and its metadata, which the load
    then neither refills nor re-prepares."""
    if getattr(session, "early_expected", False) and getattr(got, "glue", None) != EARLY:
        fail(prop, f"{where}: staged early from its own batch, of a captured bs and the early variant, its glue "
                   f"graph captured, yet its load prepared the metadata again (glue graph {got.glue}): the "
                   f"stage was discarded or rejected", effect="wrong", writer=EARLY_STAGE,
             buffer="early verify metadata", cell="not taken", stage="replay")
    if getattr(got, "glue", None) != EARLY:
        return
    hooks = getattr(session, "dspark_hooks", None)
    told = hooks is None or (hooks.early_enabled and (hooks.dsv4 is None or hooks.dsv4.builds_verify_metadata_early))
    if not told:
        fail(prop, f"{where}: the load took an early stage, yet the runner's attention backend does not build its "
                   "verify metadata early (never told, or its flag left unset): its capture recorded the in-graph "
                   "metadata while its replays read the staged one", effect="wrong", writer=EARLY_STAGE,
             buffer="early verify metadata", cell="backend not told", stage="replay")
    taken = getattr(getattr(session, "dspark", None), "taken", None)
    live = getattr(session, "replayed_batch", None)
    if taken is None or taken[1] is not live:
        staged = "no stage the harness made" if taken is None else (
            f"the stage of a batch of lengths {taken[1].seq_lens.tolist()}")
        fail(prop, f"{where}: the load took {staged} as this step's early verify metadata; its staged inputs "
                   f"and metadata are another step's", effect="wrong", writer=EARLY_STAGE,
             buffer="early verify metadata", cell="capture-replay", stage="replay")
