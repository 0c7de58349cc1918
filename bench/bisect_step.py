"""Benchmark: one ``vmfuzz bisect`` step started cold against one forked from the bisect's zygote.

Not a test: it prints the two side by side (median of ``--runs``, wall seconds).

    PYTHONPATH=. python bench/bisect_step.py              # a stand-in SGLang checkout (the installed copy)
    PYTHONPATH=. python bench/bisect_step.py --repo PATH  # an SGLang checkout of your own

A step is what ``git bisect run`` starts for each revision:
``python -m vmfuzz.harness.engine.regression.bisect_step REPRO --repo CHECKOUT``, whose
child imports that checkout's SGLang and replays the repro. Cold, the child
imports everything; forked, torch, transformers and the rest are already in the
zygote and only SGLang and the harness are imported. The zygote's own start
(once per bisect) is printed too, with and without its preload list cached.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vmfuzz.harness.engine.core.zygote import probe_path  # noqa: E402
from vmfuzz.harness.targets.sglang.loader import IMPORT_SWITCHES  # noqa: E402
from vmfuzz.harness.engine.core.zygote_client import ZYGOTE_ENV, serving  # noqa: E402
from vmfuzz.harness.engine.regression import bisect_zygote as bisect_engine  # noqa: E402

REPRO = ROOT / "repro" / "pr33127" / "pr33127.json"


def _step(repo: Path, env: dict) -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "vmfuzz.harness.engine.regression.bisect_step", str(REPRO),
                           "--repo", str(repo), "--target", "sglang"], env=env, cwd=repo, capture_output=True)
    return time.perf_counter() - t0, proc.returncode


def _steps(repo: Path, env: dict, runs: int) -> tuple[float, list[float], set[int]]:
    got = [_step(repo, env) for _ in range(runs)]
    times = [t for t, _ in got]
    return statistics.median(times), times, {rc for _, rc in got}


def _started(env: dict, probe: str) -> tuple[float, object]:
    t0 = time.perf_counter()
    cm = serving(env, probe_code=probe, switches=IMPORT_SWITCHES)
    sock = cm.__enter__()
    return time.perf_counter() - t0, (cm, sock)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, help="an SGLang checkout (default: a stand-in built from the installed copy)")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(ZYGOTE_ENV, None)
    env.pop("TRITON_INTERPRET", None)  # a plain shell: each step, and the zygote, sets it as a cold step does
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    with tempfile.TemporaryDirectory(prefix="bench-bisect-") as tmp:
        repo = args.repo
        if repo is None:
            from tests import sglang_repo
            repo = sglang_repo.build(Path(tmp))
        env["VMFUZZ_BISECT_LOG"] = str(Path(tmp) / "steps.jsonl")
        cold, cold_all, cold_rc = _steps(repo, env, args.runs)
        code = bisect_engine.zygote_probe("sglang")
        probe_path(code, env, IMPORT_SWITCHES).unlink(missing_ok=True)  # the first start probes, as a bisect's first ever does
        start, (cm, sock) = _started(env, code)
        try:
            if sock is None:
                print("the zygote did not start")
                return 1
            forked, forked_all, forked_rc = _steps(repo, {**env, ZYGOTE_ENV: sock}, args.runs)
        finally:
            cm.__exit__(None, None, None)
        warm_start, (cm, _) = _started(env, code)
        cm.__exit__(None, None, None)
    print(f"bisect step on {repo} (median of {args.runs}, wall seconds; exit statuses cold {sorted(cold_rc)}, "
          f"forked {sorted(forked_rc)})")
    print(f"  {'cold step':<40}{cold:8.2f}   runs {', '.join(f'{t:.2f}' for t in cold_all)}")
    print(f"  {'forked from the zygote':<40}{forked:8.2f}   runs {', '.join(f'{t:.2f}' for t in forked_all)}")
    print(f"  {'forked / cold':<40}{forked / cold:8.2f}")
    print(f"  {'zygote start, first (probe + preload)':<40}{start:8.2f}")
    print(f"  {'zygote start, preload list cached':<40}{warm_start:8.2f}")
    return 0 if cold_rc == forked_rc else 1


if __name__ == "__main__":
    sys.exit(main())
