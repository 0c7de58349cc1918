"""What gen_docs.py and gen_schemas.py share: files built from the code, written or checked.

Each script names its output folder and, per file, a function that builds the
file's text from the code; ``--check`` writes nothing and exits 1 naming the
files whose text on disk differs (the tests run it, so a stale page fails CI).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable


def write_or_check(tool: str, root: Path, out: Path, files: dict[str, Callable[[], str]], argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print(f"usage: {tool}.py [--check]", file=sys.stderr)
        return 2
    sys.path.insert(0, str(root))  # the builders import vmfuzz.harness from this checkout
    stale = []
    for name, build in files.items():
        path, text = out / name, build()
        if argv:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(root)))
        else:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"{tool}: out of date: {', '.join(stale)} (run python scripts/{tool}.py)", file=sys.stderr)
        return 1
    return 0
