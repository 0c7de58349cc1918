"""How a command ends: exactly one documented exit code, whatever ended it.

``guarded`` runs a command so that it ends with exactly one of the documented
exit codes: 0 all held, 1 a finding (on disk), 2 bad input (one line on
stderr), 130 Ctrl-C, 143 SIGTERM -- never a traceback, never an exit code
chosen by the code under test.
"""

from __future__ import annotations

import os
import sys

from vmfuzz.harness.engine.core import signals
from vmfuzz.harness.engine.core.failures import ImportRaised
from vmfuzz.harness.model.errors import (EXIT_FINDING, EXIT_OUT_OF_STEP, EXIT_USAGE, HarnessError, OutOfStep, UsageError,
                                  out_of_step_line)
from vmfuzz.harness.model.repro_file import ReproError


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:500] if text else ""


def guarded(main, argv) -> int:
    """Run ``main(argv)`` and map whatever ends it to the documented exit codes."""
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
        print(f"vmfuzz: interrupted by {signals.name()} (findings written so far are kept)", file=sys.stderr)
        return signals.exit_code(exc)
    except OutOfStep as exc:
        print(out_of_step_line(exc), file=sys.stderr)
        return EXIT_OUT_OF_STEP
    except ImportRaised as exc:  # the code under test raised while loading: its fault, not bad input
        print(f"vmfuzz: finding: {exc.detail()} (stage import; {exc.type_name} at {exc.frame})", file=sys.stderr)
        return EXIT_FINDING
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


def leave(code: int) -> None:
    """End the process now if threads it did not start would keep it alive.

    A target or plug-in may leave a non-daemon thread running (a poller, a
    watchdog); Python's exit would wait for it forever, with the reports
    already written and Ctrl-C no longer handled. Nothing of ours runs there.
    """
    import threading
    left = [t for t in threading.enumerate()
            if t.is_alive() and not t.daemon and t is not threading.main_thread()]
    if not left:
        return
    print(f"vmfuzz: warning: not waiting for {len(left)} thread(s) the target left running "
          f"({', '.join(sorted({t.name for t in left}))[:200]})", file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stdout: the code still stands
            pass
    os._exit(code)


def _from_argparse(exc: SystemExit) -> bool:
    """--help and --version exit through argparse with code 0 (errors go through UsageError)."""
    import traceback
    frames = traceback.extract_tb(exc.__traceback__)
    return any(f.filename.endswith("argparse.py") for f in frames)
