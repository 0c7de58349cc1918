"""The command line, read once: argparse's namespace turned into one frozen, typed request per command.

Every value a person typed is checked here, before any work: a number out of
range, an unknown property, a malformed ``--shard`` or ``--bounds`` is one
``UsageError`` line (exit 2). Every path is made absolute against the directory
vmfuzz started in, before any target code is imported: a checkout whose
``sglang/__init__.py`` calls ``os.chdir``, or a plug-in that changes directory
on import, must not move the reports, the database or the findings. The report
folder is chosen here too, once: a folder refused at the end would cost the whole
run. Commands and the engine below read typed values from the request (a
``Path``, a tuple of property names, a shard), never the namespace.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import msgspec

from vmfuzz.harness.commands.bounds_option import BoundsGiven, bounds_given
from vmfuzz.harness.model import limits
from vmfuzz.harness.model.errors import UsageError
from vmfuzz.harness.model.validate import LimitError, number
from vmfuzz.harness.report.summary import default_report_dir


class Request(msgspec.Struct, frozen=True, kw_only=True):
    command: str
    #: the command's report folder: ``--report-dir`` checked (see ``own_report_dir``), else a fresh
    #: timestamped one; None for a command that writes no reports
    report_dir: Path | None = None


class RunRequest(Request, frozen=True, kw_only=True):
    """``run`` and ``gate`` (a run under the pr profile, taken only when the change touches mask code)."""
    target: str
    profile: str
    #: this shard's properties, every name known
    properties: tuple[str, ...]
    #: the run's whole property selection, before ``--shard`` split it (``properties`` when unsharded)
    selection: tuple[str, ...] = ()
    seed: int | None = None
    max_examples: int | None = None
    time_budget: float | None = None
    deployment: Path | None = None
    bounds: BoundsGiven | None = None
    share: bool = True
    #: no more than there is work for
    workers: int = 1
    device: str = "cpu"
    verbose: bool = False
    #: ``--db`` as given: a folder (anchored) or a Redis URL
    db: str = ""
    #: the folder for the database's files: ``--db`` itself, or the default one beside a Redis URL
    db_folder: Path = Path()
    #: ``--shard K/N`` as (K, N)
    shard: tuple[int, int] | None = None
    isolate: str = "auto"
    example_timeout: float | None = None
    fail_on_known: bool = False
    repro_root: Path | None = None
    repros: tuple[Path, ...] = ()
    known: tuple[Path, ...] = ()
    # gate only
    changed_files: Path | None = None
    base: str | None = None
    repo: Path | None = None


class ReplayRequest(Request, frozen=True, kw_only=True):
    file: Path
    target: str | None
    property: str | None
    device: str
    isolate: str
    example_timeout: float
    fail_on_known: bool


class MinimizeRequest(Request, frozen=True, kw_only=True):
    file: Path
    target: str | None
    output: Path | None
    property: str | None
    fail_on_known: bool
    device: str


class SelftestRequest(Request, frozen=True, kw_only=True):
    target: str
    seed: int
    max_examples: int
    variants: tuple[str, ...]
    device: str


class SurfaceRequest(Request, frozen=True, kw_only=True):
    target: str
    json: bool


class BisectRequest(Request, frozen=True, kw_only=True):
    repro: Path
    repo: Path
    good: str
    bad: str
    target: str
    property: str | None
    timeout: float


class EnumerateRequest(Request, frozen=True, kw_only=True):
    """``verify-policy`` and ``exhaustive``: the commands that enumerate instead of search."""
    target: str
    workers: int = 1


class MergeRequest(Request, frozen=True, kw_only=True):
    dirs: tuple[Path, ...]


class CompareRequest(Request, frozen=True, kw_only=True):
    a: Path
    b: Path


class InstallRequest(Request, frozen=True, kw_only=True):
    """``install-sglang``: which release, or which SGLang checkout, and whether only to check."""
    version: str | None = None
    source: Path | None = None
    check: bool = False


def _usage(exc: Exception) -> UsageError:
    return UsageError(f"vmfuzz: {exc}")


def _path(value: str | None) -> Path | None:
    """Anchored against the directory vmfuzz started in; an empty value is no value."""
    return Path(os.path.abspath(value)) if value else None


def _paths(values) -> tuple[Path, ...]:
    return tuple(Path(os.path.abspath(v)) for v in values or () if v)


def _numbers(checks) -> None:
    try:
        for option, value, kw in checks:
            number(option, value, **kw)
    except LimitError as exc:
        raise _usage(exc) from None


def property_names(names) -> tuple[str, ...]:
    """Every property a user named exists: one line listing the known ones otherwise."""
    from vmfuzz.harness.properties import named
    for name in names:
        try:
            named(name)
        except ValueError as exc:
            raise _usage(exc) from None
    return tuple(names)


def _shard(text: str | None, properties: tuple[str, ...]):
    """``--shard K/N``: (K, N) and this shard's properties."""
    if text is None:
        return None, properties
    from vmfuzz.harness.engine.campaign.shard import parse_shard, shard_properties
    try:
        k, n = parse_shard(text, len(properties))
    except ValueError as exc:
        raise _usage(exc) from None
    return (k, n), tuple(shard_properties(list(properties), k, n))


