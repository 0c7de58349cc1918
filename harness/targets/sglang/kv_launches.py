"""The kernel launches of the KV-location step (``kv_locations``), guarded or called as SGLang calls them.

A launch whose output is a window of KV slots gets that output as a redzoned
view (``ShadowHeap.run_kernel``), written back after, so a write past it is
seen. Where releases differ in how they launch (a wrapper, or the Triton
kernel itself) the launch this SGLang makes is the one guarded.
"""

from __future__ import annotations

from vmfuzz.harness.guard.shadow import ShadowHeap


def _guarded(heap: ShadowHeap, fn, *, out: str, reach: int):
    """``fn`` with its ``out`` argument handed to it as a redzoned view (written back after)."""
    import inspect
    names = list(inspect.signature(fn).parameters)

    def call(*args, **kwargs):
        args = list(args)
        if out in kwargs:
            target = kwargs[out]
        else:
            target = args[names.index(out)]
        done = {}

        def launch(t):
            if out in kwargs:
                kwargs[out] = t[out]
            else:
                args[names.index(out)] = t[out]
            done["r"] = fn(*args, **kwargs)
        heap.run_kernel(launch, {out: target}, {out: reach})
        return done["r"]
    call.__name__ = fn.__name__
    return call


class _GuardedLaunch:
    """A Triton kernel launched as ``kernel[grid](...)``, its ``out`` argument handed to it as a
    redzoned view (written back after)."""

    def __init__(self, heap: ShadowHeap, kernel, out: str, reach: int):
        self.heap, self.kernel, self.out, self.reach = heap, kernel, out, reach
        self.__name__ = getattr(kernel, "__name__", "kernel")

    def __getitem__(self, grid):
        return _guarded(self.heap, _grid_launch(self.kernel, grid), out=self.out, reach=self.reach)


def _grid_launch(kernel, grid):
    """``kernel[grid]`` as a function of the kernel's own parameters (for ``_guarded``'s binding by name)."""
    import inspect

    def launch(*args, **kwargs):
        return kernel[grid](*args, **kwargs)
    launch.__signature__ = inspect.signature(kernel.fn)
    launch.__name__ = getattr(kernel, "__name__", "kernel")
    return launch


def draft_launch(common, heap: ShadowHeap, reach: int) -> tuple:
    """The contiguous draft-window launch ``prepare_for_draft`` makes, guarded: through its wrapper
    (``assign_draft_cache_locs_contiguous_func``) where this SGLang has one; else (0.5.22 launches the
    Triton kernel itself) the kernel's launch."""
    wrapper = getattr(common, "assign_draft_cache_locs_contiguous_func", None)
    if wrapper is not None:
        return (common, "assign_draft_cache_locs_contiguous_func",
                _guarded(heap, wrapper, out="out_cache_loc", reach=reach))
    kernel = common.assign_draft_cache_locs_contiguous
    return (common, "assign_draft_cache_locs_contiguous", _GuardedLaunch(heap, kernel, "out_cache_loc", reach))


def greedy_walk(sg):
    """SGLang's Triton tree walk, called as ``verify_tree_greedy_func`` is (its ``topk`` is the CUDA
    kernel's hint; the walk follows the retrieve links whatever it is). The walk is the spec-tree
    kernels' (0.5.23) or, where they hold none, the one ``eagle_utils`` defines beside the wrapper (0.5.22)."""
    triton_walk = (getattr(sg.spec_tree, "verify_tree_greedy_triton", None)
                   or getattr(sg.eagle_utils, "verify_tree_greedy_triton"))

    def walk(*, topk=-1, **kwargs):
        triton_walk(**kwargs)
        return kwargs["predicts"], kwargs["accept_index"], kwargs["accept_token_num"]
    return walk
