"""Benchmark: how fast the harness finds each known-bad variant, against a naive search.

Not a test: it prints a table and writes JSON (default bench/results.json).

    PYTHONPATH=. python bench/bench.py                 # the full run (20 seeds, production range)
    PYTHONPATH=. python bench/bench.py --range small --json bench/results-small.json
    PYTHONPATH=. python bench/bench.py --seeds 3 --quick
    PYTHONPATH=. python bench/bench.py --catalogue sparse --quick --workers 2   # the sparse catalogue
    PYTHONPATH=. python bench/bench.py --guard-only 3                          # guard overhead, 3 runs

Detection. One example is one generated case (a config and 2..5 batches; one
in eight is a d = 1 config) on which *every* property is checked; detection is
the first example on which any property fails, so "examples to first detection"
counts test-function calls up to and including the failing one. Both searches
run the same checks over the same ranges (``RANGES[--range]``):

* harness: the campaign's boundary seed corpus (``campaign.boundary_cases``:
  both layouts at bs = max_bs and max_bs + 1, requests at the context limit),
  then Hypothesis with the harness's strategies (edge-weighted config numbers,
  the production corner, boundary-weighted batch sizes and sequence lengths,
  drawn and deepest draft trees, capacity transitions) and the campaign's
  phases (no ``Phase.target``: ``TARGETING``); ``--no-corpus`` measures the
  strategies alone;
* naive: ``random.Random(seed)``, every number uniform over the same range, no
  boundary weighting, no targeting, capped at ``--cap`` examples a seed (a miss
  counts at the cap).

Also measured: examples/s per property on 1 and 2 worker processes, the shadow
heap's guard overhead (guarded vs ``ShadowHeap(guard=False)`` verify calls), and
shrink time and final size of the harness's findings.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import torch
from hypothesis import HealthCheck, Phase, example, given, seed as hseed, settings, strategies as st
from hypothesis import target as hypothesis_target

from vmfuzz.harness.engine.search.cases import boundary_cases, cases
from vmfuzz.harness.engine.search.search import run_property
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.model.config import Batch, Config, num_candidates
from vmfuzz.harness.model.layouts import TreeMaskMode, logical_size
from vmfuzz.harness.properties import PROPERTIES
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.targets import CATALOGUE, resolve
from vmfuzz.harness.model.trees import draft

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sparse  # noqa: E402  (bench/sparse.py: the sparse catalogue)

# The range both searches draw from. ``production``: captured sizes up to 256,
# as CUDA-graph capture lists reach in real deployments (``--cuda-graph-max-bs``
# is commonly 8..256), eager batches up to 2 * max_bs + 8 = 520 requests; the
# per-request shape is kept small (context <= 16, d <= 4, topk <= 2,
# spec_steps <= 3) so one verify step stays at a few milliseconds (measured:
# median 2.5 ms, max ~10 ms on the development box). ``small``: the first
# benchmark's range (max_bs <= 32, context <= 64, d <= 8), where the boundary
# bugs are dense enough that uniform draws find them within a few cases.
RANGES = {
    "production": Bounds(max_bs=256, max_context_len=16, num_draft_tokens=4, topk=2, spec_steps=3, overshoot=8),
    "small": Bounds(max_bs=32, max_context_len=64, num_draft_tokens=8, topk=4, spec_steps=4, overshoot=8),
    # The sparse catalogue's range (bench/sparse.py): production draft shapes.
    "sparse": sparse.SPARSE_BOUNDS,
}
BENCH_BOUNDS = RANGES["production"]  # the default range
TRIVIAL_SHARE = 8  # one case in eight takes the d = 1 path
TARGETING = False  # as the campaign: Phase.target held searches on one config (PERFORMANCE.md)
# Cheap arithmetic checks first: the order changes time, never the verdict.
ORDER = ("capacity-soundness", "capacity-liveness", "no-oob-write", "fallback-equivalence",
         "reference-agreement", "multi-step-reuse")


def check_all(target, config: Config, steps: list[Batch]) -> float:
    """Every applicable property on one case; returns the overflow margin for targeting."""
    if config.trivial:
        return PROPERTIES["trivial-path"].check(target, config, steps).margin
    margin = float("-inf")
    for name in ORDER:
        prop = PROPERTIES[name]
        obs = prop.check(target, config, steps)
        margin = max(margin, obs.margin)
    return margin


def case_size(config: Config, steps: list[Batch]) -> dict:
    return {"max_bs": config.max_bs, "d": config.d, "max_context_len": config.max_context_len,
            "steps": len(steps), "max_batch": max(b.bs for b in steps),
            "cells": max(logical_size(config.mode, b.seq_lens, config.d) for b in steps)}


# -- the two searches -----------------------------------------------------------

def harness_search(target, seed: int, cap: int, corpus: bool = True, bounds: Bounds = BENCH_BOUNDS) -> dict:
    drafting = cases(PROPERTIES["multi-step-reuse"], bounds)
    trivial = cases(PROPERTIES["trivial-path"], bounds)

    @st.composite
    def any_case(draw):
        return draw(trivial if draw(st.integers(0, TRIVIAL_SHARE - 1)) == 0 else drafting)

    state = {"n": 0, "found_at": None, "t_found": None, "last": None}

    @settings(max_examples=cap, deadline=None, database=None, print_blob=False, report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.generate] + ([Phase.target] if TARGETING else []) + [Phase.shrink])
    @hseed(seed)
    @given(any_case())
    def search(case):
        config, steps = case
        if state["found_at"] is None:
            state["n"] += 1
        try:
            margin = check_all(target, config, steps)
        except Exception:
            if state["found_at"] is None:
                state["found_at"], state["t_found"] = state["n"], time.perf_counter() - start
            state["last"] = case
            raise
        hypothesis_target(margin, label="overflow margin (cells)")

    # The campaign's seed corpus, as ``run_property`` runs it: counted as examples.
    for case in reversed(boundary_cases(PROPERTIES["multi-step-reuse"], bounds) if corpus else []):
        search = example(case)(search)
    start = time.perf_counter()
    try:
        search()
    except Exception:
        pass
    total = time.perf_counter() - start
    if state["found_at"] is None:
        return {"found": False, "examples": state["n"], "seconds": total}
    return {"found": True, "examples": state["found_at"], "seconds": state["t_found"],
            "shrink_seconds": total - state["t_found"], "final": case_size(*state["last"])}


def naive_case(rng: random.Random, b: Bounds) -> tuple[Config, list[Batch]]:
    """Uniform over the harness's ranges, nothing weighted."""
    mode = rng.choice((TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY))
    is_read = True if mode == TreeMaskMode.FULL_MASK else rng.random() < 0.5
    max_bs, ctx = rng.randint(1, b.max_bs), rng.randint(1, b.max_context_len)
    if rng.randrange(TRIVIAL_SHARE) == 0:
        config = Config(mode, max_bs, ctx, 1, 1, 0, is_read)
        return config, [Batch(tuple(rng.randint(0, ctx) for _ in range(rng.randint(1, 2 * max_bs + b.overshoot))))]
    topk, steps = rng.randint(1, b.topk), rng.randint(1, b.spec_steps)
    d = rng.randint(2, min(b.num_draft_tokens, 1 + num_candidates(topk, steps)))
    config = Config(mode, max_bs, ctx, d, topk, steps, is_read)
    n = num_candidates(topk, steps)
    out = []
    for _ in range(rng.randint(2, 5)):
        bs = rng.randint(1, 2 * max_bs + b.overshoot)
        trees = None
        if rng.random() < 0.5:
            trees = tuple(draft(topk, steps, d, [rng.randint(0, 3) for _ in range(n)],
                                [rng.randint(0, 3) for _ in range(n)]) for _ in range(bs))
        out.append(Batch(tuple(rng.randint(0, ctx) for _ in range(bs)), trees))
    return config, out