def _run(args, report_dir: Path | None) -> RunRequest:
    from vmfuzz.harness.engine.campaign.profiles import DEFAULT_DB_DIR
    from vmfuzz.harness.engine.search.database import shared_url
    from vmfuzz.harness.properties import PROPERTIES
    selection = property_names(args.properties or list(PROPERTIES))
    shard, properties = _shard(args.shard, selection)
    _numbers([("--max-examples", getattr(args, "max_examples", None), dict(low=1, high=limits.MAX_EXAMPLES)),
              ("--time-cap" if args.command == "gate" else "--time-budget", getattr(args, "time_budget", None),
               dict(low=0, high=limits.MAX_TIME_BUDGET, low_open=True)),
              ("--seed", getattr(args, "seed", None), dict(low=0, high=limits.MAX_SEED)),
              ("--workers", args.workers, dict(low=1, high=limits.MAX_WORKERS)),
              ("--example-timeout", args.example_timeout,
               dict(low=limits.MIN_EXAMPLE_TIMEOUT, high=limits.MAX_EXAMPLE_TIMEOUT))])
    db = args.db if shared_url(args.db) else os.path.abspath(args.db)  # a Redis URL is no path
    gate = args.command == "gate"
    return RunRequest(
        command=args.command, report_dir=report_dir, target=args.target, profile="pr" if gate else args.profile,
        properties=properties, selection=selection, seed=None if gate else args.seed, max_examples=None if gate else args.max_examples,
        time_budget=args.time_budget, deployment=None if gate else _path(args.deployment),
        bounds=None if gate or args.bounds is None else bounds_given(args.bounds),
        share=getattr(args, "share", True),
        # more workers than properties would only start idle processes
        workers=min(args.workers, max(1, len(properties))), device=args.device, verbose=args.verbose,
        db=db, db_folder=Path(os.path.abspath(DEFAULT_DB_DIR) if shared_url(args.db) else db), shard=shard,
        isolate=args.isolate, example_timeout=args.example_timeout, fail_on_known=args.fail_on_known,
        repro_root=_path(args.repro_root), repros=_paths(args.repros), known=_paths(args.known),
        changed_files=_path(getattr(args, "changed_files", None)), base=getattr(args, "base", None),
        repo=_path(getattr(args, "repo", None)))


def _replay(args, report_dir):
    _numbers([("--example-timeout", args.example_timeout,
               dict(low=limits.MIN_EXAMPLE_TIMEOUT, high=limits.MAX_EXAMPLE_TIMEOUT))])
    return ReplayRequest(command=args.command, report_dir=report_dir, file=_path(args.file), target=args.target,
                         property=args.property, device=args.device, isolate=args.isolate,
                         example_timeout=args.example_timeout, fail_on_known=args.fail_on_known)


