"""Which SGLang code the cuda-graph runners' and the KV-location step's drivers follow.

The drivers build SGLang's runners by their own set-up, with stand-ins for the
model and the device, as SGLang 0.5.23 lays that set-up out. On an earlier
release it differs in ways no binding by name can follow (0.5.22 hands
attention a forward context the drivers do not open; 0.5.21's buffer sets take
other arguments; the KV-location kernels have other names), and a driver run
there would raise from the harness's own wiring, which reads as SGLang's
crash. So on such code these properties are not driven, and say why: a gate
whose changed lines needed them is could not check, never green.
"""

from __future__ import annotations

#: the properties that drive the cuda-graph runners and the KV-location step
PROPERTIES = frozenset({"graph-replay-equivalence", "padding-inert", "capture-replay-agreement",
                        "graph-buffer-soundness", "kv-location-soundness"})
#: the first SGLang release whose set-up of them the drivers follow
FROM = (0, 5, 23)


def not_driven(version: str) -> str | None:
    """Why code of SGLang ``version`` (as the code under test describes itself) is not driven on the
    graph path; None: it is (this release or a later one, a checkout past its tag included)."""
    from packaging.version import InvalidVersion, Version
    try:
        release = Version(version).release
    except InvalidVersion:
        release = None
    if release is not None and tuple(release[:3]) >= FROM:
        return None
    return (f"vmfuzz drives the cuda-graph runners and the KV-location step as SGLang {'.'.join(map(str, FROM))} "
            f"and later build them; the code under test is {version or 'of no version'}")