def naive_search(target, seed: int, cap: int, budget_s: float, bounds: Bounds = BENCH_BOUNDS) -> dict:
    rng = random.Random(seed)
    start = time.perf_counter()
    for n in range(1, cap + 1):
        config, steps = naive_case(rng, bounds)
        try:
            check_all(target, config, steps)
        except Exception:
            return {"found": True, "examples": n, "seconds": time.perf_counter() - start}
        if time.perf_counter() - start > budget_s:
            # Stopped early for time: the count is a lower bound, reported as such, never as the cap.
            return {"found": False, "examples": n, "seconds": time.perf_counter() - start, "censored": True}
    return {"found": False, "examples": cap, "seconds": time.perf_counter() - start}


def sparse_naive_search(variant: str, target, seed: int, cap: int, budget_s: float, bounds: Bounds) -> dict:
    """``naive_search`` over ``sparse.naive_case``; cases the variant cannot fire on are not checked.

    Off its condition a sparse variant is the pristine target, which holds every
    property, so skipping those checks changes no count; every case that fires
    is checked for real, and only a failed check is a detection.
    """
    rng = random.Random(seed)
    v = sparse.SPARSE[variant]
    start, checked = time.perf_counter(), 0
    for n in range(1, cap + 1):
        case = sparse.naive_case(rng, bounds)
        if not v.fires(*case):
            continue
        checked += 1
        config, steps = sparse.materialize(case)
        try:
            check_all(target, config, steps)
        except Exception:
            return {"found": True, "examples": n, "seconds": time.perf_counter() - start, "checked": checked}
        if time.perf_counter() - start > budget_s:
            return {"found": False, "examples": n, "seconds": time.perf_counter() - start, "censored": True,
                    "checked": checked}
    return {"found": False, "examples": cap, "seconds": time.perf_counter() - start, "checked": checked}


