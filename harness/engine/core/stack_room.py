"""Room on CPython 3.11's frame stack for a worker's hot loop.

CPython 3.11 keeps Python frames on a stack of chunks (16 KiB by default) and
frees a chunk the moment its last frame returns. A loop whose calls go in and
out right across a chunk's end maps and unmaps that chunk on every call: a
million ``mmap``/``munmap`` pairs in a gate's worth of Triton's interpreter
(every SGLang kernel on a CPU host), its kernels eight times slower. Where the
end falls depends on how deep the worker was forked, i.e. on luck: a worker
forked from deeper in the harness's stack (a search lane's checker) met it,
the same checks forked from one level up did not.

``roomy(fn, *args)`` calls ``fn`` from a frame so large that CPython gives it a
chunk of its own, four times the usual size, whose free space then holds
everything ``fn`` calls: a call path has to be twice as deep as the default
chunk before it reaches that chunk's end. Elsewhere (another Python) it is a
plain call.
"""

from __future__ import annotations

import sys

#: locals in the roomy frame: 4100 words, just over 32 KiB, so CPython rounds its chunk up to 64 KiB
#: and about 31 KiB of that chunk are left for the frames below it
_LOCALS = 4100


def _build():
    names = " = ".join(f"_{i}" for i in range(_LOCALS))
    source = f"def roomy(fn, *args):\n    {names} = None\n    return fn(*args)\n"
    scope: dict = {}
    exec(compile(source, "<vmfuzz stack room>", "exec"), scope)  # noqa: S102 - a fixed, generated def
    return scope["roomy"]


if sys.implementation.name == "cpython" and sys.version_info[:2] == (3, 11):
    roomy = _build()
else:
    def roomy(fn, *args):
        return fn(*args)
