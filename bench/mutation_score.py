"""A mutation score of the gate over the SGLang files it drives (cosmic-ray's standard operators).

    python bench/mutation_score.py prepare WORK --count 100 --seed S --workers 2 [--timeout 600] [--sglang-tests PATH]
    python bench/mutation_score.py exec WORK        # runs what is pending; rerun to resume
    python bench/mutation_score.py widen WORK       # a wider search on each suspected-equivalent (resumes)
    python bench/mutation_score.py all WORK --count 100 --seed S   # prepare, exec, widen, report
    python bench/mutation_score.py report WORK      # WORK/score.md, WORK/score.json, WORK/survivors.md
    python bench/mutation_score.py stillborn WORK   # a finished run's raising kernel mutants judged by Triton's compiler, then report
    python bench/mutation_score.py sglang-tests WORK --sglang-tests PATH   # only that column, gates not rerun

``prepare`` asks ``vmfuzz surface --target sglang`` which files are driven and by
which properties, builds one copy of the installed SGLang per worker (a folder laid
out like an SGLang checkout; every file a symlink except the driven ones, which
cosmic-ray rewrites in place: the venv's own files are never touched), runs
``cosmic-ray init`` over the driven files, and marks every work item outside a
seeded sample of N as skipped. ``exec`` starts one cosmic-ray http-worker per copy
and runs the session through cosmic-ray's http distributor; more machines join
by running ``cosmic-ray http-worker`` in their own copy and being listed in
WORK/cosmic-ray.toml's worker-urls. Each mutant's test command is
bench/mutation_kill.py: the gate, restricted to the properties that drive the
mutated file; what a survivor's gate handed its checks is then compared with the
pristine code's, both recorded by the gate during its run (bench/mutation_equiv.py),
and, with ``--sglang-tests PATH``, SGLang's own unit tests from that checkout judge the same mutant (bench/sglang_tests.py); ``sglang-tests``
fills that column alone for the mutants an earlier ``exec`` ran. ``widen`` searches wider than the
gate on each mutant whose outputs were identical on the gate's examples, and only then calls it
equivalent (bench/mutation_wide.py). ``report`` tabulates killed / survived / timed-out / out-of-step /
error / suspected-equivalent per file and per operator, and writes the
survivors' diffs (bench/mutation_table.py).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

HERE = Path(__file__).resolve().parent
HARNESS_ROOT = HERE.parent
sys.path.insert(0, str(HERE))
BASE_PORT = 9876

import mutation_nightly  # noqa: E402
import mutation_wide  # noqa: E402
import sglang_tests as judge  # noqa: E402
import stillborn  # noqa: E402
from mutation_copy import commit_pristine, mirror, mutant_written, pristine_copy, written_diff  # noqa: E402
from mutation_table import report  # noqa: E402


def driven_files() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """sglang-relative file -> the properties that drive it, and file -> its driven functions
    ("" for a whole file), as ``vmfuzz surface`` reports them."""
    env = dict(os.environ, PYTHONPATH=str(HARNESS_ROOT))
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "vmfuzz", "surface", "--target", "sglang",
                           "--json", "--report-dir", tempfile.mkdtemp(prefix="vmfuzz-surface-")],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"mutation_score: vmfuzz surface failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    files: dict[str, set[str]] = {}
    functions: dict[str, set[str]] = {}
    for row in json.loads(proc.stdout)["rows"]:
        if row["driven"] and row["file"].endswith(".py"):
            files.setdefault(row["file"], set()).update(row["driven_by"])
            functions.setdefault(row["file"], set()).add(row["function"] or "")
    return ({f: sorted(p) for f, p in sorted(files.items())}, {f: sorted(n) for f, n in functions.items()})


def driven_lines(source: str, names: list[str]) -> list[tuple[int, int]] | None:
    """The line ranges of the named functions and classes (``Class.method``); None: the whole file."""
    if "" in names:
        return None
    ranges = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = prefix + child.name
                if qual in names:
                    ranges.append((child.lineno, child.end_lineno))
                walk(child, qual + ".")
    walk(ast.parse(source), "")
    return ranges


def write_config(work: Path, files: list[str], workers: int, timeout: float, port: int) -> Path:
    urls = ", ".join(f"'http://localhost:{port + k}'" for k in range(workers))
    modules = ", ".join(f"'python/sglang/{f}'" for f in files)
    kill = f"{sys.executable} {HERE / 'mutation_kill.py'} {work / 'driven.json'}"
    cfg = work / "cosmic-ray.toml"
    cfg.write_text(f"""[cosmic-ray]
