"""``run`` and ``gate``'s request turned into a plan, before any work.

Everything the engine needs from outside itself is read and checked here, once:
the deployment file, the target, the report folder (claimed), the database, the
saved repros and the known findings. The plan carries what was read down to the
engine (the repros themselves, not the folders to read them from again), so the
engine runs on typed values and never calls back up for a path, a check or a
warning; a bad input is one ``UsageError`` line (exit 2) before the search.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import msgspec

from vmfuzz.harness.commands.common import check_device, isolated
from vmfuzz.harness.commands.request import RunRequest
from vmfuzz.harness.engine.campaign.profiles import PROFILES
from vmfuzz.harness.engine.campaign.session import RunPlan
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.model.errors import UsageError


class Places(msgspec.Struct, frozen=True, kw_only=True):
    """The places a run reads and writes, from its request: checked before the search."""
    report_dir: Path
    db_folder: Path
    repros: tuple[Path, ...] = ()
    known: tuple[Path, ...] = ()
    #: where saved repros come from: ``--repro-root`` or the ones vmfuzz ships, then each
    #: ``--repros DIR``; never the working directory: in CI that is the checkout under review
    repro_roots: tuple[Path, ...] = ()
    #: where known findings come from: the ones vmfuzz ships, then each ``--known DIR``
    known_roots: tuple[Path, ...] = ()

    @classmethod
    def of(cls, request) -> Places:
        from vmfuzz.harness.engine.regression.known import default_known_root
        from vmfuzz.harness.engine.regression.regressions import default_repro_root
        return cls(report_dir=request.report_dir, db_folder=request.db_folder, repros=request.repros,
                   known=request.known, repro_roots=(request.repro_root or default_repro_root(), *request.repros),
                   known_roots=(default_known_root(), *request.known))


def plan(request: RunRequest):
    """What run and gate share: the request's plan, and its target.

    One way down: the command line's own checks first, then what the engine reads
    (known findings, saved repros), then the target, then the folders and the
    model's values; nothing below is asked twice, and nothing comes back up for a
    check.
    """
    profile = PROFILES[request.profile]
    if request.shard is not None and request.shard[0] > 1:
        # saved repros and last failures are shard 1's: every shard replaying them would report each N times
        profile = dataclasses.replace(profile, replay_repros=False, replay_last_failures=False)
    deployment = _deployment(request.deployment)
    check_device(request.device)
    isolate = isolated(request.isolate, request.target)
    seed = request.seed
    if seed is None:
        seed = profile.fixed_seed if profile.fixed_seed is not None else random.SystemRandom().randrange(2**31)
    places = Places.of(request)
    check_folders(places)
    db_url = check_shared_db(request.db, profile)
    from vmfuzz.harness.engine.campaign.nightly import Night
    night = Night(places.db_folder) if profile.replay_last_failures else None
    from vmfuzz.harness.engine.regression.known import entries
    from vmfuzz.harness.engine.regression.regressions import replayable_saved
    # read before the target loads: an unreadable entry or repro is one line now, not a stop mid-run
    found = entries(*places.known_roots)
    saved, warnings = replayable_saved(places.repro_roots) if profile.replay_repros else ((), ())
    from vmfuzz.harness.targets import resolve_or_refuse
    target = resolve_or_refuse(request.target)
    from vmfuzz.harness.properties import not_driven_on
    not_driven = not_driven_on(request.properties, deployment.config) if deployment is not None else {}
    # A finding must never be lost to an output place that was broken from the start.
    from vmfuzz.harness.model.report_claim import claim
    from vmfuzz.harness.model.validate import not_a_folder, ready_dir
    report_dir = claim(ready_dir(places.report_dir, "--report-dir"))
    if profile.database == "write" or profile.replay_last_failures:
        ready_dir(places.db_folder, "--db")
        if profile.replay_last_failures:
            ready_dir(places.db_folder / "last-failures", "--db's last-failures")
        from vmfuzz.harness.engine.campaign.history import lock_problem
        if lock_problem(places.db_folder):
            raise UsageError(f"vmfuzz: --db {places.db_folder}: {lock_problem(places.db_folder)}")
    if profile.database != "none" and db_url is None:
        warnings = (*warnings, *not_a_folder(places.db_folder / "hypothesis", "example database"))
    from vmfuzz.harness.model.known_file import applying
    known = tuple(applying(found, dict(target.versions())))
    # A slow target (sglang runs its kernel in the Triton interpreter, where a production
    # shape takes tens of seconds a case) carries its own example budget, case timeout,
    # bounds and bound steps per profile.
    own_budget = getattr(target, "budget", {}).get(profile.name)
    run_plan = RunPlan(target=request.target, profile=profile, seed=seed,
                       max_examples=request.max_examples or min(profile.max_examples, own_budget or profile.max_examples),
                       time_budget=request.time_budget if request.time_budget is not None else profile.time_budget,
                       report_dir=report_dir, properties=list(request.properties),
                       selection=tuple(request.selection or request.properties), workers=request.workers,
                       device=request.device, db_dir=request.db_folder, db_url=db_url,
                       shard=f"{request.shard[0]}/{request.shard[1]}" if request.shard else None,
                       isolate=isolate,
                       example_timeout=request.example_timeout
                       or getattr(target, "example_timeout", {}).get(profile.name) or 30.0,
                       deployment=deployment, command=request.command, saved=saved, known=known,
                       warnings=warnings, fail_on_known=request.fail_on_known,
                       bounds=getattr(target, "bounds", None) or Bounds(), share=request.share, night=night,
                       not_driven=not_driven)
    if request.bounds is not None:
        run_plan.bounds = request.bounds.over(run_plan.bounds)
    else:
        # A slow target widens its bounds step by step where the profile's budget allows.
        run_plan.bounds_steps = tuple(getattr(target, "bounds_ladder", {}).get(profile.name, ()))
    return run_plan, target


def _deployment(path: Path | None):
    """``--deployment FILE`` read and its configs built, or None."""
    if not path:
        return None
    from vmfuzz.harness.model.deployment_file import DeploymentError, load_plan
    try:
        return load_plan(path)
    except DeploymentError as exc:
        raise UsageError(f"vmfuzz: {exc}") from None


def check_folders(places: Places) -> None:
    """The folders named on the command line are there, before any work.

    A folder CI names that is not there is a guard that silently went missing.
    """
    for option, folder in [("--repros", d) for d in places.repros] + [("--known", d) for d in places.known]:
        if not folder.is_dir():
            raise UsageError(f"vmfuzz: {option} {folder}: not a directory")


def check_shared_db(value: str, profile) -> str | None:
    """``--db redis://...`` reachable before the search (one line, exit 2); None for a folder."""
    from vmfuzz.harness.engine.search.database import SharedDatabaseError, redis_database, shared_url
    url = shared_url(value)
    if url and profile.database != "none":
        try:
            redis_database(url)
        except SharedDatabaseError as exc:
            raise UsageError(f"vmfuzz: {exc}") from None
    return url
