"""Known findings (``known/``): replayed before a search, and recognised during it.

Before the search each entry that applies to the imported SGLang is replayed
on the target, plainly: if it still fails the way it says, it is a known
finding of this run (``run`` reports it as a finding; ``gate`` lists it and
passes); if it no longer does, the run says so, so the entry can be retired.
During the search the entries ride on the target (``attach``): a property
that meets exactly that defect records it as a class and goes on checking
everything else, so a new defect of the same kind is still caught.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from vmfuzz.harness.engine.search.results import Finding
from vmfuzz.harness.model.known_file import DIFFERENT, GONE, REPRODUCES, UNCHECKED, Known, load
from vmfuzz.harness.model.known_file import applying as that_apply
from vmfuzz.harness.model.origin import Origin
from vmfuzz.harness.model.repro_file import ReproError, dump, to_case




@dataclass
class KnownOutcome:
    entry: Known
    path: Path
    #: REPRODUCES (its origin again), GONE (the replay ran and held: retire it), DIFFERENT (it
    #: fails with another origin: a finding), UNCHECKED (out of step: nothing can be said)
    status: str
    detail: str = ""
    #: the run's copy of the repro (when it reproduces, or fails differently)
    repro: Path | None = None
    origin: Origin | None = None
    #: DIFFERENT only: the new cause as a finding of this run, so it is grouped (and keyed, for
    #: compare and merge) like any other; never labelled known, whatever entry names its origin
    finding: Finding | None = None
    #: UNCHECKED only, when its replay was stopped rather than ended (its timeout, twice; SIGKILL from
    #: outside, twice; a gate's time cap): whether it fails differently is unknown, so could not check
    #: (exit 3), said in this line
    unfinished: str = ""

    @property
    def reproduces(self) -> bool:
        return self.status == REPRODUCES


def default_known_root() -> Path:
    """The ``known/`` that came with the harness (beside the package in a checkout, inside
    it in an installed wheel), never ``./known``: in CI the working directory is the
    checkout under review, whose own entries must not excuse its defects. More come
    only from ``--known DIR`` on the command line."""
    from vmfuzz.harness.engine.regression.regressions import shipped
    return shipped("known")


def entries(*roots: Path) -> list[tuple[Path, Known]]:
    """Every ``known/*.json`` of each root, root by root, in a stable order; an unreadable
    one is a ReproError naming it."""
    out = []
    for root in roots:
        for path in sorted(root.glob("*.json")) if root.is_dir() else []:
            out.append((path, load(path)))
    return out


def shipped_known_name(target, origin) -> str | None:
    """The shipped entry (``known/``) that applies to ``target``'s SGLang and names ``origin``, if any:
    what ``replay`` and ``minimize`` label a failure with."""
    return next((k.name for _, k in applicable(entries(default_known_root()), dict(target.versions()))
                 if k.matches(origin)), None)


def applicable(found: list[tuple[Path, Known]], versions: dict) -> list[tuple[Path, Known]]:
    """The entries whose range holds the SGLang under test (none for a target that is not SGLang)."""
    return that_apply(found, versions)


def attach(target, found: list[tuple[Path, Known]]) -> None:
    """The search's properties see these on the target (``vmfuzz.harness.properties.kit.known_as``)."""
    target.known_findings = tuple(k for _, k in found)


def replay_known(found: list[tuple[Path, Known]], target, *, findings_dir: Path | None, device: str,
                 isolate: bool, timeout: float) -> list[KnownOutcome]:
    """Each entry replayed on ``target``: does its defect still show?

    The other entries are attached while one replays, so a known defect met
    earlier in the same case does not stand in for this one.
    """
    from vmfuzz.harness.engine.regression.regressions import CUT
    from vmfuzz.harness.engine.regression.replay import NotDriven
    saved = getattr(target, "known_findings", None)
    out = []
    try:
        for path, k in found:
            attach(target, [(p, other) for p, other in found if other is not k])
            try:
                got = _replayed(k, target, device, isolate, timeout)
            except NotDriven as exc:
                # An entry the base reproduces applies to a head whatever its version (known_on_base), and
                # that head may lack the entry's seam (an older release): nothing can be said of it there,
                # and the run goes on to write its reports (the property's own result says not driven).
                out.append(KnownOutcome(k, path, UNCHECKED, str(exc)))
                continue
            if got.status == CUT or (got.stopped and not k.matches(got.origin)):
                out.append(_unfinished(k, path, got, timeout))
                continue  # the cap's: said once for all of them, below
            status = {"held": GONE, "out of step": UNCHECKED}.get(got.status) or (
                REPRODUCES if k.matches(got.origin) else DIFFERENT)
            o = KnownOutcome(k, path, status, got.detail, origin=got.origin)
            if status in (REPRODUCES, DIFFERENT) and findings_dir is not None:
                o.repro = dump(msgspec.structs.replace(k.repro, target=target.name, detail=got.detail,
                                                       origin=got.origin),
                               findings_dir / f"known-{k.name}.json")
            if status == DIFFERENT and got.origin is not None:
                config, steps = to_case(k.repro)
                o.finding = Finding(k.repro.property, f"known entry {k.name}'s repro fails differently: {got.detail}",
                                    o.repro or path, config, steps, got.origin.kind(), origin=got.origin)
            out.append(o)
    finally:
        target.known_findings = saved if saved is not None else ()
        _cut_by_cap(out)
    return out


def _cut_by_cap(out: list[KnownOutcome]) -> None:
    """One could-not-check line for the entries a gate's time cap left unreplayed."""
    from vmfuzz.harness.engine.core import clock
    from vmfuzz.harness.engine.regression.regressions import cap_cut_detail
    cut = [o for o in out if o.detail == cap_cut_detail()] if clock.running() else []
    if cut:
        clock.cut(f"the gate's time cap of {clock.cap():g} s was reached before {len(cut)} known entr"
                  f"{'y was' if len(cut) == 1 else 'ies were'} replayed ({', '.join(o.entry.name for o in cut)}): "
                  "whether their repros still fail the way the entries say is unknown")


def _replayed(k: Known, target, device: str, isolate: bool, timeout: float):
    """The entry's repro replayed; once more with twice the timeout when the first was stopped (its
    timeout ran out, or SIGKILL came from outside): on a loaded machine a slow replay is no new cause."""
    from vmfuzz.harness.engine.core import clock
    from vmfuzz.harness.engine.regression.regressions import outcome_of
    got = outcome_of(k.repro, target, device, isolate, timeout)
    if got.stopped and not k.matches(got.origin) and clock.bounded(2 * timeout) > 0:
        got = outcome_of(k.repro, target, device, isolate, clock.bounded(2 * timeout))
    return got


def _unfinished(k: Known, path: Path, got, timeout: float) -> KnownOutcome:
    """An entry whose replay never ended: could not check (exit 3), never a finding."""
    from vmfuzz.harness.engine.regression.regressions import CUT
    if got.status == CUT:
        return KnownOutcome(k, path, UNCHECKED, got.detail)
    why = (f"its replay was stopped before it ended (its timeout, or SIGKILL from outside), and again when "
           f"tried once more with {2 * timeout:g} s ({got.detail})")
    return KnownOutcome(k, path, UNCHECKED, why, unfinished=f"known entry {k.name}: {why}, so whether its repro "
                        "still fails the way the entry says, or another way, is unknown")


__all__ = ["KnownOutcome", "ReproError", "applicable", "attach", "default_known_root", "entries", "replay_known",
           "shipped_known_name"]