def _minimize(args, report_dir):
    return MinimizeRequest(command=args.command, report_dir=report_dir, file=_path(args.file), target=args.target,
                           output=_path(args.output), property=args.property and property_names([args.property])[0],
                           fail_on_known=args.fail_on_known, device=args.device)


def _selftest(args, report_dir):
    _numbers([("--max-examples", args.max_examples, dict(low=1, high=limits.MAX_EXAMPLES)),
              ("--seed", args.seed, dict(low=0, high=limits.MAX_SEED))])
    return SelftestRequest(command=args.command, report_dir=report_dir, target=args.target, seed=args.seed,
                           max_examples=args.max_examples, variants=tuple(args.variants or ()), device=args.device)


def _bisect(args, report_dir):
    if args.timeout <= 0:
        raise UsageError("vmfuzz: --timeout must be positive")
    return BisectRequest(command=args.command, report_dir=report_dir, repro=_path(args.repro), repo=_path(args.repo),
                         good=args.good, bad=args.bad, target=args.target, property=args.property,
                         timeout=args.timeout)


def _enumerate(args, report_dir):
    workers = getattr(args, "workers", 1)
    _numbers([("--workers", workers, dict(low=1, high=limits.MAX_WORKERS))])
    return EnumerateRequest(command=args.command, report_dir=report_dir, target=args.target, workers=workers)


READERS = {
    "run": _run, "gate": _run, "replay": _replay, "minimize": _minimize, "selftest": _selftest,
    "bisect": _bisect, "verify-policy": _enumerate, "exhaustive": _enumerate,
    "surface": lambda a, r: SurfaceRequest(command=a.command, report_dir=r, target=a.target, json=a.json),
    "merge": lambda a, r: MergeRequest(command=a.command, report_dir=r, dirs=_paths(a.dirs)),
    "compare": lambda a, r: CompareRequest(command=a.command, report_dir=r, a=_path(a.a), b=_path(a.b)),
    "targets": lambda a, r: Request(command=a.command),
    "install-sglang": lambda a, r: InstallRequest(command=a.command, version=a.version,
                                                  source=_path(getattr(a, "from")), check=a.check),
}


def request_of(args: argparse.Namespace) -> Request:
    """The one conversion: argparse's namespace to the command's typed request, every value checked."""
    report_dir = None
    if hasattr(args, "report_dir"):
        given = _path(args.report_dir)
        # absolute: target code that changes directory must not move the reports
        report_dir = (own_report_dir(given, getattr(args, "overwrite", False)) if given
                      else Path(os.path.abspath(default_report_dir())))
    return READERS[args.command](args, report_dir)


#: what a run leaves in its report folder: one of these there means another run's reports
REPORT_FILES = ("summary.json", "summary.md", "junit.xml", "report.html", "findings")


def own_report_dir(path: Path, overwrite: bool) -> Path:
    """``path`` resolved (a symlink is its target), refused when it already holds a run's
    reports: their summary would be replaced and the two runs' findings mixed.
    ``--overwrite`` says the user means it."""
    try:
        real = path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise UsageError(f"vmfuzz: --report-dir {path}: cannot resolve it ({exc})") from None
    if not overwrite and real.is_dir():
        held = [n for n in REPORT_FILES if os.path.lexists(real / n)]
        if held:
            where = path if real == path.absolute() else f"{path} (-> {real})"
            raise UsageError(f"vmfuzz: --report-dir {where} already holds reports ({', '.join(held)}); "
                             "choose a new directory, or pass --overwrite to replace them")
    # The user's own spelling where no link is involved; the real folder where one is,
    # so a link retargeted mid-run cannot move half of the reports elsewhere.
    return path if real == path.absolute() else real

