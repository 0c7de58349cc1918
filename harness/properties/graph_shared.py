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

from vmfuzz.harness.properties.kit import Observation

EQUIVALENCE, PADDING, AGREEMENT = "graph-replay-equivalence", "padding-inert", "capture-replay-agreement"
#: the order the members are judged in on one build (the poisoning member last)
ORDER = (EQUIVALENCE, AGREEMENT, PADDING)

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
        return make()
    if key not in _built:
        _built[key] = make()
    return _built[key]


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