def _target(variant: str, catalogue: str):
    if catalogue == "sparse":
        return sparse.SPARSE[variant].layer(resolve("reference"))
    return resolve(f"reference+{variant}")


def _detect_job(job):
    kind, variant, seed, cap, budget, corpus, range_name = job
    torch.set_num_threads(1)
    catalogue = "sparse" if range_name == "sparse" else "selftest"
    target, bounds = _target(variant, catalogue), RANGES[range_name]
    if kind == "harness":
        return kind, variant, seed, harness_search(target, seed, cap, corpus, bounds)
    if catalogue == "sparse":
        return kind, variant, seed, sparse_naive_search(variant, target, seed, cap, budget, bounds)
    return kind, variant, seed, naive_search(target, seed, cap, budget, bounds)


def summarize(runs: list[dict], cap: int) -> dict:
    ex = [r["examples"] if r["found"] else cap for r in runs]
    secs = [r["seconds"] for r in runs]
    return {"detected": sum(r["found"] for r in runs), "seeds": len(runs),
            "censored": sum(bool(r.get("censored")) for r in runs),
            "median_examples": statistics.median(ex), "max_examples": max(ex),
            "median_seconds": statistics.median(secs), "max_seconds": max(secs)}


# -- throughput and overhead ------------------------------------------------------

def _rate_job(job):
    prop, seed, n = job
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        r = run_property(resolve("reference"), PROPERTIES[prop], seed=seed, max_examples=n,
                         bounds=Bounds(), findings_dir=Path(tmp))
    return r.examples, r.seconds


def throughput(n: int) -> dict:
    out = {}
    for prop in PROPERTIES:
        ex, secs = _rate_job((prop, 0, n))
        t0 = time.perf_counter()
        with multiprocessing.get_context("fork").Pool(2) as pool:
            both = pool.map(_rate_job, [(prop, 1, n), (prop, 2, n)])
        wall = time.perf_counter() - t0
        out[prop] = {"1 worker": ex / secs, "2 workers": sum(e for e, _ in both) / wall}
    return out


GUARD_CASES = [
    (Config(TreeMaskMode.FULL_MASK, 8, 64, 8, 4, 4), Batch((64, 3, 0, 20, 64, 1, 5, 9))),
    (Config(TreeMaskMode.QLEN_ONLY, 8, 64, 8, 4, 4), Batch((64,) * 12)),
    (Config(TreeMaskMode.FULL_MASK, 32, 64, 8, 4, 4), Batch((64,) * 32)),  # 18K cells
    (Config(TreeMaskMode.QLEN_ONLY, 2, 8, 2, 1, 1), Batch((1, 2))),  # the smallest: guard cost is all overhead
    (Config(TreeMaskMode.FULL_MASK, 256, 64, 16, 8, 6), Batch((64,) * 257)),  # eager, past max_bs: fallback
]