module-path = [{modules}]
timeout = {timeout}
excluded-modules = []
test-command = "{kill}"

[cosmic-ray.distributor]
name = "http"

[cosmic-ray.distributor.http]
worker-urls = [{urls}]
""")
    return cfg


def cosmic_ray(*args: str, cwd: Path, **kw):
    return subprocess.run([sys.executable, "-m", "cosmic_ray.cli", *args], cwd=cwd, **kw)


def in_scope(item, package: Path, functions: dict[str, list[str]], cache: dict) -> bool:
    """Whether a work item's mutation lies in a function the harness drives (``--scope functions``)."""
    m = item.mutations[0]
    rel = str(m.module_path).removeprefix("python/sglang/")
    if rel not in cache:
        cache[rel] = driven_lines((package / rel).read_text(), functions[rel])
    ranges = cache[rel]
    return ranges is None or any(lo <= m.start_pos[0] <= hi for lo, hi in ranges)


def mutation_key(item) -> tuple:
    """What a work item's mutation is (file, place, operator, occurrence): cosmic-ray's job ids are
    random per ``init``, so a sample drawn in their order differed between runs of one seed."""
    m = item.mutations[0]
    return (str(m.module_path), tuple(m.start_pos), tuple(m.end_pos), m.operator_name, m.occurrence)


def sample_jobs(pool: list, seed: int, sample: int) -> set[str]:
    """The job ids of ``sample`` items of ``pool``, the same mutations for the same seed and pool."""
    ordered = sorted(pool, key=mutation_key)
    return {item.job_id for item in random.Random(seed).sample(ordered, min(sample, len(ordered)))}


def baselines(work: Path, files: dict[str, list[str]], sglang_tests: Path | None) -> None:
    """Given an SGLang checkout, which of its tests each driven file has that pass unmutated. (What a
    survivor's outputs are compared with is recorded by the pristine gate itself, the first time a
    survivor needs it: bench/mutation_equiv.py.)"""
    copy = work / "worker-0"
    if sglang_tests is not None:
        driven = json.loads((work / "driven.json").read_text())
        driven["sglang_tests"] = judge.select(sglang_tests, list(files), copy)
        (work / "driven.json").write_text(json.dumps(driven, indent=1))
        kept = sum(map(len, driven["sglang_tests"].values()))
        print(f"mutation_score: {kept} SGLang test file(s) import a driven file and pass unmutated")


def prepare(work: Path, sample: int, seed: int, workers: int, timeout: float, scope: str, port: int,
            sglang_tests: Path | None = None) -> None:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    if work.exists():
        sys.exit(f"mutation_score: {work} exists; pick a new folder (nothing found there is overwritten)")
    work.mkdir(parents=True)
    files, functions = driven_files()
    package = Path(find_spec("sglang").origin).parent
    (work / "driven.json").write_text(json.dumps({"package": str(package), "files": files}, indent=1))
    for k in range(workers):
        mirror(package, work / f"worker-{k}" / "python" / "sglang", {Path(f) for f in files})
        commit_pristine(work / f"worker-{k}")
    cfg = write_config(work, list(files), workers, timeout, port)
    baselines(work, files, sglang_tests)
    cosmic_ray("init", str(cfg), str(work / "session.sqlite"), cwd=work / "worker-0", check=True)
    with use_db(str(work / "session.sqlite"), WorkDB.Mode.open) as db:
        items = list(db.work_items)
        ids = sorted(item.job_id for item in items)
        cache: dict = {}
        pool = [item for item in items if scope == "files" or in_scope(item, package, functions, cache)]
        chosen = sample_jobs(pool, seed, sample)
        db.set_multiple_results([i for i in ids if i not in chosen],
                                WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="not sampled"))
    (work / "plan.json").write_text(json.dumps({"sample": len(chosen), "of": len(ids), "in_scope": len(pool),
                                                "scope": scope, "seed": seed,
                                                "workers": workers, "timeout": timeout, "port": port}))
    print(f"mutation_score: {len(files)} driven files, {len(ids)} mutants, {len(pool)} in scope ({scope}), {len(chosen)} sampled (seed {seed}); "
          f"{workers} worker copies under {work}")


