"""vmfuzz: property-based regression harness for SGLang's target-verify tree mask.

The one top-level import name the distribution installs. The repository keeps
the design's layout (``harness/`` and ``strategies/`` at its root); the
packages here reach them through links, and pyproject maps them the same way
for a wheel, so a checkout and an installed wheel import the same names.
"""

from vmfuzz.harness import __version__

__all__ = ["__version__"]
