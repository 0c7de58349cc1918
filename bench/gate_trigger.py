"""Benchmark: what the gate's trigger costs before any property runs.

Not a test: it prints seconds (median of ``--repeat`` runs).

    PYTHONPATH=. python bench/gate_trigger.py

- ``docs-only skip``: ``vmfuzz gate --changed-files`` on a docs-only change plus a
  source file that names no mask code, as a subprocess (what CI pays for a PR
  the gate skips; most of it is the CLI's torch import);
- ``trigger, 29 files``: ``vmfuzz.harness.engine.campaign.changes.triggers`` over every installed SGLang
  file that names verify-mask code, read from the installed package;
- ``grep, whole package``: ``vmfuzz.harness.engine.campaign.surface.grep_package`` (what ``vmfuzz
  surface`` and the gate's coverage summary read).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vmfuzz.harness.engine.campaign.changes import Checkout, installed_sglang, triggers  # noqa: E402
from vmfuzz.harness.engine.campaign.surface import grep_package  # noqa: E402


def timed(fn, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        listed = Path(tmp) / "changed.txt"
        listed.write_text("docs/advanced_features/speculative_decoding.md\nREADME.md\n"
                          "python/sglang/srt/layers/quantization/fp8.py\n")

        def skip():
            r = subprocess.run([sys.executable, "-m", "vmfuzz.harness.cli", "gate", "--changed-files", str(listed)],
                               cwd=ROOT, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
            assert r.returncode == 0 and "skipped" in r.stdout, r.stdout + r.stderr

        print(f"docs-only skip (subprocess)  {timed(skip, args.repeat):7.3f} s")
        pkg = installed_sglang()
        if pkg is None:
            print("no sglang installed: trigger and grep not measured")
            return
        files = grep_package(pkg)
        changed = [f"python/sglang/{rel}" for rel in files]
        empty = Path(tmp) / "empty"
        empty.mkdir()
        t = timed(lambda: triggers(changed, Checkout(root=empty), pkg), args.repeat)
        print(f"trigger, {len(files)} files            {t:7.3f} s")
        print(f"grep, whole package          {timed(lambda: grep_package(pkg), args.repeat):7.3f} s")


if __name__ == "__main__":
    main()