def execute(work: Path) -> None:
    plan = json.loads((work / "plan.json").read_text())
    procs = []
    try:
        for k in range(plan["workers"]):
            log = open(work / f"worker-{k}.log", "ab")
            # its own session: the finally below stops the worker and its gate, nothing else
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "cosmic_ray.cli", "http-worker", "--port", str(plan["port"] + k)],
                cwd=work / f"worker-{k}", stdout=log, stderr=log, start_new_session=True))
        time.sleep(3)  # the workers' servers listen before the distributor's first request
        start = time.monotonic()
        cosmic_ray("exec", str(work / "cosmic-ray.toml"), str(work / "session.sqlite"), cwd=work / "worker-0",
                   check=True)
        print(f"mutation_score: exec took {time.monotonic() - start:.0f}s")
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait()


def rejudge(work: Path, tests: Path) -> dict[str, str]:
    """SGLang's tests on mutants an earlier exec already ran, the gates left alone: the tests are chosen
    on worker-0's copy, each run mutant is written into that copy again (cosmic-ray's own operator and
    occurrence), judged and put back. Verdicts go to WORK/sglang_tests.json after each mutant (a rerun
    with the same checkout and choice resumes); ``report`` reads them over the exec's own lines."""
    import resource

    from cosmic_ray.work_db import WorkDB, use_db

    copy, driven = pristine_copy(work)
    start, cpu = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    chosen = judge.select(tests, list(driven["files"]), copy)
    driven["sglang_tests"] = chosen
    (work / "driven.json").write_text(json.dumps(driven, indent=1))
    out = work / "sglang_tests.json"
    state = {"checkout": str(tests), "selected": chosen, "verdicts": {}}
    if out.exists() and {k: v for k, v in json.loads(out.read_text()).items() if k != "verdicts"} == \
            {k: v for k, v in state.items() if k != "verdicts"}:
        state["verdicts"] = json.loads(out.read_text())["verdicts"]
    print(f"mutation_score: {len({t for ts in chosen.values() for t in ts})} SGLang test(s) import a driven file "
          f"and pass unmutated")
    with use_db(str(work / "session.sqlite"), WorkDB.Mode.open) as db:
        items = [item for item, result in db.completed_work_items if result.worker_outcome != "skipped"]
    for item in items:
        if item.job_id in state["verdicts"]:
            continue
        rel = str(item.mutations[0].module_path).removeprefix("python/sglang/")
        with mutant_written(copy, item) as applied:
            state["verdicts"][item.job_id] = (judge.verdict(chosen, [rel], copy) if applied
                                              else "error: cosmic-ray could not apply this mutant again")
        out.write_text(json.dumps(state, indent=1))
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"mutation_score: SGLang's tests over {len(items)} mutants took {time.monotonic() - start:.0f}s wall, "
          f"{use.ru_utime + use.ru_stime - cpu.ru_utime - cpu.ru_stime:.0f} CPU s (user+sys)")
    return state["verdicts"]


