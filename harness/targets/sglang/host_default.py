"""The device's default layout as SGLang's own function answers it on the host vmfuzz imitates.

A read FULL_MASK config models a GPU server and a read QLEN_ONLY one a CPU
server. The harness used to answer the config's layout in place of SGLang's
default-layout function, so a change to that function (one returning QLEN_ONLY
on every host) was never judged: the harness's own value stood in for it.

Here the function itself is run, with the platform flags and probes it reads
set as the imitated host would have them, and its answer is what the call
sites and the allocator get; a wrong answer is then the allocator's choice of
another layout, judged as one. Where the function reads anything this module
cannot set for another host (a module, a function of its own, a flag not in
``FLAGS``), nothing is run: the config's layout answers, as before, and the
function's lines stay unrun, so a change to them is not judged, and the gate
says so.
"""

from __future__ import annotations

import enum
import inspect

#: platform flags and probes a default-layout function may read, as each imitated host has them
#: (every accelerator but CUDA is absent from both hosts vmfuzz imitates)
FLAGS = {"_is_cpu": "cpu", "_is_cuda": "gpu", "_is_hip": None, "_is_npu": None, "_is_xpu": None,
         "_is_musa": None, "_is_mps": None, "_is_cuda_alike": "gpu"}
PROBES = {"is_cpu": "cpu", "is_cuda": "gpu", "is_hip": None, "is_npu": None, "is_xpu": None, "is_musa": None,
          "is_cuda_alike": "gpu"}


def host_of(mode_name: str) -> str:
    """The host a read layout models."""
    return "gpu" if mode_name == "FULL_MASK" else "cpu"


def reads(fn) -> dict[str, object] | None:
    """The globals ``fn`` reads, or None when one of them is not a class, a constant, a known flag or a
    known probe."""
    code = getattr(fn, "__code__", None)
    space = getattr(fn, "__globals__", None)
    if code is None or space is None or code.co_freevars:
        return None
    read = {name: space[name] for name in code.co_names if name in space}
    for name, value in read.items():
        if name in FLAGS and isinstance(value, bool) or name in PROBES and callable(value):
            continue
        if not (inspect.isclass(value) or isinstance(value, (str, int, float, bytes, enum.Enum))):
            return None  # a module, a function, an object: it may ask this host, not the imitated one
    return read


def own_answer(fn, host: str):
    """``fn()`` with its flags and probes set for ``host``; None where it cannot be run that way."""
    read = reads(fn)
    if read is None:
        return None
    space = fn.__globals__
    kept = {name: space[name] for name in read if name in FLAGS or name in PROBES}
    try:
        for name in kept:
            on = (FLAGS.get(name) if name in FLAGS else PROBES[name]) == host
            space[name] = on if name in FLAGS else (lambda on=on: on)
        return fn()
    except Exception:  # noqa: BLE001 - the function raised on the imitated host: it cannot answer here
        return None
    finally:
        space.update(kept)


def answering(fn, host: str, mode):
    """What stands in for ``fn`` while a check runs on ``host``: SGLang's own answer when it can be
    had (computed anew at each call, so its lines run under the property), else ``mode``."""
    def default_layout():
        got = own_answer(fn, host)
        return mode if got is None else got
    return default_layout
