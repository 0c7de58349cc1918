"""Which SGLang files the gate's properties run: the measured half of the gate's trigger.

    python scripts/covered_files.py [--work DIR] [--check]

Runs the gate's profile (``vmfuzz run --target sglang --profile pr``) on the
installed SGLang with every file of the package under coverage.py, the import
observed too (``core.import_trace``), and writes the files some property's check
ran a line of, or the imports a check makes ran a line of (made once before the
forks, ``fork_ready``), sglang-relative, to
``harness/engine/campaign/covered_files.py``. What the target's own load or the
harness's set-up imports for every run, whatever it checks, is not counted. A changed file on that list
triggers the gate even when it names no mask code: its code ran under a
property, so its changed lines must be judged. ``--check`` exits 1 when the
shipped list differs from a fresh measurement. Regenerate it with each SGLang
release vmfuzz is written against.
"""

from __future__ import annotations

import argparse
import json
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
whole package during ``vmfuzz run --target sglang --profile pr``, the imports a
check makes included, though made before the forks); never edit it by hand. The gate's trigger reads it (``changes.triggers``).
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
    out, counted = set(), {"check": set(), "for-checks": set(), "import-only": set()}
    for name, by_line in ran.items():
        try:
            rel = Path(name).resolve().relative_to(package).as_posix()
        except ValueError:
            continue
        contexts = {ctx for ctxs in by_line.values() for ctx in ctxs}
        # a line a check ran, or one the imports a check makes ran (made once before the forks, for speed,
        # ``fork_ready``: the same imports a check would make, so the same files); never what the target's
        # own load, or the harness's set-up, imported for every run whatever it checks
        kind = ("check" if any(line_trace.is_check(c) for c in contexts)
                else "for-checks" if line_trace.FOR_CHECKS in contexts else "import-only")
        counted[kind].add(rel)
        if kind != "import-only":
            out.add(rel)
    print("files: " + ", ".join(f"{kind} {len(files)}" for kind, files in counted.items()), file=sys.stderr)
    (work / "counted.json").write_text(json.dumps({k: sorted(v) for k, v in counted.items()}))
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
