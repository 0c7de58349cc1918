"""What every command shares: the target it runs on, the options checked before any work,
and where its reports go.

Each check turns a bad value into one ``UsageError`` line (exit 2) before anything
runs, so no finding is ever lost to an option that was wrong from the start.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from harness.model import limits
from harness.model.errors import UsageError
from harness.model.validate import LimitError, number, usable_dir
from harness.report.summary import default_report_dir


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


def import_finding(args, command: str, spec: str, exc) -> int:
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
                                        f"(stage import: {exc.module} does not load)"), report_dir_of(args))
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


def sglang_checkout_at(repo: str, command: str) -> Path:
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


def check_property_names(names) -> None:
    """Every property a user named exists: one line listing the known ones otherwise."""
    from harness.properties import named
    for name in names:
        try:
            named(name)
        except ValueError as exc:
            raise UsageError(f"vmfuzz: {exc}") from None


def _usage(exc: Exception) -> UsageError:
    return UsageError(f"vmfuzz: {exc}")


def check_timeout(value) -> None:
    try:
        number("--example-timeout", value, low=limits.MIN_EXAMPLE_TIMEOUT, high=limits.MAX_EXAMPLE_TIMEOUT)
    except LimitError as exc:
        raise _usage(exc) from None


def check_workers(value) -> None:
    try:
        number("--workers", value, low=1, high=limits.MAX_WORKERS)
    except LimitError as exc:
        raise _usage(exc) from None


def check_run_options(args, properties) -> int:
    """Every number run and gate take: finite, in range. Returns the workers to use:
    no more than there is work for."""
    try:
        number("--max-examples", getattr(args, "max_examples", None), low=1, high=limits.MAX_EXAMPLES)
        number("--time-budget", getattr(args, "time_budget", None), low=0, high=limits.MAX_TIME_BUDGET,
               low_open=True)
        number("--seed", getattr(args, "seed", None), low=0, high=limits.MAX_SEED)
        number("--workers", args.workers, low=1, high=limits.MAX_WORKERS)
        number("--example-timeout", args.example_timeout, low=limits.MIN_EXAMPLE_TIMEOUT,
               high=limits.MAX_EXAMPLE_TIMEOUT)
    except LimitError as exc:
        raise _usage(exc) from None
    # More workers than properties would only start idle processes.
    return min(args.workers, max(1, len(properties)))


def check_selftest_options(args) -> None:
    try:
        number("--max-examples", args.max_examples, low=1, high=limits.MAX_EXAMPLES)
        number("--seed", args.seed, low=0, high=limits.MAX_SEED)
    except LimitError as exc:
        raise _usage(exc) from None


def usable(path: Path, what: str) -> Path:
    try:
        return usable_dir(path, what)
    except LimitError as exc:
        raise _usage(exc) from None


def check_places(args, profile) -> Path:
    """The report directory, the database, the saved repros and the known findings, checked
    before the search.

    A finding must never be lost to an output place that was broken from the
    start, and a gate must never pass over a saved repro it cannot read.
    """
    report_dir = claimed_report_dir(args)
    if profile.database == "write" or profile.replay_last_failures:
        db = local_db_dir(args)
        usable(db, "--db")
        if profile.replay_last_failures:
            usable(db / "last-failures", "--db's last-failures")
    named = [("--repros", d) for d in getattr(args, "repros", None) or ()]
    for option, folder in named + [("--known", d) for d in getattr(args, "known", None) or ()]:
        # A folder CI names that is not there is a guard that silently went missing.
        if not Path(folder).is_dir():
            raise UsageError(f"vmfuzz: {option} {folder}: not a directory")
    if profile.replay_repros:
        for root in repro_roots(args):
            check_saved_repros(root)
    from harness.engine.regression.known import entries
    entries(*known_roots(args))  # an unreadable entry is one line now, not a stop mid-run
    return report_dir


def repro_roots(args) -> tuple[Path, ...]:
    """Where saved repros come from: ``--repro-root`` or the ones vmfuzz ships, then each
    ``--repros DIR``. Never the working directory: in CI that is the checkout under review."""
    from harness.engine.regression.regressions import default_repro_root
    first = Path(args.repro_root) if getattr(args, "repro_root", None) else default_repro_root()
    return (first, *(Path(d) for d in getattr(args, "repros", None) or ()))


def known_roots(args) -> tuple[Path, ...]:
    """Where known findings come from: the ones vmfuzz ships, then each ``--known DIR``."""
    from harness.engine.regression.known import default_known_root
    return (default_known_root(), *(Path(d) for d in getattr(args, "known", None) or ()))


def local_db_dir(args) -> Path:
    """The folder for the database's files: ``--db`` itself, or the default one beside a Redis URL,
    as ``anchor_paths`` fixed it before any target code ran."""
    anchored = getattr(args, "db_folder", None)
    if anchored is not None:
        return Path(anchored)
    from harness.engine.search.database import shared_url
    from harness.engine.campaign.profiles import DEFAULT_DB_DIR
    return Path(DEFAULT_DB_DIR if shared_url(args.db) else args.db)


#: the options (argparse dests) that name a file or folder, read or written
PATH_OPTIONS = ("report_dir", "db", "changed_files", "repo", "repro_root", "repros", "known", "deployment",
                "file", "output", "repro", "dirs", "a", "b")


def anchor_paths(args) -> None:
    """Every path the command line names, made absolute against the directory vmfuzz started in.

    Called before any target code is imported: a checkout whose ``sglang/__init__.py``
    calls ``os.chdir``, or a plug-in that changes directory on import, must not move
    the reports, the database or the findings, nor make a relative ``--report-dir``
    land on another run's summary that was never checked for.
    """
    from harness.engine.search.database import shared_url
    from harness.engine.campaign.profiles import DEFAULT_DB_DIR

    def anchored(value):
        if isinstance(value, list):
            return [anchored(v) for v in value]
        return os.path.abspath(value) if isinstance(value, str) and value else value

    for dest in PATH_OPTIONS:
        value = getattr(args, dest, None)
        if dest == "db" and isinstance(value, str) and shared_url(value):
            continue  # a Redis URL is no path; its local files go to the default folder, anchored below
        if value is not None:
            setattr(args, dest, anchored(value))
    if isinstance(getattr(args, "db", None), str):
        args.db_folder = args.db if not shared_url(args.db) else os.path.abspath(DEFAULT_DB_DIR)


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


#: what a run leaves in its report folder: one of these there means another run's reports
REPORT_FILES = ("summary.json", "summary.md", "junit.xml", "report.html", "findings")


def report_dir_of(args) -> Path:
    """The command's report folder: ``--report-dir`` (checked once, see ``own_report_dir``),
    else a fresh timestamped one. The same folder for every later call in the command."""
    chosen = getattr(args, "chosen_report_dir", None)
    if chosen is None:
        given = getattr(args, "report_dir", None)
        # absolute: target code that changes directory must not move the reports (anchor_paths)
        chosen = (own_report_dir(Path(given), getattr(args, "overwrite", False)) if given
                  else Path(os.path.abspath(default_report_dir())))
        args.chosen_report_dir = chosen
    return chosen


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


def claimed_report_dir(args) -> Path:
    """The report folder, created, proven writable and claimed for this run alone (exit 2 if another
    run holds it): called once the command's input is known good, before any work."""
    from harness.commands.report_claim import claim
    return claim(usable(report_dir_of(args), "--report-dir"))


def check_report_dir(args) -> None:
    """Before any work: a report folder refused at the end would cost the whole run."""
    if hasattr(args, "report_dir"):
        report_dir_of(args)


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
