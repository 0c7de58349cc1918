"""FlashAttention's cuda-graph buffers as its own set-up sizes them, for ``allocation-soundness``.

The backend is the allocation site's (``allocation.site_backend``: made by its
own ``__init__`` over the stand-in runner, on meta). Its whole
``init_cuda_graph_state(max_bs, max_bs * d)`` runs, with the module's ``torch``
bound to ``_AskedTorch``: every buffer lands on meta at the size it asked for,
and a size torch would refuse (a negative dimension, an ``arange`` whose end
lies behind its start) is recorded as asked and stands in as an empty
dimension instead of raising. So a buffer sized too small is judged as a size
even where the real set-up raises on it, and every buffer after it is judged
too. The verify-mask call is bound to return none: the mask is the allocation
site's to judge (``allocation.allocation_call``), not this footprint's.
"""

from __future__ import annotations

import functools
import math

import torch

from vmfuzz.harness.model.allocation import ServerNumbers
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang import backend_init
from vmfuzz.harness.targets.sglang.allocation import SITES, site_backend
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.reach import lookup_patches
from vmfuzz.harness.targets.sglang.seams import call_method

SITE = "flashattention"
_FILE = "srt/layers/attention/" + SITES[SITE][0] + ".py"
#: where the shape a buffer was asked for rides on its stand-in tensor
_ASKED = "_vmfuzz_asked"
#: where a buffer made with content (an ``arange``'s start and step, a ``full``'s value) rides on it
_MADE = "_vmfuzz_made"


def _as_shape(size) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = size[0]
    return tuple(int(n) for n in size)


class _AskedTorch:
    """``torch`` for the set-up: buffers on meta, each tagged with the shape it asked for, never refused."""

    def __getattr__(self, name):
        real = getattr(torch, name)
        if name == "arange":
            return self._arange
        if name in ("zeros", "empty", "ones"):
            return lambda *size, **kw: self._made(real, _as_shape(size), (), kw)
        if name == "full":
            return lambda size, *fill, **kw: self._full(real, size, fill, kw)
        return real

    @staticmethod
    def _made(real, shape: tuple[int, ...], rest: tuple, kw: dict):
        kw.pop("pin_memory", None)
        t = real(tuple(max(n, 0) for n in shape), *rest, **dict(kw, device="meta"))
        setattr(t, _ASKED, shape)
        return t

    @classmethod
    def _full(cls, real, size, fill: tuple, kw: dict):
        value = fill[0] if fill else kw.get("fill_value")
        t = cls._made(real, _as_shape((size,)), fill, kw)
        setattr(t, _MADE, ("full", int(value)))
        return t

    @staticmethod
    def _arange(*bounds, step=1, **kw):
        start, end, step = (0, bounds[0], step) if len(bounds) == 1 else (*bounds[:2], bounds[2] if len(bounds) > 2
                                                                          else step)
        count = math.ceil((end - start) / step)  # negative where torch refuses: fewer than none
        t = torch.arange(start, start + max(count, 0) * step, step, **dict(kw, device="meta"))
        setattr(t, _ASKED, (count,))
        setattr(t, _MADE, ("arange", int(start), int(step)))
        return t


@functools.lru_cache(maxsize=256)
def _asked(target, numbers: ServerNumbers, page_size: int) -> dict[str, tuple[tuple[int, ...], tuple | None]]:
    """"dict.key" -> (asked shape, how it was filled or None), of every tensor in a dict the set-up left on
    the backend."""
    mod, cls, backend = site_backend(target, SITE, numbers, page_size)
    patches = [(mod, "torch", _AskedTorch()),
               *lookup_patches([mod], {"maybe_create_verify_mask": lambda *a, **k: None}),
               *backend_init.lookups_bound(mod, cls, numbers, page_size), *backend_init.cuda_only(SITE, mod)]
    with bound(*patches):
        call_method(backend, "init_cuda_graph_state", max_bs=numbers.max_bs,
                    max_num_tokens=numbers.max_bs * numbers.num_draft_tokens)
    return {f"{name}.{key}": (getattr(t, _ASKED, tuple(t.shape)), getattr(t, _MADE, None))
            for name, buffers in vars(backend).items() if isinstance(buffers, dict)
            for key, t in buffers.items() if isinstance(key, str) and isinstance(t, torch.Tensor)}


def graph_buffers(target, numbers: ServerNumbers, names, page_size: int = 1) -> dict[str, tuple[int, ...]]:
    """The shape ``init_cuda_graph_state(numbers.max_bs, ...)`` asked for each buffer in ``names``
    ("dict.key") on a server whose KV pages hold ``page_size`` tokens; one it did not make is out of
    step (renamed or moved), not a finding."""
    return {name: shape for name, (shape, _) in _judged(target, numbers, names, page_size).items()}


def graph_constants(target, numbers: ServerNumbers, names, page_size: int = 1) -> dict[str, tuple | None]:
    """How the set-up filled each buffer in ``names``: ``("arange", start, step)``, ``("full", value)``,
    or None (made empty, or by anything else: its content is the replay's to write)."""
    return {name: made for name, (_, made) in _judged(target, numbers, names, page_size).items()}


def _judged(target, numbers: ServerNumbers, names, page_size: int) -> dict:
    asked = _asked(target, numbers, page_size)
    missing = [name for name in names if name not in asked]
    if missing:
        raise OutOfStep(f"{SITES[SITE][1]}.init_cuda_graph_state", _FILE,
                        f"left no {', '.join(missing)}, the cuda-graph buffers vmfuzz judges")
    return {name: asked[name] for name in names}
