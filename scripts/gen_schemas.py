"""Writes the JSON Schemas of vmfuzz's files into harness/schemas/, from the msgspec structs.

    python scripts/gen_schemas.py           rewrite harness/schemas/*.schema.json
    python scripts/gen_schemas.py --check   exit 1 (naming the stale files) if any is out of date

The structs are the contract (vmfuzz.harness.model.repro_file.Repro, deployment_file.
Deployment, summary_file.RunSummary / CommandSummary); the schemas are what a
tool in another language reads. The wheel ships them (pyproject.toml's
package-data); tests/test_schemas.py checks they are current and that files the
commands write validate against them.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "harness" / "schemas"
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _schema(title: str, description: str, *types) -> dict:
    import msgspec
    roots, defs = msgspec.json.schema_components(types, ref_template="#/$defs/{name}")
    top = roots[0] if len(roots) == 1 else {"anyOf": list(roots)}
    return {"$schema": DRAFT, "title": title, "description": description, **top, "$defs": defs}


@functools.cache
def schemas() -> dict[str, dict]:
    from vmfuzz.harness.model.deployment_file import Deployment
    from vmfuzz.harness.model.repro_file import Repro
    from vmfuzz.harness.model.summary_file import CommandSummary, RunSummary
    return {
        "repro.schema.json": _schema("vmfuzz repro file", "One failing case: config and batches (docs/workflows.md).",
                                     Repro),
        "deployment.schema.json": _schema("vmfuzz deployment file", "A server deployment, as `run --deployment` "
                                          "and `minimize` read it.", Deployment),
        "summary.schema.json": _schema("vmfuzz summary.json", "The record a command leaves in its report "
                                       "directory: a search (run, gate) or a command's checks.",
                                       RunSummary, CommandSummary),
    }


def main(argv: list[str]) -> int:
    from generated import write_or_check
    # built lazily (once, for all three files): the struct imports need ROOT on sys.path,
    # which write_or_check puts there
    files = {name: (lambda name=name: json.dumps(schemas()[name], indent=2, sort_keys=True) + "\n")
             for name in ("repro.schema.json", "deployment.schema.json", "summary.schema.json")}
    return write_or_check("gen_schemas", ROOT, OUT, files, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
