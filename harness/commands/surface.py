"""``vmfuzz surface``: each part of SGLang's mask path, and which property drives it (or why none)."""

from __future__ import annotations

import json

from harness.commands.common import resolve_target
from harness.model.errors import EXIT_OK


def run(args) -> int:
    from harness.engine.surface import render, report
    target = resolve_target(args.target)
    rep = report(args.target, target)
    rows = rep.pop("_rows")
    print(json.dumps(rep, indent=2) if args.json else render({**rep, "_rows": rows}))
    return EXIT_OK
