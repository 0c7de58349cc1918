"""The three graph-replay properties judged on one build and capture of each case's runners.

Each graph property builds SGLang's runners for a case and captures a graph per
bucket before it replays anything; under Triton's interpreter that set-up is
about half of a graph check (the draft-decode capture runs a draft forward per
bucket). Searched alone, the three properties also draw three times the cases.
Searched together (``Property.group == "graph"``), a case's runners are built
and captured once (``built``), and each member then replays the case's batches
on them in turn, in ``ORDER``: the plain replays first, the poisoned ones of
padding-inert last, so the members before it see the static buffers as a
server's own earlier steps leave them.

The price, recorded here: a member judged after another sees the stale-read
records and the padded rows the earlier member's replays left. Both are what a
server's own replays of the same batches leave, and a finding is shrunk and
replayed on its member alone (``judge`` with one name), on a fresh build.
"""

from __future__ import annotations

from contextlib import contextmanager

import msgspec

from vmfuzz.harness.model.errors import OutOfStep, SetUpRaised
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties.kit import Observation, PropertyFailure, fail

EQUIVALENCE, PADDING, AGREEMENT = "graph-replay-equivalence", "padding-inert", "capture-replay-agreement"
#: the sub-check that the target verify runner was made by its own ``__init__`` (its set-up SGLang's)
INIT_SUB_CHECK = "target verify set-up"
#: the order the members are judged in on one build (the poisoning member last)
ORDER = (EQUIVALENCE, AGREEMENT, PADDING)

def read_layout(config):
    """The server's numbers with the layout the Triton verify graph reads: a full, read mask."""
    return msgspec.structs.replace(config, mode=TreeMaskMode.FULL_MASK, is_read=True)


#: runner key -> the session built for the case being judged (None: each check builds its own)
_built: dict | None = None


@contextmanager
def one_build_per_case():
    """Within it, ``built`` hands every check the session the first one built for the same key."""
    global _built
    outer, _built = _built, {}
    try:
        yield
    finally:
        _built = outer


def built(key, make):
    """The runner session for ``key`` (a hashable: what kind, and the server's numbers): made by
    ``make()`` once per case inside ``one_build_per_case``, afresh outside it."""
    if _built is None:
        return _set_up(key, make)
    if key not in _built:
        _built[key] = _set_up(key, make)
    return _built[key]


def _set_up(key, make):
    """``make()``; a raise from it is vmfuzz out of step, never a finding: the runner is set up by
    the harness's wiring over stand-ins of the model and the device, so what raises there cannot
    be told apart from SGLang's own failure here (a failure of a property, or the stand-in saying it
    cannot be faithful, stays what it is). ``SetUpRaised`` keeps the raise as its cause, so a gate's
    base can tell them apart: a base that runs the same case makes it the change's raise."""
    try:
        return make()
    except (PropertyFailure, OutOfStep):
        raise
    except Exception as exc:  # noqa: BLE001 - any raise of the set-up is the harness's, said
        where = exc.__traceback__
        while where.tb_next is not None:
            where = where.tb_next
        raise SetUpRaised(f"the {key[0]} runner's set-up", where.tb_frame.f_code.co_filename,
                          f"building and capturing it as vmfuzz drives it raised {type(exc).__name__}: "
                          f"{str(exc)[:200]}") from exc


def judge(target, config, batches, device="cpu", checks=None) -> Observation:
    """Every member in ``checks`` (name -> its own check) on one build of the case's runners, in
    ``ORDER``; raises the first failure."""
    unknown = set(checks or ()) - set(ORDER)
    if unknown or not checks:
        raise ValueError(f"not judged on a shared graph build: {', '.join(sorted(unknown)) or 'nothing'}")
    obs = Observation()
    with one_build_per_case():
        for name in ORDER:
            if name not in checks:
                continue
            part = checks[name](target, config, batches, device)
            obs.classes |= part.classes
            obs.by_property[name] = set(part.classes)
            obs.margin = max(obs.margin, part.margin)
            for path, m in part.path_margins.items():
                obs.path_margins[path] = max(obs.path_margins.get(path, float("-inf")), m)
    return obs


def refused_though_captured(prop: str, runner: str, bs: int, capture_bs) -> None:
    """Admission agrees with capture: a batch no wider than the largest captured graph pads into one, so
    ``can_run_graph`` refusing it leaves a graph captured for it never replayed (its memory held for
    nothing, the batch run eagerly). The other direction, a batch admitted past every graph, is
    graph-buffer-soundness's."""
    if bs <= max(capture_bs):
        fail(prop, f"{runner}: a batch of bs {bs} fits the graph captured at bs "
                   f"{min(c for c in capture_bs if c >= bs)}, yet can_run_graph refuses it (graphs captured at "
                   f"{sorted(capture_bs)})", effect="wrong", writer=f"{runner} can_run_graph", buffer="capture_bs",
             cell="admission", stage="replay")
