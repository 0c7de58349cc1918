"""``vmfuzz gate``: the pr profile, run only when the change touches verify-mask code.

Run in (or pointed at with ``--repo``) an SGLang checkout, the gate tests that
checkout's ``python/sglang``, the code under review, not whatever SGLang the
environment has installed: the checkout goes first on the path of this process
and of every worker, and an SGLang that then loads from anywhere else is a
refusal (exit 2), never a verdict on code that was not tested.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from vmfuzz.harness.commands.common import import_finding, load_failed, sglang_checkout_at, write_command_report
from vmfuzz.harness.commands.request import RunRequest
from vmfuzz.harness.commands.planning import plan
from vmfuzz.harness.commands.run import execute_and_report
from vmfuzz.harness.model.errors import EXIT_OK, CannotLoad, OutOfStep, UsageError


def run(request: RunRequest) -> int:
    """The gate under its time cap, counted from the process's start to its exit (``clock``): a phase
    the cap stops is could not check (exit 3), and a gate the cap ends mid-phase still writes its reports."""
    from vmfuzz.harness.engine.campaign.profiles import PROFILES
    from vmfuzz.harness.engine.core import clock
    profile = PROFILES[request.profile]
    cap = request.time_budget if request.time_budget is not None else profile.time_budget
    if cap is None or profile.rounds:  # a budget that bounds a search in rounds is the search's own
        return _gate(request)
    clock.start(cap, on_overrun=lambda: _overran(request, cap))
    try:
        code = _gate(request)
        # the cap's raise, caught on its way and said as something else (a plug-in that "did not load")
        return _overran(request, cap) if clock.fired() else code
    except clock.CapReached:
        return _overran(request, cap)
    except BaseException:
        if clock.fired():
            return _overran(request, cap)
        raise
    finally:
        from vmfuzz.harness.engine.regression.base_code import removed
        removed(max(1.0, clock.left() + clock.grace(cap) / 2))  # the base's scratch, removed meanwhile
        clock.stop()


def _overran(request: RunRequest, cap: float) -> int:
    """The cap ended the gate mid-phase: could not check (exit 3), with reports saying where it stopped."""
    from vmfuzz.harness.engine.core import clock
    from vmfuzz.harness.model.verdict import Kind, Verdict
    from vmfuzz.harness.report.summary import Check, CommandSummary
    clock.settle()
    v = Verdict.of(Kind.COULD_NOT_CHECK, f"the time cap of {cap:g} s was reached "
                   f"{clock.current_phase() or 'before the gate ended'}; nothing after it ran (the cap counts "
                   f"from the gate's start to its exit)" + "".join(f"; {line}" for line in clock.cut_lines()))
    used = round(clock.elapsed(), 1)
    write_command_report(CommandSummary("gate", request.target, [Check("gate", "error", v.why, kind=v.kind.value)],
                                        headline=f"{v.headline}: {v.why}", outcome=v,
                                        extra={"time_cap": {"cap_seconds": float(cap), "used_seconds": used,
                                                            "reached": True}}), request.report_dir)
    print(f"time: used {used:.1f} s of a {cap:g} s cap (reached)")
    print(f"{v.headline}: {v.why}", flush=True)
    return v.exit_code


def _gate(request: RunRequest) -> int:
    # Nothing here imports SGLang before the change is known to touch the mask:
    # a docs-only change is a skip that costs seconds.
    from vmfuzz.harness.engine.core import clock
    from vmfuzz.harness.engine.campaign.surface import runs_sglang
    clock.phase("while finding what the change touches")
    sglang = runs_sglang(request.target)
    repo = request.repo or Path(".")
    try:
        changed, checkout = _changes(request.changed_files, request.base, repo)
        refused = None
    except UsageError as exc:
        changed, checkout, refused = None, None, exc
    vendored = vendored_checkout(checkout, changed) if sglang else None
    if request.repo is not None and sglang and vendored is None:
        sglang_checkout_at(request.repo, "gate")
    if refused is not None:
        raise refused
    hits = None
    if changed is not None:
        from vmfuzz.harness.engine.campaign.changes import touches_verify_mask
        from vmfuzz.harness.report.terminal import shown
        hits = touches_verify_mask(changed, checkout)
        if not hits:
            return _skip(request.target, changed, request.report_dir)
        print(f"vmfuzz gate: {len(hits)} changed file(s) touch verify-mask code: {', '.join(map(shown, hits[:5]))}"
              + (" ..." if len(hits) > 5 else ""))
    from vmfuzz.harness.engine.campaign.changes import sglang_checkout
    from vmfuzz.harness.engine.core.failures import ImportRaised
    sglang_root = (sglang_checkout(repo) or vendored) if sglang else None
    clock.phase("while importing the code under test")
    # started before this process imports the PR's SGLang: the base's import runs beside it
    on_base, known_found = _known_on_base(request, checkout) if sglang_root is not None else (None, [])
    from vmfuzz.harness.engine.campaign.watch import observe_imports
    try:
        # a changed module constant or class default runs once, at the import: observed, never assumed
        observe = partial(observe_imports, changed) if changed is not None and sglang else (lambda: None)
        if sglang_root is not None:
            _import_checkout(sglang_root, observe)
        else:
            observe()
        plan_, target = plan(request)
    except ImportRaised as exc:  # the code under review does not load: that is the finding
        _abandon(on_base)
        return import_finding(exc, "gate", request.target, request.report_dir)
    except (CannotLoad, OutOfStep) as exc:  # it cannot load here: could not check, with its reports
        _abandon(on_base)
        return load_failed(exc, "gate", request.target, request.report_dir)
    except BaseException:
        _abandon(on_base)
        raise
    if sglang:
        _say_code_under_test(sglang_root)
    watch = None
    if changed is not None:
        from vmfuzz.harness.engine.campaign.watch import GateWatch
        watch = GateWatch(request.target, changed, hits, checkout, sglang_root, traced=sglang)
    if on_base is not None:
        clock.phase("while the base replayed the known entries")
        try:
            # the watch's set-up (both sides of every triggered file parsed for the provoked rule) runs while
            # the base's process imports and replays: the search waits for the slower of the two, not both
            if watch is not None:
                watch.start()
            said = on_base.result()
        except BaseException:
            on_base.cancel()
            if watch is not None:
                watch.stop()
            raise
        if not said.failed:  # else the ranges the plan chose stand: the base is not the PR's to change
            plan_.known = tuple(said.excused(known_found, in_range=plan_.known))
        plan_.warnings = (*plan_.warnings, said.note(known_found))
    return execute_and_report(plan_, target, watch, verbose=request.verbose,
                              culprit=_culprit(request, checkout, sglang_root, plan_) if sglang else None)


def _abandon(on_base) -> None:
    """The code under test did not load: no base replay is waited for, and no import record is kept."""
    from vmfuzz.harness.engine.campaign.watch import drop_imports
    drop_imports()
    if on_base is not None:
        on_base.cancel()


def vendored_checkout(checkout, changed: list[str] | None) -> Path | None:
    """The SGLang checkout a changed path lies in when it sits inside the repository rather than at
    its root (``third_party/sglang/python/sglang/...``); None when no changed path is in one."""
    root = getattr(checkout, "root", None)
    for path in changed or ():
        head, sep, _ = path.rpartition("python/sglang/")
        if not sep or (head and not head.endswith("/")):
            continue
        try:
            if (Path(root) / head / "python" / "sglang" / "__init__.py").is_file():
                return (Path(root) / head).resolve() if head else Path(root).resolve()
        except (OSError, TypeError, ValueError):
            continue
    return None


def _known_on_base(request: RunRequest, checkout):
    """With a base and an SGLang checkout: every known entry, whatever its range, replayed on the base's
    code in a fresh process (``known_on_base``); the PR's version never picks what is excused.
    Without (no base, or a gate of the installed package, which no PR changes): (None, [])."""
    if checkout is None or not getattr(checkout, "base", None):
        return None, []
    from vmfuzz.harness.engine.regression.known import default_known_root, entries
    from vmfuzz.harness.engine.regression.known_on_base import start
    # only the entries of properties this gate searches: the others could excuse nothing here
    found = [(p, k) for p, k in entries(default_known_root(), *request.known)
             if k.repro.property in request.properties]
    if not found:
        return None, []
    return start(checkout.root, checkout.base, [p for p, _ in found]), found


def _culprit(request: RunRequest, checkout, sglang_root: Path | None, plan_):
    """With a base: the cases vmfuzz fell out of step on, asked of the base's code (``out_of_step_on_base``),
    so SGLang's own raise in the change is its finding, not vmfuzz's; a gate of the installed package
    (no checkout) has no base code to ask, and says so. Without a base: None, out of step as ever."""
    base = getattr(checkout, "base", None)
    if not base:
        return None
    from functools import partial
    from vmfuzz.harness.engine.regression.out_of_step_on_base import ask_base
    root = checkout.root if sglang_root is not None else None
    return partial(ask_base, checkout_root=root, base=base, spec=request.target, case_seconds=plan_.example_timeout)


def _changes(changed_files: Path | None, base: str | None, repo: Path):
    """(the changed paths, the checkout they are in); (None, None) when the gate was given no change."""
    from vmfuzz.harness.engine.campaign.change_paths import changed_from_file
    from vmfuzz.harness.engine.campaign.changes import ChangeError, changed_since, checkout_at
    try:
        if changed_files:
            checkout = checkout_at(repo)
            return changed_from_file(changed_files, checkout.root), checkout
        if base:
            return changed_since(base, repo)
    except ChangeError as exc:
        raise UsageError(f"vmfuzz gate: {exc}") from None
    return None, None


def _import_checkout(root: Path, before_import=lambda: None) -> None:
    """Loads the checkout's SGLang here (and, through the environment, in every worker),
    or refuses in one line: a gate must never pass on code other than the code under review.
    ``before_import()`` runs once the checkout is first on the path, before anything of it is imported."""
    from vmfuzz.harness.report.terminal import shown
    from vmfuzz.harness.targets import TargetUnavailable, resolve
    from vmfuzz.harness.targets.sglang.loader import import_from_checkout, imported_sglang
    python_dir = root / "python"
    refusal = f"vmfuzz gate: cannot test the SGLang checkout at {shown(str(root))}"
    try:
        import_from_checkout(python_dir)
    except ImportError as exc:  # another SGLang is already loaded here: the wrong setup, not the checkout
        raise UsageError(f"{refusal}: {shown(str(exc))}") from None
    before_import()
    try:
        # The bare target: a bad +VARIANT is the plan's error to report, not the checkout's.
        resolve("sglang")
        where = imported_sglang()[1]
    except (ImportError, TargetUnavailable) as exc:
        # The code under review does not load (a pin it sets that this environment misses is named
        # by the loader, as CannotLoad): could not check, and its reports say so. The install hint
        # that comes with an unavailable target does not help a checkout that breaks.
        why = (str(exc).splitlines() or [type(exc).__name__])[0].split("; install it with")[0]
        raise CannotLoad(f"the SGLang checkout at {shown(str(root))} does not import: {shown(why)}") from None
    if where.resolve() != (python_dir / "sglang").resolve():
        raise UsageError(f"{refusal}: sglang imports from {shown(str(where))}, not from its python/sglang")


def _say_code_under_test(root: Path | None) -> None:
    """Names the code the gate's verdict is about, so a gate that tested the wrong SGLang shows it."""
    from vmfuzz.harness.report.terminal import shown
    from vmfuzz.harness.targets.sglang.loader import imported_sglang
    version, where = imported_sglang()
    whose = f"the checkout at {shown(str(root))}" if root else "no SGLang checkout here, so the one on the path"
    print(f"vmfuzz gate: code under test: sglang {version} from {shown(str(where))} ({whose})", flush=True)


def _skip(spec: str, changed: list[str], report_dir: Path) -> int:
    from vmfuzz.harness.report.summary import Check, CommandSummary
    why = f"none of the {len(changed)} changed file(s) touches verify-mask code"
    print(f"vmfuzz gate: skipped: {why}")
    write_command_report(CommandSummary("gate", spec, [Check("gate", "skipped", why)],
                                        headline=f"skipped: {why}", extra={"changed": changed}), report_dir)
    return EXIT_OK
