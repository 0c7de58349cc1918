"""What every command shares: the target it runs on, the options checked before any work,
and where its reports go.

Each check turns a bad value into one ``UsageError`` line (exit 2) before anything
runs, so no finding is ever lost to an option that was wrong from the start.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from vmfuzz.harness.model.errors import UsageError
from vmfuzz.harness.model.validate import ready_dir


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
    from vmfuzz.harness.targets import resolve_or_refuse
    return resolve_or_refuse(spec)


#: the "property" a finding made while the target was being built carries: no property ran yet
LOADING = "target load"


def import_finding(exc, command: str, spec: str, report_dir: Path) -> int:
    """SGLang's own code raised while the target imported it (``ImportRaised``): no property can run on
    code a server could not load either, so that raise is the command's finding (effect raise, stage
    import), written to the report folder like any other; exit 1."""
    from vmfuzz.harness.model.errors import EXIT_FINDING
    from vmfuzz.harness.model.origin import encode
    from vmfuzz.harness.report.summary import Check, CommandSummary
    origin = exc.origin(LOADING)
    print(f"vmfuzz {command}: FAILED: {exc.detail()}", flush=True)
    from vmfuzz.harness.model.verdict import Kind, Verdict
    check = Check(f"import {exc.module}", "failed", exc.detail(), kind=origin.kind(), origin=encode(origin))
    write_command_report(CommandSummary(command, spec, [check], headline=f"finding: {origin.label()} "
                                        f"(stage import: {exc.module} does not load)",
                                        outcome=Verdict.of(Kind.NEW_FINDING, exc.detail())), report_dir)
    return EXIT_FINDING


def load_failed(exc, command: str, spec: str, report_dir: Path) -> int:
    """The code under test could not be loaded here (``CannotLoad``: a package it pins is missing or at
    another version; ``OutOfStep``: vmfuzz does not fit the code): no property ran, so the run could not
    check (exit 3), and its reports say so like any run's, with the same verdict."""
    from vmfuzz.harness.model.errors import CannotLoad, out_of_step_line
    from vmfuzz.harness.model.verdict import Kind, Verdict
    from vmfuzz.harness.report.summary import Check, CommandSummary
    if isinstance(exc, CannotLoad):
        v = Verdict.of(Kind.CANNOT_LOAD, exc.why + (f" ({exc.how})" if exc.how else ""))
        print(f"vmfuzz: could not check: {exc}", file=sys.stderr)
    else:
        v = Verdict.of(Kind.OUT_OF_STEP, f"vmfuzz is out of step with this SGLang: {exc}")
        print(out_of_step_line(exc), file=sys.stderr)
    check = Check("load the code under test", "error", v.why, kind=v.kind.value)
    write_command_report(CommandSummary(command, spec, [check], headline=f"{v.headline}: {v.why}", outcome=v),
                         report_dir)
    print(f"{v.headline}: {v.why}")
    return v.exit_code


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
    from vmfuzz.harness.report.terminal import shown
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
    return ready_dir(path, what)


def claimed_report_dir(report_dir: Path) -> Path:
    """The report folder, created, proven writable and claimed for this run alone (exit 2 if another
    run holds it): called once the command's input is known good, before any work."""
    from vmfuzz.harness.model.report_claim import claim
    return claim(usable(report_dir, "--report-dir"))


def findings_dir(report_dir: Path) -> Path:
    """One folder for the findings and the reports that point at them."""
    return usable(report_dir, "--report-dir") / "findings"


def write_command_report(summary, report_dir: Path) -> Path:
    from vmfuzz.harness.report.summary import write_command_summary
    write_command_summary(summary, report_dir)
    html = ", report.html" if summary.command in ("run", "gate") else ""
    print(f"reports: {report_dir}/ (summary.json, summary.md, junit.xml{html})")
    return report_dir