def guard_overhead(rounds: int = 200) -> dict:
    """Guarded vs ``guard=False`` verify calls (allocate, verify, check, release), per case.

    Each round times one guarded and one unguarded call back to back, and the
    fastest of each over ``rounds`` is kept: on a host shared with other
    processes any single call can be preempted, and the minimum is the cost of
    the call itself, for both sides alike.
    """
    target = resolve("reference")

    def once(guard: bool, config, batch) -> float:
        t0 = time.perf_counter()
        heap = ShadowHeap("cpu", guard=guard)
        mask = target.allocate(config, heap)
        target.verify(mask, config, batch, heap)
        heap.check()
        del mask
        heap.release()
        return time.perf_counter() - t0

    cases = []
    for config, batch in GUARD_CASES:
        n = max(20, rounds // (1 + logical_size(config.mode, batch.seq_lens, config.d) // 50000))
        g = u = float("inf")
        for _ in range(n):
            g, u = min(g, once(True, config, batch)), min(u, once(False, config, batch))
        cases.append({"case": f"{config.mode.name} max_bs {config.max_bs} d {config.d} bs {batch.bs}",
                      "guarded_ms": 1e3 * g, "unguarded_ms": 1e3 * u, "ratio": g / u, "rounds": n})
    return {"cases": cases, "max_ratio": max(c["ratio"] for c in cases)}


def _print_guard(over: dict) -> None:
    print("guard overhead (guarded / unguarded verify call incl. allocate, check, release):")
    for c in over["cases"]:
        print(f"  {c['case']:<40} {c['guarded_ms']:8.3f} ms vs {c['unguarded_ms']:8.3f} ms = {c['ratio']:.2f}x")
    print(f"  worst {over['max_ratio']:.2f}x ({'<=' if over['max_ratio'] <= 1.3 else '>'} 1.3x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--cap", type=int, default=10_000, help="naive examples a seed (a miss counts here)")
    ap.add_argument("--harness-cap", type=int, default=1000)
    ap.add_argument("--naive-budget", type=float, default=600.0,
                    help="seconds a naive seed may run before it is stopped (reported as censored)")
    ap.add_argument("--rate-examples", type=int, default=300)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default="bench/results.json")
    ap.add_argument("--quick", action="store_true", help="skip throughput and overhead")
    ap.add_argument("--guard-only", type=int, metavar="RUNS", default=0,
                    help="only measure the guard overhead, RUNS times in a row")
    ap.add_argument("--no-corpus", action="store_true", help="harness strategies without the boundary seed corpus")
    ap.add_argument("--range", choices=sorted(RANGES), default="production",
                    help="the range both searches draw from (default production: max_bs <= 256)")
    ap.add_argument("--catalogue", choices=("selftest", "sparse"), default="selftest",
                    help="sparse: bench/sparse.py's rare bugs over their own range (implies --range sparse)")
    ap.add_argument("--hit-cases", type=int, default=100_000,
                    help="uniform cases drawn to measure each sparse variant's hit rate")
    ap.add_argument("--variant", action="append", dest="variants", metavar="NAME", help="only these variants")
    ap.add_argument("--naive-from", metavar="JSON",
                    help="reuse the naive runs of an earlier results file (same range, seeds and cap) "
                         "instead of re-running them, e.g. for a --no-corpus harness run")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.guard_only:
        runs = []
        for i in range(args.guard_only):
            print(f"run {i + 1} of {args.guard_only}")
            runs.append(guard_overhead())
            _print_guard(runs[-1])
        print(f"worst over {len(runs)} runs: {max(r['max_ratio'] for r in runs):.2f}x")
        return
    if args.catalogue == "sparse":
        args.range = "sparse"
    bounds = RANGES[args.range]
    names = list(sparse.SPARSE if args.catalogue == "sparse" else CATALOGUE)
    if args.variants:
        names = [n for n in names if n in args.variants]
    rates = {}
    if args.catalogue == "sparse":
        rates = sparse.hit_rates(args.hit_cases, seed=12345, bounds=bounds)

    reused: dict = {}
    if args.naive_from:
        prev = msgspec.json.decode(Path(args.naive_from).read_bytes())
        if (prev["bounds"] != dataclasses.asdict(bounds) or prev["seeds"] != args.seeds
                or prev["naive_cap"] != args.cap):
            raise SystemExit(f"{args.naive_from}: different range, seeds or cap; cannot reuse its naive runs")
        reused = {v: row["runs"]["naive"] for v, row in prev["detection"].items()}
    kinds = ("harness",) if reused else ("harness", "naive")
    jobs = [(kind, v, seed, args.cap if kind == "naive" else args.harness_cap, args.naive_budget,
             not args.no_corpus, args.range)
            for v in names for kind in kinds for seed in range(args.seeds)]
    t0 = time.perf_counter()
    results = []
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        for kind, variant, seed, r in pool.imap_unordered(_detect_job, jobs, chunksize=1):
            results.append((kind, variant, seed, r))
            print(f"  [{len(results)}/{len(jobs)} {time.perf_counter() - t0:5.0f}s] {kind} {variant} seed {seed}: "
                  f"{'found' if r['found'] else 'MISS'} at {r['examples']} examples, {r['seconds']:.1f}s"
                  f"{' (censored)' if r.get('censored') else ''}", flush=True)
    detection_wall = time.perf_counter() - t0
    runs: dict = {}
    for kind, variant, seed, r in sorted(results, key=lambda x: (names.index(x[1]), x[0], x[2])):
        runs.setdefault(variant, {}).setdefault(kind, []).append(dict(r, seed=seed))
    for variant, naive_runs in reused.items():
        runs.setdefault(variant, {})["naive"] = naive_runs

    rows, ratios = {}, []
    print(f"detection over {args.seeds} seeds ({args.range} range: {bounds}); naive capped at {args.cap}"
          f"{' (naive runs reused from ' + args.naive_from + ')' if reused else ''}"
          f"{'; harness without the corpus' if args.no_corpus else ''}")
    print(f"{'variant':<20} {'harness det':>11} {'med ex':>7} {'max ex':>7} {'med s':>7} "
          f"{'naive det':>9} {'med ex':>7} {'max ex':>7} {'med s':>7} {'ratio':>7}"
          + (f" {'uniform hit rate':>17}" if rates else ""))
    for variant, by in runs.items():
        h, n = summarize(by["harness"], args.harness_cap), summarize(by["naive"], args.cap)
        ratio = n["median_examples"] / h["median_examples"]
        ratios.append(ratio)
        shrink = [r for r in by["harness"] if r["found"]]
        rows[variant] = {"harness": h, "naive": n, "ratio": ratio,
                         "shrink_seconds_median": statistics.median(r["shrink_seconds"] for r in shrink)
                         if shrink else None,
                         "final_cases": [r["final"] for r in shrink], "runs": by}
        cens = f" ({n['censored']} censored)" if n["censored"] else ""
        print(f"{variant:<20} {h['detected']:>5}/{h['seeds']:<5} {h['median_examples']:>7} {h['max_examples']:>7} "
              f"{h['median_seconds']:>7.2f} {n['detected']:>3}/{n['seeds']:<5} {n['median_examples']:>7} "
              f"{n['max_examples']:>7} {n['median_seconds']:>7.2f} {ratio:>7.1f}"
              + (f" {rates[variant]['rate']:>9.2e} per case" if rates else "") + cens)
        if rates:
            rows[variant]["uniform_hit_rate"] = rates[variant]
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"geometric mean of naive/harness median examples: {geomean:.2f}  "
          f"(detection wall time {detection_wall:.0f}s on {args.workers} workers"
          f"{', naive side reused' if reused else ''})")
    print("shrinking (harness findings): median seconds, median final case")
    for variant, row in rows.items():
        finals = row["final_cases"]
        if finals:
            mid = sorted(finals, key=lambda f: (f["cells"], f["max_batch"]))[len(finals) // 2]
            print(f"  {variant:<20} {row['shrink_seconds_median']:6.2f}s  {mid}")

    if rates:
        worst = max(r["harness"]["median_examples"] for r in rows.values())
        print(f"harness median <= 50 on every variant: {'yes' if worst <= 50 else 'NO'} (worst {worst}); "
              f"every variant 20/20: {'yes' if all(r['harness']['detected'] == r['harness']['seeds'] for r in rows.values()) else 'NO'}; "
              f"geometric mean >= 10: {'yes' if geomean >= 10 else 'NO'}")
    out = {"catalogue": args.catalogue, "range": args.range, "bounds": dataclasses.asdict(bounds), "naive_from": args.naive_from,
           "seeds": args.seeds, "naive_cap": args.cap, "naive_budget_seconds": args.naive_budget,
           "harness_cap": args.harness_cap, "corpus": not args.no_corpus, "detection": rows, "geomean_ratio": geomean,
           "detection_wall_seconds": detection_wall}
    if not args.quick:
        rates = throughput(args.rate_examples)
        print(f"examples/s on reference (Bounds() defaults, {args.rate_examples} examples, Hypothesis):")
        for prop, r in rates.items():
            print(f"  {prop:<22} 1 worker {r['1 worker']:7.1f}   2 workers {r['2 workers']:7.1f}")
        over = guard_overhead()
        _print_guard(over)
        out.update(throughput=rates, guard_overhead=over)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_bytes(msgspec.json.format(msgspec.json.encode(out), indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
