"""The tree kernel's entry: its arguments, and the guarded write around it.

Every target routes its kernel launch through ``guarded_write`` -- the reference
model directly, the SGLang adapter by intercepting SGLang's own launch -- so the
buffers the kernel writes are redzoned whoever allocated them, the fallback's
per-batch allocation included.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import torch

from vmfuzz.harness.model.layouts import TreeMaskMode, logical_size
from vmfuzz.harness.guard.shadow import ShadowHeap

MUTABLE = ("tree_mask", "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling")


@dataclass(frozen=True)
class KernelCall:
    """One launch of the tree kernel, argument for argument as SGLang passes them."""

    parent_list: torch.Tensor
    top_scores_index: torch.Tensor
    seq_lens: torch.Tensor
    tree_mask: torch.Tensor
    positions: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    topk: int
    spec_steps: int
    d: int
    mode: TreeMaskMode
    heap: ShadowHeap

    def replace(self, **changes) -> "KernelCall":
        return dataclasses.replace(self, **changes)

    def store(self, tensor: torch.Tensor, index: torch.Tensor, values) -> None:
        self.heap.store(tensor, index, values)

    def shifted(self, name: str, cells: int) -> torch.Tensor:
        """The same-sized window ``cells`` further into ``name``'s allocation.

        A kernel that miscomputes a row offset writes exactly this window; the
        guard's redzones make the window addressable instead of wild memory.
        """
        t = getattr(self, name)
        located = self.heap.backing_of(t)
        if located is None:  # unguarded: a shifted write cannot be modelled safely
            raise RuntimeError(f"{name} is not a guarded buffer; cannot shift it")
        raw, first, _ = located
        return raw[first + cells:first + cells + t.numel()].view(t.shape)


def aux_reach(d: int) -> int:
    """Redzone cells for positions and retrieve_*: two requests' rows plus slack.

    A target that allocates these with at least this much redzone has them used
    in place by ``guarded_write`` instead of copied into guarded stand-ins.
    """
    return 2 * d + 16


def reach(call: KernelCall, seq_lens: list[int]) -> dict[str, int]:
    """Redzone width per buffer: the cells a write could overshoot by.

    For tree_mask that is the batch's whole shortfall against the buffer (the
    FULL_MASK regression writes all of it) plus one request's block, so an
    offset error of up to a block is caught too.
    """
    d = call.d
    need = logical_size(call.mode, seq_lens, d)
    block = d * ((max(seq_lens, default=0) if call.mode == TreeMaskMode.FULL_MASK else 0) + d)
    out = {name: aux_reach(d) for name in MUTABLE}
    out["tree_mask"] = max(0, need - call.tree_mask.numel()) + block + 16
    return out


class LaunchStats:
    """Kernel launches in this process and the seconds spent inside them (the guard excluded).

    Under the Triton interpreter the launches are the floor of a run's cost;
    everything else (generation, the guard, the call site, the checks) is the
    harness's overhead over that floor. An isolated worker sends its counts
    back with every answer (``vmfuzz.harness.engine.core.isolation``), so the parent's add up.
    """

    def __init__(self):
        self.launches = 0
        self.seconds = 0.0

    def snapshot(self) -> tuple[int, float]:
        return self.launches, self.seconds

    def add(self, launches: int, seconds: float) -> None:
        self.launches += launches
        self.seconds += seconds


LAUNCHES = LaunchStats()


def guarded_write(kernel: Callable[[KernelCall], None], call: KernelCall, seq_lens: list[int]) -> None:
    tensors = {name: getattr(call, name) for name in MUTABLE}

    def launch(standins):
        t0 = time.perf_counter()
        try:
            kernel(call.replace(**standins))
        finally:
            LAUNCHES.add(1, time.perf_counter() - t0)

    call.heap.run_kernel(launch, tensors, reach(call, seq_lens))
