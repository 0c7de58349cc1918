"""The command line's edge: options and output places checked before any work, and how a command ends.

``guarded`` runs a command so that it ends with exactly one of the documented
exit codes: 0 all held, 1 a finding (on disk), 2 bad input (one line on
stderr), 130 Ctrl-C, 143 SIGTERM -- never a traceback, never an exit code
chosen by the code under test.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from harness import limits
from harness.errors import EXIT_USAGE, UsageError
from harness.validate import LimitError, number, usable_dir


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


def check_run_options(args, profile, properties) -> None:
    """Every number run and gate take: finite, in range; workers no more than there is work for."""
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
    args.workers = min(args.workers, max(1, len(properties)))


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
    """The report directory, the database and the saved repros, checked before the search.

    A finding must never be lost to an output place that was broken from the
    start, and a gate must never pass over a saved repro it cannot read.
    """
    from harness.session import default_report_dir
    report_dir = usable(Path(args.report_dir) if args.report_dir else default_report_dir(), "--report-dir")
    if profile.database == "write" or profile.replay_last_failures:
        db = Path(args.db)
        usable(db, "--db")
        if profile.replay_last_failures:
            usable(db / "last-failures", "--db's last-failures")
    if profile.replay_repros:
        from harness.regressions import default_repro_root
        check_saved_repros(Path(args.repro_root) if args.repro_root else default_repro_root())
    return report_dir


def check_saved_repros(root: Path) -> None:
    from harness.regressions import saved_repros
    from harness.replay import FAULTS
    from harness.repro_file import ReproError, load, to_case
    from harness.properties import PROPERTIES
    if root.exists() and not root.is_dir():
        raise UsageError(f"vmfuzz: repro root {root} is not a directory")
    for path in saved_repros(root):
        try:
            repro = load(path)
            if repro.property not in PROPERTIES:
                raise ReproError(f"unknown property {repro.property!r}")
            if repro.fault is not None and repro.fault not in FAULTS:
                raise ReproError(f"unknown fault {repro.fault!r}")
            to_case(repro)
        except ReproError as exc:
            msg = str(exc)
            raise UsageError(f"vmfuzz: saved repro {path} cannot be replayed: "
                             + (msg if str(path) not in msg else msg.split(": ", 1)[-1])) from None


def write_reports_somewhere(write, outcome, report_dir: Path):
    """Reports into ``report_dir``, or, when it broke mid-run, into a fallback place (said on stderr)."""
    try:
        return write(outcome, report_dir), report_dir
    except OSError as exc:
        from harness.validate import fallback_dir
        where = fallback_dir() / "reports"
        summary = write(outcome, where)
        print(f"vmfuzz: cannot write reports to {report_dir} ({exc.strerror or exc}); wrote them to {where}",
              file=sys.stderr)
        return summary, where


def target_raised(exc: BaseException) -> str:
    from harness.isolation import TargetRaised
    return f"target raised {exc}" if isinstance(exc, TargetRaised) else f"target raised {type(exc).__name__}: {exc}"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:500] if text else ""


def guarded(main, argv) -> int:
    """Run ``main(argv)`` and map whatever ends it to the documented exit codes."""
    from harness import signals
    from harness.campaign import HarnessError
    from harness.repro_file import ReproError

    old_stdout = sys.stdout
    signals.quiet_stdout()
    try:
        previous = signals.install()
    except ValueError:  # not the main thread (an embedding caller): leave its handlers alone
        previous = None
    try:
        try:
            return main(argv)
        except SystemExit as exc:
            if _from_argparse(exc):
                raise
            # Only code under test calls exit() inside a command: it never decides the verdict.
            print(f"vmfuzz: the target called exit({exc.code!r}) outside a property check", file=sys.stderr)
            return EXIT_USAGE
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except (UsageError, ReproError) as exc:
        msg = " ".join(str(exc).split("\n"))
        print(msg if msg.startswith("vmfuzz") else f"vmfuzz: {msg}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        print("vmfuzz: interrupted (findings written so far are kept)", file=sys.stderr)
        return signals.exit_code(exc)
    except HarnessError as exc:
        print(f"vmfuzz: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RecursionError as exc:
        print(f"vmfuzz: the target recursed without end ({_one_line(exc)})", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback (VMFUZZ_DEBUG=1 shows it)
        if os.environ.get("VMFUZZ_DEBUG"):
            raise
        print(f"vmfuzz: failed: {type(exc).__name__}: {_one_line(exc)} (VMFUZZ_DEBUG=1 shows where)",
              file=sys.stderr)
        return EXIT_USAGE
    finally:
        if previous is not None:
            signals.restore(previous)
        try:
            sys.stdout.flush()
        except Exception:  # noqa: BLE001
            pass
        sys.stdout = old_stdout


def _from_argparse(exc: SystemExit) -> bool:
    """--help and --version exit through argparse with code 0 (errors go through UsageError)."""
    import traceback
    frames = traceback.extract_tb(exc.__traceback__)
    return any(f.filename.endswith("argparse.py") for f in frames)
