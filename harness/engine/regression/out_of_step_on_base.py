"""The right culprit: a case vmfuzz fell out of step on, asked of the gate's base.

SGLang's own code raising while vmfuzz builds and captures a runner is out of
step (``SetUpRaised``): vmfuzz wires that set-up over stand-ins, so alone the
raise cannot be told from vmfuzz's gap. A gate with a base can tell them apart,
by OSS-Fuzz CIFuzz's rule (a PR's crash is new only if it does not reproduce on
the base): each case a search fell out of step on is run on the base's code
through the same property (a shared group's members together), in a fresh
process that imports the base's SGLang and nothing of the change's.

- The base runs the case (it holds, or fails as a property's check) and the
  change's out of step was SGLang's own raise: the raise is the change's, a
  finding of each property it stopped (origin ``raise``, never a property's
  catch), with its repro under ``findings/``.
- The base runs it, but the change's out of step was no raise of SGLang's own
  (a binding that no longer fits, a stand-in it lacks, a driver's count): still
  out of step; vmfuzz cannot drive what the change made, and says so.
- The base is out of step too, fails the case another way, or cannot be asked:
  still out of step (exit 3), the line saying which.

    python -m vmfuzz.harness.engine.regression.out_of_step_on_base BASE_PYTHON_DIR JOBS.json

(the child) prints one JSON line per job: its index and what the base's run came to.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

#: seconds the base's process may take to import its SGLang, beside each case's own timeout
IMPORT_SECONDS = 300.0
#: the least a case gets on the base: its runners built and captured afresh, then every batch replayed
CASE_SECONDS = 120.0
#: what the base's run of a case came to; "held" and "failed" (a property's check) mean the base runs it
RUNS = ("held", "failed")


@dataclass
class Answer:
    #: held / failed (a property's check) / out of step / fell (it raised, crashed or hung) / unasked
    status: str
    detail: str = ""
    seam: str = ""


def stuck_cases(results) -> list[tuple[object, list]]:
    """(the case, the results it left out of step) for each search that fell out of step on a case
    (a shared group's members once); a lost lane or a finding leaves nothing to ask."""
    by_members: dict[tuple, tuple[object, list]] = {}
    for r in results:
        if r.out_of_step and r.stuck is not None and not r.findings and not r.lane_lost:
            by_members.setdefault(r.stuck.members, (r.stuck, []))[1].append(r)
    return list(by_members.values())


def _say(line: str) -> None:
    print(line, flush=True)


def ask_base(outcome, checkout_root: Path | None, base: str, spec: str, *, case_seconds: float,
             say=_say) -> list[dict]:
    """Each stuck case of ``outcome`` asked of ``base`` (a fresh process on its code), and judged:
    its results turned into the change's findings or left out of step with the base's answer in
    their line. Returns one record per case for the gate's summary. ``checkout_root`` None: the
    gate tests no checkout, so no base code can be asked."""
    cases = stuck_cases(outcome.results)
    if not cases:
        return []
    if checkout_root is None:
        answers = [Answer("unasked", "the gate tests the installed SGLang, not a checkout")] * len(cases)
    else:
        say(f"vmfuzz gate: {len(cases)} case(s) vmfuzz fell out of step on: asking the base {base[:12]} "
            "whether it runs them (a fresh process on the base's code)")
        answers = _asked(cases, checkout_root, base, spec, max(case_seconds, CASE_SECONDS))
    records = []
    for (stuck, results), answer in zip(cases, answers):
        record, lines = _judged(outcome, stuck, results, answer, base)
        records.append(record)
        for line in lines:
            say(line)
    return records


def _judged(outcome, stuck, results, answer: Answer, base: str) -> tuple[dict, list[str]]:
    """The change's findings (the base runs the case and the change's was SGLang's own raise), or
    the base's answer added to each result's out-of-step line; (the summary's record, the lines said)."""
    from vmfuzz.harness.engine.search.search import record
    from vmfuzz.harness.model.origin import Origin
    sha = base[:12]
    names = [r.prop for r in results]
    if answer.status in RUNS and stuck.raised is not None:
        exc_type, frame, message = stuck.raised
        detail = (f"target raised {exc_type}: {message} in {stuck.seam or 'a runner set-up'} (at {frame}); "
                  f"the base {sha} builds and runs the same case: new with this change")
        said = []
        for r in results:
            origin = Origin(r.prop, "raise", stage="capture", exc_type=exc_type, frame=frame)
            r.finding = record(SimpleNamespace(name=outcome.target_name), origin, detail,
                               (stuck.config, stuck.batches), outcome.plan.seed, outcome.plan.findings_dir)
            r.out_of_step, r.stuck = None, None
            said += [f"  {r.prop:<22} FAILED: {detail}", f"      repro:   {r.finding.path}"]
        return ({"properties": names, "base": base, "base_said": answer.status, "verdict": "the change's raise",
                 "line": detail}, said)
    note = _note(stuck, answer, sha)
    for r in results:
        r.out_of_step = f"{r.out_of_step}; {note}"
    return ({"properties": names, "base": base, "base_said": answer.status, "verdict": "out of step", "line": note},
            [f"  {', '.join(names)}: still out of step: {note}"])


def _note(stuck, answer: Answer, sha: str) -> str:
    """Which way the case stays out of step, in the words of its line."""
    if answer.status == "out of step":
        same = answer.seam == stuck.seam
        return (f"the base {sha} is out of step on the same case too"
                + ("" if same else f" ({answer.detail[:300]})") + ": vmfuzz's to fix")
    if answer.status in RUNS:
        return (f"the base {sha} runs the same case, and this is no raise of SGLang's own: vmfuzz cannot "
                "drive what the change made (vmfuzz's to follow, not a finding)")
    if answer.status == "fell":
        return f"the base {sha} fails the same case another way ({answer.detail[:300]}), so it cannot say whose this is"
    return f"the base {sha} could not be asked ({answer.detail[:300]})"


def _asked(cases, checkout_root: Path, base: str, spec: str, case_seconds: float) -> list[Answer]:
    """The base's answer for each case, from one fresh process on its code; "unasked" where it gave none."""
    from vmfuzz.harness.engine.core import clock
    from vmfuzz.harness.engine.regression.base_code import remove_later, start_on_base
    from vmfuzz.harness.model.repro_file import dump, from_case
    if clock.reached():
        return [Answer("unasked", _cap_cut(base, len(cases)))] * len(cases)
    scratch = Path(tempfile.mkdtemp(prefix="vmfuzz-base-"))
    try:
        jobs = []
        for i, (stuck, _) in enumerate(cases):
            path = dump(from_case(spec, stuck.members[0], stuck.config, stuck.batches), scratch / f"case-{i}.json")
            jobs.append({"repro": str(path), "members": list(stuck.members)})
        (scratch / "jobs.json").write_text(json.dumps({"spec": spec, "seconds": case_seconds, "jobs": jobs}))
        proc, failed = start_on_base(checkout_root, base, scratch, __name__, [str(scratch / "jobs.json")])
        if proc is None:
            return [Answer("unasked", failed)] * len(cases)
        try:
            out, err = proc.communicate(timeout=clock.bounded(IMPORT_SECONDS + case_seconds * len(cases)))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err = (_cap_cut(base, len(cases)) if clock.reached()
                   else f"no answer within {IMPORT_SECONDS + case_seconds * len(cases):g}s")
        said = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        whole = next((d["failed"] for d in said if "failed" in d), None) or \
            (err.strip().splitlines() or [f"its process ended with exit {proc.returncode}"])[-1]
        by_job = {d["job"]: Answer(d["status"], d.get("detail", ""), d.get("seam", "")) for d in said if "job" in d}
        return [by_job.get(i, Answer("unasked", whole)) for i in range(len(cases))]
    finally:
        remove_later(scratch)


def _cap_cut(base: str, cases: int) -> str:
    """The base's answer the gate's time cap stopped, said as could not check (``clock.cut``)."""
    from vmfuzz.harness.engine.core import clock
    why = f"the gate's time cap of {clock.cap():g} s was reached before the base {base[:12]} answered"
    clock.cut(f"{why} on the {cases} case(s) vmfuzz fell out of step on")
    return why


def _child(python_dir: Path, jobs_file: Path) -> int:
    """In the fresh process: the base's SGLang imported from ``python_dir`` alone, each case run
    through its property (a shared group's members together) in a watched worker."""
    from vmfuzz.harness.engine.regression.base_code import load_base
    asked = json.loads(jobs_file.read_text())
    try:
        target = load_base(python_dir, asked["spec"])
    except Exception as exc:  # noqa: BLE001 - the base not loading: nothing can be asked, said why
        print(json.dumps({"failed": f"the base's SGLang does not load: {type(exc).__name__}: {exc}"[:300]}))
        return 0
    for i, job in enumerate(asked["jobs"]):
        print(json.dumps({"job": i, **_run_on_base(target, job, asked["seconds"])}), flush=True)
    return 0


def _run_on_base(target, job: dict, seconds: float) -> dict:
    """What one case came to on the base: held, failed (a property's check), out of step, or fell."""
    from vmfuzz.harness.engine.core.failures import raise_detail
    from vmfuzz.harness.engine.core.isolation import IsolatedChecker, TargetFault
    from vmfuzz.harness.model.errors import OutOfStep
    from vmfuzz.harness.model.repro_file import load, to_case
    from vmfuzz.harness.properties import PROPERTIES, PropertyFailure, shared_group
    config, batches = to_case(load(Path(job["repro"])))
    members = tuple(job["members"])
    prop = PROPERTIES[members[0]] if len(members) == 1 else shared_group(members)
    with IsolatedChecker(target, seconds) as check:
        try:
            check(prop, config, batches, "cpu")
        except PropertyFailure as exc:
            return {"status": "failed", "detail": exc.detail[:300]}
        except OutOfStep as exc:
            return {"status": "out of step", "detail": str(exc)[:300], "seam": exc.seam}
        except TargetFault as exc:
            return {"status": "fell", "detail": str(exc)[:300]}
        except Exception as exc:  # noqa: BLE001 - the base's own raise: it fell another way
            return {"status": "fell", "detail": raise_detail(exc)[:300]}
    return {"status": "held"}


if __name__ == "__main__":
    import warnings
    warnings.simplefilter("ignore")
    sys.exit(_child(Path(sys.argv[1]), Path(sys.argv[2])))
