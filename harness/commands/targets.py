"""``vmfuzz targets``: the targets, then every known-bad variant as ``+NAME``."""

from __future__ import annotations

from vmfuzz.harness.commands.request import Request
from vmfuzz.harness.model.errors import EXIT_OK


def run(request: Request) -> int:
    from vmfuzz.harness.targets import BUILTIN, CATALOGUE
    width = max(len(n) for n in list(BUILTIN) + [f"+{v}" for v in CATALOGUE])
    print("targets:")
    for name, (desc, _) in BUILTIN.items():
        print(f"  {name:<{width}}  {desc}")
    print("  module:attr" + " " * max(1, width - 9) + "a plug-in object implementing the target protocol")
    print("variants (layer over any target, e.g. reference+pr33127):")
    for v in CATALOGUE.values():
        print(f"  +{v.name:<{width - 1}}  {v.description}")
    return EXIT_OK
