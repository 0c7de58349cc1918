"""What every command shares: the target it runs on, the options checked before any work,
and where its reports go.

Each check turns a bad value into one ``UsageError`` line (exit 2) before anything
runs, so no finding is ever lost to an option that was wrong from the start.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import msgspec

from harness.model.errors import UsageError
from harness.model.validate import LimitError, usable_dir


def prepare_process() -> None:
    """Process-wide settings every command wants before it imports a target."""
    quiet_dependency_warnings()
    import torch
    # Cases are tiny tensors: intra-op threads only add scheduling latency
    # (a 2-thread reduction took milliseconds); parallelism is per worker.
    torch.set_num_threads(1)


def quiet_dependency_warnings() -> None:
    """The target's import chain warns about its own dependencies (requests about
    chardet, urllib3 versions): noise in a gate's log, never a finding."""
    import warnings
    for message in (r"Unable to find acceptable character detection dependency",
                    r"urllib3 \(.*\) or chardet \(.*\)/charset_normalizer \(.*\) doesn't match"):
        warnings.filterwarnings("ignore", message=message)
    # Spawned workers (isolation, --workers) import the target afresh: same filter.
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"),
                                                          "ignore:Unable to find acceptable character detection"]))


def resolve_target(spec: str):
    from harness.targets import TargetUnavailable, resolve
    if sys.stdout.isatty() and spec.split("+", 1)[0] == "sglang":
        # importing SGLang is most of a short command's time: a person at a terminal sees why it waits
        # (a CI log has the timed lines after it; its stdout is not a terminal)
        print("vmfuzz: importing SGLang (the code under test; about 10-30 s) ...", flush=True)
    try:
        return resolve(spec)
    except TargetUnavailable as exc:
        raise UsageError(f"vmfuzz: target {spec!r} unavailable: {exc}") from None


#: the "property" a finding made while the target was being built carries: no property ran yet
LOADING = "target load"


def import_finding(exc, command: str, spec: str, report_dir: Path) -> int:
    """SGLang's own code raised while the target imported it (``ImportRaised``): no property can run on
    code a server could not load either, so that raise is the command's finding (effect raise, stage
    import), written to the report folder like any other; exit 1."""
    from harness.model.errors import EXIT_FINDING
    from harness.model.origin import encode
    from harness.report.summary import Check, CommandSummary
    origin = exc.origin(LOADING)
    print(f"vmfuzz {command}: FAILED: {exc.detail()}", flush=True)
    check = Check(f"import {exc.module}", "failed", exc.detail(), kind=origin.kind(), origin=encode(origin))
    write_command_report(CommandSummary(command, spec, [check], headline=f"finding: {origin.label()} "
                                        f"(stage import: {exc.module} does not load)"), report_dir)
    return EXIT_FINDING


def repro_target(given: str | None, recorded: str, default: str):
    """The target a repro is replayed on: ``--target``, else the one it records.

    A repro is data someone may have attached to a bug report: a plug-in it names
    (``module:attr``) would import, and so run, code the user never named. It is used
    only when the user passes it with --target."""
    if given:
        return resolve_target(given)
    spec = recorded or default
    if ":" in spec:
        raise UsageError(f"vmfuzz: the repro names the plug-in target {spec!r}; a repro's target is never "
                         f"imported on its own: pass --target {spec} to run it, or another --target")
    return resolve_target(spec)


def sglang_checkout_at(repo: Path, command: str) -> Path:
    """``--repo`` as given: an SGLang checkout (``python/sglang/__init__.py`` in it), or one line (exit 2).

    Anything else -- a folder without it, a file, a missing path -- would leave the
    installed SGLang to be tested, and pass on code nobody reviewed.
    """
    from harness.report.terminal import shown
    path = Path(repo)
    try:
        if (path / "python" / "sglang" / "__init__.py").is_file():
            return path
        why = ("no such path" if not path.exists() else "not a directory" if not path.is_dir()
               else "no python/sglang/__init__.py in it")
    except (OSError, ValueError) as exc:  # a NUL in the name, a folder we may not enter
        why = f"cannot look in it: {exc}"
    raise UsageError(f"vmfuzz {command}: --repo {shown(str(repo))} is not an SGLang checkout ({why})")


def check_device(device: str) -> None:
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise UsageError("vmfuzz: --device cuda: no CUDA device is available here")


def isolated(choice: str, spec: str) -> bool:
    """``--isolate auto|on|off`` for a target spec."""
    if choice != "auto":
        return choice == "on"
    # The embedded model cannot crash the process; real or foreign code can.
    return not spec.split("+")[0] == "reference"


def usable(path: Path, what: str) -> Path:
    try:
        return usable_dir(path, what)
    except LimitError as exc:
        raise UsageError(f"vmfuzz: {exc}") from None