def rerun(work: Path, outcomes: set[str]) -> int:
    """The kill command again, with this harness, on the mutants whose last verdict is in ``outcomes``
    (score.json's): after a fix, the survivors are rescored without re-running the sample. Each is
    written into worker-0's copy (cosmic-ray's own operator and occurrence) and put back; its new
    output replaces the old in the session, so ``report`` tabulates it."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    copy, driven = pristine_copy(work)
    jobs = {r["job"] for r in json.loads((work / "score.json").read_text())["mutants"] if r["outcome"] in outcomes}
    shutil.rmtree(work / "pristine-gate", ignore_errors=True)  # the equivalence baseline of this harness
    with use_db(str(work / "session.sqlite"), WorkDB.Mode.open) as db:
        items = [(item, result) for item, result in db.completed_work_items if item.job_id in jobs]
        for item, old in items:
            with mutant_written(copy, item) as applied:
                if not applied:
                    continue
                proc = subprocess.run([sys.executable, str(HERE / "mutation_kill.py"), str(work / "driven.json")],
                                      cwd=copy, capture_output=True, text=True)
                diff = old.diff or written_diff(copy, item, Path(driven["package"]))
            db.set_result(item.job_id, WorkResult(
                worker_outcome=WorkerOutcome.NORMAL, output=proc.stdout + proc.stderr, diff=diff,
                test_outcome=TestOutcome.KILLED if proc.returncode else TestOutcome.SURVIVED))
            print(f"mutation_score: {item.job_id} {(proc.stdout.splitlines() or ['no output'])[0]}", flush=True)
    return len(items)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mutation_score.py")
    ap.add_argument("step", choices=["prepare", "exec", "report", "stillborn", "all", "sglang-tests", "nightly",
                                     "rerun", "widen"])
    ap.add_argument("work", type=Path)
    ap.add_argument("--count", "--sample", dest="sample", type=int, default=100,
                    help="how many mutants the sample draws (--sample is the older name)")
    ap.add_argument("--seed", type=int, default=1, help="the sample's seed (nightly: the search's, and its draw)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one mutant's gate may take")
    ap.add_argument("--port", type=int, default=BASE_PORT, help="the first worker's port (one a worker)")
    ap.add_argument("--scope", choices=["functions", "files"], default="functions",
                    help="sample mutants inside the functions vmfuzz surface lists as driven (default), "
                         "or anywhere in the driven files")
    ap.add_argument("--sglang-tests", type=Path, metavar="PATH",
                    help="an SGLang checkout (or its test/ folder) whose own unit tests judge the same mutants, "
                         "side by side with the gate; never copied here")
    ap.add_argument("--budget", type=float, default=600.0,
                    help="nightly: seconds of `vmfuzz run --profile nightly` a mutant gets")
    ap.add_argument("--mutants", choices=["survived", "non-equivalent", "never-ran"], default="survived",
                    help="nightly: the gate's survivors (default), every killed and surviving mutant, or the "
                         "suspected-equivalents whose mutated line the gate never reached")
    ap.add_argument("--limit", type=int, default=None, help="nightly: at most this many of them, drawn with --seed")
    ap.add_argument("--outcomes", default="survived",
                    help="rerun: the verdicts (score.json's, comma-separated) whose mutants are scored again")
    ap.add_argument("--first-finding", action="store_true",
                    help="nightly: stop each mutant's run at its first saved finding (a kill costs its time to "
                         "that finding, not the whole budget)")
    ap.add_argument("--wide-seed", type=int, default=mutation_wide.WIDE_SEED,
                    help="widen: the wider search's seed (the gate never uses it)")
    ap.add_argument("--wide-examples", type=int, default=mutation_wide.WIDE_EXAMPLES,
                    help="widen: examples a property in the wider search")
    ap.add_argument("--wide-bounds", default=mutation_wide.WIDE_BOUNDS, help="widen: the wider search's case bounds")
    args = ap.parse_args(argv)
    work = args.work.resolve()
    if args.sample < 1 or args.wide_examples < 1:
        sys.exit("mutation_score: --count and --wide-examples must be at least 1")
    if args.sglang_tests is not None and not args.sglang_tests.is_dir():
        sys.exit(f"mutation_score: --sglang-tests {args.sglang_tests}: not a directory")
    if args.step == "sglang-tests":
        if args.sglang_tests is None:
            sys.exit("mutation_score: sglang-tests needs --sglang-tests PATH (an SGLang checkout or its test/ folder)")
        if not (work / "session.sqlite").is_file():
            sys.exit(f"mutation_score: {work}: no session.sqlite (run prepare and exec first)")
        rejudge(work, args.sglang_tests.resolve())
    if args.step == "nightly":
        if not (work / "score.json").is_file():
            sys.exit(f"mutation_score: {work}: no score.json (run exec and report first)")
        if not 0 < args.budget < float("inf"):  # nan and inf too: a budget is a number of seconds
            sys.exit(f"mutation_score: --budget {args.budget:g}: must be a positive number of seconds")
        if args.limit is not None and args.limit < 1:
            sys.exit(f"mutation_score: --limit {args.limit}: must be at least 1")
        mutation_nightly.rejudge(work, args.budget, args.seed, args.mutants, args.limit, args.first_finding)
    if args.step in ("prepare", "all"):
        prepare(work, args.sample, args.seed, args.workers, args.timeout, args.scope, args.port,
                args.sglang_tests.resolve() if args.sglang_tests else None)
    if args.step in ("exec", "all"):
        execute(work)
    if args.step in ("widen", "all"):
        if not (work / "session.sqlite").is_file():
            sys.exit(f"mutation_score: {work}: no session.sqlite (run prepare and exec first)")
        print(f"mutation_score: {mutation_wide.rejudge(work, args.wide_seed, args.wide_examples, args.wide_bounds)} "
              "mutant(s) searched wider")
    if args.step == "stillborn":
        print(f"mutation_score: {stillborn.rescore(work)} kill(s) by raising in a Triton kernel judged by its compiler")
    if args.step == "rerun":
        if not (work / "score.json").is_file():
            sys.exit(f"mutation_score: {work}: no score.json (run exec and report first)")
        print(f"mutation_score: {rerun(work, set(args.outcomes.split(',')))} mutant(s) scored again")
    if args.step in ("report", "stillborn", "all", "sglang-tests", "nightly", "rerun", "widen"):
        report(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
