"""Saved repros replayed before a search: the repo's canonical ones and last run's.

Semantics (README, "Profiles": saved repros under repro/): a repro under ``repro/`` records the
known-bad target it fails on (e.g. ``reference+pr33127``). Against the target
under test -- the fixed code -- it must *hold*; if it fails, the regression is
back, and that is a finding. It should also still fail on its recorded target
(it still has teeth); when that target loads here and the repro no longer fails
on it, the replay says so as a warning, not a failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vmfuzz.harness.engine.search.results import Finding
from vmfuzz.harness.model.config import Config
from vmfuzz.harness.model.origin import Origin
from vmfuzz.harness.engine.core.isolation import TargetFault
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.properties import PropertyFailure
from vmfuzz.harness.model.repro_file import Repro, ReproError, dump, load, to_case


@dataclass
class ReplayOutcome:
    path: Path
    source: str  # "saved" (a repro/ folder) or "last run"
    property: str = ""
    recorded_target: str = ""
    status: str = "held"  # held / failed / error
    detail: str = ""
    teeth: bool | None = None  # still fails on its recorded target (None: not checked)
    finding: Finding | None = None
    #: the case could not be replayed: "target-raised", "target-hang" or "target-crash"
    fault: str | None = None
    set_aside: Path | None = None  # where vmfuzz.harness.engine.campaign.nightly moved it
    #: the file is no repro (it does not read, names an unknown fault or property, or one that does not
    #: apply to its case); False for a sound one this target cannot drive, which stays for one that can
    unreadable: bool = False
    origin: Origin | None = None


def default_repro_root() -> Path:
    """The repros that came with the harness, never ``./repro``: in CI the working
    directory is the checkout under review, and its own ``repro/`` must not stand in
    for the canonical ones. The ``repro/`` beside the ``harness`` package in a
    checkout, its ``harness/shipped/repro`` in an installed wheel (pyproject.toml
    maps them there); more come only from ``--repros DIR`` on the command line."""
    return shipped("repro")


def shipped(folder: str) -> Path:
    """A top-level data folder of vmfuzz (``repro``, ``known``) wherever the harness runs from."""
    package = Path(__file__).resolve().parents[2]  # harness/engine/regression/ -> harness/
    installed = package / "shipped" / folder
    return installed if installed.is_dir() else package.parent / folder


def no_saved_repros(roots: list[Path]) -> str | None:
    """The warning for a run meant to replay saved repros that finds none: a guard
    that silently disappears (a wheel without its data, a wrong --repro-root) must show."""
    if saved_repros(roots):
        return None
    return f"no saved repro found under {', '.join(map(str, roots))}: the canonical regressions were not replayed"


def saved_repros(roots: list[Path]) -> list[Path]:
    """Every ``<root>/<name>/*.json``, root by root, each in a stable order."""
    return [p for root in roots for p in (sorted(root.glob("*/*.json")) if root.is_dir() else [])]


@dataclass
class Outcome:
    """One replay of a repro: held, failed (with the failure's origin), or out of step."""

    status: str  # held / failed / out of step / cut (a gate's time cap stopped it)
    detail: str = ""
    #: the case could not be checked to the end: "target-raised", "target-hang" or "target-crash"
    fault: str | None = None
    origin: Origin | None = None
    #: failed only because it was stopped: its timeout ran out, or it was SIGKILLed from outside twice
    stopped: bool = False


#: ``Outcome.status`` of a replay a gate's time cap stopped (or never began)
CUT = "cut"


def cap_cut_detail() -> str:
    from vmfuzz.harness.engine.core import clock
    return f"not replayed: the gate's time cap of {clock.cap():g} s was reached first"


def outcome_of(repro, target, device: str, isolate: bool, timeout: float) -> Outcome:
    """A target that raises, exits or hangs is a failure, never fatal."""
    from vmfuzz.harness.engine.core import clock
    from vmfuzz.harness.engine.core.failures import failure_of
    from vmfuzz.harness.engine.regression.replay import replay
    prop = repro.property or "replay"
    if clock.reached():
        return Outcome(CUT, cap_cut_detail())
    try:
        replay(repro, target, device, isolate=isolate, timeout=timeout)
    except ReproError:
        raise
    except clock.CapReached:
        return Outcome(CUT, cap_cut_detail())
    except OutOfStep as exc:  # the harness's seam, not the target: could not check, never a finding
        return Outcome("out of step", str(exc))
    except KeyboardInterrupt as exc:
        from vmfuzz.harness.engine.core.signals import from_user
        if from_user(exc):
            raise
        origin, detail = failure_of(prop, exc)
        return Outcome("failed", detail, "target-raised", origin)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the target's own error, or a property's failure
        origin, detail = failure_of(prop, exc)
        fault = None if isinstance(exc, PropertyFailure) else (
            exc.kind if isinstance(exc, TargetFault) else "target-raised")
        return Outcome("failed", detail, fault, origin, stopped=getattr(exc, "stopped", False))
    return Outcome("held")


