"""Which SGLang files the gate's properties run: the measured half of the gate's trigger.

    python scripts/covered_files.py [--work DIR] [--check]

Runs the gate's profile (``vmfuzz run --target sglang --profile pr``) on the
installed SGLang with every file of the package under coverage.py, and writes
the files some property's check ran a line of (sglang-relative) to
``harness/engine/campaign/covered_files.py``. A changed file on that list
triggers the gate even when it names no mask code: its code ran under a
property, so its changed lines must be judged. ``--check`` exits 1 when the
shipped list differs from a fresh measurement. Regenerate it with each SGLang
release vmfuzz is written against.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = ROOT / "harness" / "engine" / "campaign" / "covered_files.py"

HEAD = '''"""The SGLang files the gate's properties ran a line of, on sglang {version} (generated).

Written by scripts/covered_files.py from a measurement (coverage.py over the
whole package during ``vmfuzz run --target sglang --profile pr``); never edit
it by hand. The gate's trigger reads it (``changes.triggers``).
"""

COVERED_BY_PROPERTIES = (
'''


def measure(work: Path) -> list[str]:
    from vmfuzz.harness.engine.core import line_trace
    package = Path(find_spec("sglang").origin).parent.resolve()
    folder = work / "lines"
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{line_trace.DIR_ENV: str(folder),
                                                   line_trace.FILES_ENV: f"{package}/*"})
    subprocess.run([sys.executable, "-m", "vmfuzz", "run", "--target", "sglang", "--profile", "pr",
                    "--report-dir", str(work / "report")], cwd=ROOT, env=env, check=False)
    ran = line_trace.merged(folder)
    out = set()
    for name, by_line in ran.items():
        if any(ctx != line_trace.NO_PROPERTY for ctxs in by_line.values() for ctx in ctxs):
            try:
                out.add(Path(name).resolve().relative_to(package).as_posix())
            except ValueError:
                continue
    return sorted(out)


def render(files: list[str]) -> str:
    from importlib.metadata import version
    return HEAD.format(version=version("sglang")) + "".join(f"    {f!r},\n" for f in files) + ")\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="vmfuzz-covered-"))
    text = render(measure(work))
    if args.check:
        same = OUT.is_file() and OUT.read_text() == text
        print("covered_files.py is current" if same else "covered_files.py differs from a fresh measurement")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}: {text.count(chr(10)) - HEAD.count(chr(10)) - 1} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
