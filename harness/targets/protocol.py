"""The one interface every target implements.

A target is SGLang's verify-mask machinery, or a model of it, cut at the seams
a bug can hide in: sizing (``numel``), the capacity policy (``fits``), the
reuse-path fill (``fill_prefix``) and the tree kernel (``kernel``). The composite
steps (``allocate``, ``verify``) must reach those seams through ``self``, so a
known-bad variant can replace one seam on an instance and the target's own call
site picks it up -- for SGLang, its real call site.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.errors import OutOfStep  # noqa: F401 - re-exported: a target raises it
from vmfuzz.harness.guard.tree_write import KernelCall
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.outputs import StepOutput
from vmfuzz.harness.guard.shadow import ShadowHeap


@runtime_checkable
class Target(Protocol):
    name: str

    def numel(self, mode: TreeMaskMode, bs: int, d: int, max_context_len: int) -> int:
        """Cells to preallocate for ``bs`` requests (SGLang: ``tree_mask_numel``)."""

    def fits(self, mask: Any, bs: int) -> bool:
        """May a batch of ``bs`` requests write into ``mask``'s buffer?"""

    def fill_prefix(self, mask: Any, reused: bool) -> bool:
        """Does the wrapper fill a FULL_MASK buffer's prefix columns before the kernel?"""

    def kernel(self, call: KernelCall) -> None:
        """Write tree_mask, positions and retrieve_* for one batch."""

    def allocate(self, config: Config, heap: ShadowHeap | None) -> Any:
        """The verify mask for ``config``'s captured max_bs; ``heap=None``: on the meta device."""

    def verify(self, mask: Any, config: Config, batch: Batch, heap: ShadowHeap) -> StepOutput:
        """One verify step through the call site: reuse ``mask`` if it fits, else fall back.

        ``mask=None`` is a backend that owns no buffer: the fallback, always.
        """

    def versions(self) -> dict[str, str]:
        """Versions of what is under test, for reports."""


class TargetUnavailable(Exception):
    """The target cannot be loaded here (bad name, missing package): exit 2."""