class Places(msgspec.Struct, frozen=True, kw_only=True):
    """The places a run reads and writes, from its request: checked before the search (``check_places``)."""
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
        from harness.engine.regression.known import default_known_root
        from harness.engine.regression.regressions import default_repro_root
        return cls(report_dir=request.report_dir, db_folder=request.db_folder, repros=request.repros,
                   known=request.known, repro_roots=(request.repro_root or default_repro_root(), *request.repros),
                   known_roots=(default_known_root(), *request.known))


def check_places(places: Places, profile) -> Path:
    """The report directory, the database, the saved repros and the known findings, checked
    before the search; returns the report directory, claimed.

    A finding must never be lost to an output place that was broken from the
    start, and a gate must never pass over a saved repro it cannot read.
    """
    report_dir = claimed_report_dir(places.report_dir)
    if profile.database == "write" or profile.replay_last_failures:
        usable(places.db_folder, "--db")
        if profile.replay_last_failures:
            usable(places.db_folder / "last-failures", "--db's last-failures")
    for option, folder in [("--repros", d) for d in places.repros] + [("--known", d) for d in places.known]:
        # A folder CI names that is not there is a guard that silently went missing.
        if not folder.is_dir():
            raise UsageError(f"vmfuzz: {option} {folder}: not a directory")
    if profile.replay_repros:
        for root in places.repro_roots:
            check_saved_repros(root)
    from harness.engine.regression.known import entries
    entries(*places.known_roots)  # an unreadable entry is one line now, not a stop mid-run
    return report_dir


def check_shared_db(value: str, profile) -> str | None:
    """``--db redis://...`` reachable before the search (one line, exit 2); None for a folder."""
    from harness.engine.search.database import SharedDatabaseError, redis_database, shared_url
    url = shared_url(value)
    if url and profile.database != "none":
        try:
            redis_database(url)
        except SharedDatabaseError as exc:
            raise UsageError(f"vmfuzz: {exc}") from None
    return url


def check_saved_repros(root: Path) -> None:
    from harness.engine.regression.regressions import saved_repros
    from harness.engine.regression.replay import FAULTS, properties_for
    from harness.model.repro_file import ReproError, load
    from harness.properties import named
    if root.exists() and not root.is_dir():
        raise UsageError(f"vmfuzz: repro root {root} is not a directory")
    for path in saved_repros([root]):
        try:
            repro = load(path)
            if repro.fault is not None and repro.fault not in FAULTS:
                raise ReproError(f"unknown fault {repro.fault!r}")
            try:
                named(repro.property)  # a saved repro names the one property it guards
            except ValueError as exc:
                raise ReproError(str(exc)) from None
            properties_for(repro)  # one that does not apply to the config would judge nothing
        except ReproError as exc:
            msg = str(exc)
            raise UsageError(f"vmfuzz: saved repro {path} cannot be replayed: "
                             + (msg if str(path) not in msg else msg.split(": ", 1)[-1])) from None


def claimed_report_dir(report_dir: Path) -> Path:
    """The report folder, created, proven writable and claimed for this run alone (exit 2 if another
    run holds it): called once the command's input is known good, before any work."""
    from harness.commands.report_claim import claim
    return claim(usable(report_dir, "--report-dir"))


def findings_dir(report_dir: Path) -> Path:
    """One folder for the findings and the reports that point at them."""
    return usable(report_dir, "--report-dir") / "findings"


def write_command_report(summary, report_dir: Path) -> Path:
    from harness.report.summary import write_command_summary
    write_command_summary(summary, report_dir)
    print(f"reports: {report_dir}/ (summary.json, summary.md, junit.xml)")
    return report_dir


def write_reports_somewhere(write, outcome, report_dir: Path):
    """Reports into ``report_dir``, or, when it broke mid-run, into a fallback place (said on stderr);
    returns (summary, where they went: None when nowhere could hold them)."""
    try:
        return write(outcome, report_dir), report_dir
    except OSError as exc:
        from harness.model.validate import fallback_dir
        where = fallback_dir() / "reports"
        try:
            summary = write(outcome, where)
        except OSError as again:
            # A limit on every file this process writes (ulimit -f) stops the fallback too: the
            # findings are on disk and the verdict stands; the reports are what is missing.
            from harness.report.summary import build_summary
            print(f"vmfuzz: cannot write reports to {report_dir} ({exc.strerror or exc}) nor to {where} "
                  f"({again.strerror or again}); the findings' repros are on disk", file=sys.stderr)
            return build_summary(outcome), None
        print(f"vmfuzz: cannot write reports to {report_dir} ({exc.strerror or exc}); wrote them to {where}",
              file=sys.stderr)
        return summary, where
