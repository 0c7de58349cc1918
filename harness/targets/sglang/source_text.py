"""The source of one of SGLang's functions, as ``inspect.getsource`` gives it, read cheaply.

The harness reads a function's own source to follow what it names (the module a
``from M import name`` inside it names, the fields its set-up assigns). On a code
object, ``inspect.getsource`` first asks ``inspect.getmodule``, which resolves the
real path of every loaded module's file once per process: with torch and SGLang
loaded, thousands of ``realpath`` calls in every forked checker, since the fork
server's parent had never asked. Measured under py-spy over a gate: 221 of 3,523
samples (6 % of its CPU). The text itself only needs the file's lines, which
``linecache`` holds, and the block starting at the code's first line, which
``inspect.getblock`` finds exactly as ``getsource`` does; so that is what is read
here, once per code object (tests/test_speedups.py holds it equal to
``inspect.getsource``).
"""

from __future__ import annotations

import functools
import inspect
import linecache


@functools.lru_cache(maxsize=None)
def of_code(code) -> str:
    """The source block of ``code``; OSError when its file's lines cannot be read."""
    lines = linecache.getlines(code.co_filename)
    first = code.co_firstlineno - 1
    if not lines or not 0 <= first < len(lines):
        raise OSError(f"no source lines for {code.co_name} in {code.co_filename}")
    return "".join(inspect.getblock(lines[first:]))


def of(fn) -> str:
    """The source of a function (unwrapped, as ``inspect.getsource`` unwraps it) or of a code object;
    anything else is handed to ``inspect.getsource``."""
    code = getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else fn
    if inspect.iscode(code):
        return of_code(code)
    return inspect.getsource(fn)