@dataclass(frozen=True)
class Saved:
    """A saved repro as read before its replay: the repro and its case's config, or why it could not
    be read (a file whose case does not build is unreadable as a repro, whatever its JSON)."""
    path: Path
    repro: Repro | None = None
    error: str = ""
    config: Config | None = None


def read_saved(paths: list[Path]) -> list[Saved]:
    """Each file read once, up front: the plan carries them down to the replay, which reads nothing."""
    out = []
    for path in paths:
        try:
            repro = load(path)
            out.append(Saved(path, repro, config=to_case(repro)[0]))
        except ReproError as exc:
            out.append(Saved(path, error=str(exc)))
    return out


def replayable_saved(roots: tuple[Path, ...]) -> tuple[tuple[Saved, ...], tuple[str, ...]]:
    """(every saved repro under ``roots``, read; the warning when there is none), for a run's plan.

    A gate must never pass over a saved repro it cannot replay: one that does
    not read, or names no property that applies to its config, is a ReproError
    naming it (exit 2) before any work.
    """
    from vmfuzz.harness.engine.regression.replay import replayable
    warning = no_saved_repros(list(roots))
    saved = []
    for root in roots:
        if root.exists() and not root.is_dir():
            raise ReproError(f"repro root {root} is not a directory")
        for s in read_saved(saved_repros([root])):
            try:
                if s.repro is None:
                    raise ReproError(s.error)
                replayable(s.repro, s.config)
            except ReproError as exc:
                msg = str(exc)
                raise ReproError(f"saved repro {s.path} cannot be replayed: "
                                 + (msg if str(s.path) not in msg else msg.split(": ", 1)[-1])) from None
            saved.append(s)
    return tuple(saved), (warning,) if warning else ()


def replay_saved(saved: list[Saved], target, *, source: str, findings_dir: Path, device: str = "cpu",
                 isolate: bool = False, timeout: float = 30.0, check_teeth: bool = True,
                 out: list | None = None) -> list[ReplayOutcome]:
    """``out`` (default a new list) gets each outcome as it is known: an interrupt keeps those."""
    from vmfuzz.harness.engine.regression.replay import NotDriven
    from vmfuzz.harness.targets import TargetUnavailable, resolve

    out = [] if out is None else out
    for s in saved:
        path, repro = s.path, s.repro
        o = ReplayOutcome(path, source)
        try:
            if repro is None:
                raise ReproError(s.error)
            o.property, o.recorded_target = repro.property, repro.target
            got = outcome_of(repro, target, device, isolate or bool(repro.fault), timeout)
            o.status, o.detail, o.fault, o.origin = got.status, got.detail, got.fault, got.origin
            if got.status == CUT:  # a sound repro the cap left unreplayed: could not check (exit 3), kept
                o.status = "error"
                out.append(o)
                continue
        except ReproError as exc:
            o.status, o.detail, o.unreadable = "error", str(exc), not isinstance(exc, NotDriven)
            out.append(o)
            continue
        if o.status == "failed":
            config, steps = to_case(repro)
            fpath = findings_dir / f"replay-{path.parent.name}-{path.stem}.json"
            fpath = dump(type(repro)(**{**{f: getattr(repro, f) for f in repro.__struct_fields__},
                                "target": target.name, "detail": o.detail, "origin": o.origin}), fpath)
            o.finding = Finding(o.origin.property, f"saved repro {path} fails again: {o.detail}", fpath,
                                config, steps, o.origin.kind(), origin=o.origin)
        elif check_teeth and repro.target != target.name and ":" not in repro.target:
            # a plug-in the repro names is never imported on the file's word (README, repro file)
            try:
                recorded = resolve(repro.target)
            except TargetUnavailable:
                recorded = None
            if recorded is not None:
                teeth = outcome_of(repro, recorded, device, isolate or bool(repro.fault), timeout).status
                o.teeth = None if teeth == CUT else teeth == "failed"  # one the cap stopped is not checked
        out.append(o)
    return out
