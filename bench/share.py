"""Shared runs vs one search per property, on a target, side by side in one invocation.

    PYTHONPATH=. python bench/share.py --target sglang --before /tmp/before --examples 30

``--before DIR`` is a checkout of the commit to compare with (e.g.
``git archive <rev> | tar -x -C DIR``); without it the comparison is this tree
with ``share=False``. Each side runs in its own subprocess (fresh imports,
same seed, same per-property example budget, in-process: no isolation), and
the sides alternate ``--repeats`` times so load from other processes on the
host falls on both. Counted: property-examples (the sum over properties of
examples judged), wall seconds of the campaign, kernel launches and the
seconds inside them (the target's ``kernel`` seam, wrapped in the child).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, tempfile, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from vmfuzz.harness.targets import resolve
from vmfuzz.harness.engine.search.search import run_campaign
from vmfuzz.harness.model.bounds import Bounds
target_spec, seed, examples, share = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
target = resolve(target_spec)
cls = type(target)
stats = {"launches": 0, "kernel_seconds": 0.0}
original = cls.kernel
def counted(self, call):
    t0 = time.perf_counter()
    try:
        return original(self, call)
    finally:
        stats["launches"] += 1
        stats["kernel_seconds"] += time.perf_counter() - t0
cls.kernel = counted
bounds = getattr(target, "bounds", None) or Bounds()
kw = {}
import inspect
if "share" in inspect.signature(run_campaign).parameters:
    kw["share"] = share
with tempfile.TemporaryDirectory() as tmp:
    t0 = time.perf_counter()
    results = run_campaign(target, seed=seed, max_examples=examples, bounds=bounds, findings_dir=Path(tmp), **kw)
    wall = time.perf_counter() - t0
print("RESULT " + json.dumps({"wall": wall, **stats, "examples": {r.prop: r.examples for r in results},
                              "findings": [f.prop for r in results for f in r.findings]}))
"""


def run_side(tree: Path, target: str, seed: int, examples: int, share: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", CHILD, target, str(seed), str(examples), "1" if share else "0"],
                         cwd=tree, env=env, capture_output=True, text=True, timeout=3000)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{tree}: no result\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="sglang")
    ap.add_argument("--before", default=None, help="checkout to compare with (default: this tree, share off)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--examples", type=int, default=30, help="examples per property (per shared group)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    before = (Path(args.before), True) if args.before else (ROOT, False)
    sides = {"before": before, "after": (ROOT, True)}
    if args.before:  # also this tree with sharing off: what sharing alone changes
        sides = {"before": before, "no-share": (ROOT, False), "after": (ROOT, True)}
    runs: dict[str, list] = {k: [] for k in sides}
    for i in range(args.repeats):
        for name, (tree, share) in sides.items():
            r = run_side(tree, args.target, args.seed, args.examples, share)
            runs[name].append(r)
            pe = sum(r["examples"].values())
            print(f"[{i + 1}/{args.repeats}] {name:<6} {pe:5d} property-examples in {r['wall']:7.1f}s = "
                  f"{pe / r['wall']:6.2f}/s; {r['launches']} launches ({r['launches'] / pe:.2f} per property-example), "
                  f"{r['kernel_seconds']:.1f}s in the kernel ({100 * r['kernel_seconds'] / r['wall']:.0f}% of the wall)"
                  + (f"; findings {r['findings']}" if r["findings"] else ""), flush=True)
    summary = {}
    for name, rs in runs.items():
        rate = statistics.median(sum(r["examples"].values()) / r["wall"] for r in rs)
        per = statistics.median(r["launches"] / sum(r["examples"].values()) for r in rs)
        share = statistics.median(r["kernel_seconds"] / r["wall"] for r in rs)
        summary[name] = {"property_examples_per_s": rate, "launches_per_property_example": per,
                         "kernel_share_of_wall": share, "runs": rs}
    gain = summary["after"]["property_examples_per_s"] / summary["before"]["property_examples_per_s"]
    print(f"property-examples/s: before {summary['before']['property_examples_per_s']:.2f}, "
          f"after {summary['after']['property_examples_per_s']:.2f} = {gain:.2f}x; launches per property-example "
          f"{summary['before']['launches_per_property_example']:.2f} -> "
          f"{summary['after']['launches_per_property_example']:.2f}; kernel share of the wall "
          f"{100 * summary['before']['kernel_share_of_wall']:.0f}% -> {100 * summary['after']['kernel_share_of_wall']:.0f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({"target": args.target, "seed": args.seed, "examples": args.examples,
                                               "before": str(before[0]), "gain": gain, **summary}, indent=1))


if __name__ == "__main__":
    main()
