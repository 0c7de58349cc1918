"""Every property, by name: each a check that returns an ``Observation`` or raises ``PropertyFailure``.

One module per part of the mask's path:

- ``core``: allocation, ``fits`` and the verify step through the call site
  (the seven properties of DESIGN.md section 2); ``Config.call_site`` picks
  which of SGLang's three call sites a case runs through.
- ``writers``: the chain writer ``build_chain_tree``, called directly.
- ``routers``: ``routing``, the mask a router hands to the call site.
- ``allocation``: ``allocation-soundness``, the bounds each backend allocates with.
- ``readers``: the mask as attention reads it (Triton's mask_indptr, FlashInfer's
  bit packing).

A property names the target seams it ``needs`` beyond the core protocol; a
target without them (a plug-in written against the core protocol) gets the
property reported as not driven, never as held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from harness.properties.core import (Observation, PropertyFailure, capacity_liveness, capacity_soundness,
                                     fallback_equivalence, multi_step_reuse, no_oob_write,
                                     reference_agreement, trivial_path)
from harness.properties.writers import chain_writer
from harness.properties.readers import packed_mask, reader_agreement


@dataclass(frozen=True)
class Property:
    name: str
    check: Callable[..., Observation]
    summary: str
    trivial: bool = False  # runs on d = 1 configs
    steps: bool = False  # takes a sequence of batches
    #: target attributes the check calls beyond the core protocol
    needs: tuple[str, ...] = ()
    chain: bool = False  # runs on the chain writer's configs (QLEN_ONLY, topk 1, d = spec_steps + 1)
    #: layouts its cases are drawn in (None: every preallocated layout)
    layouts: tuple[str, ...] | None = None

    def applies(self, config) -> bool:
        """Are ``config``'s cases this property's? (d = 1 or not, its layouts, a chain for the chain writer)"""
        if config.trivial != self.trivial:
            return False
        if self.layouts is not None and config.mode.name not in self.layouts:
            return False
        return config.chain if self.chain else True

    def missing(self, target) -> list[str]:
        """The seams ``target`` lacks for this property (empty: it can be driven)."""
        return [seam for seam in self.needs if not callable(getattr(target, seam, None))]


PROPERTIES: dict[str, Property] = {p.name: p for p in (
    Property("no-oob-write", no_oob_write, "no write leaves its buffer, reused or freshly allocated"),
    Property("fallback-equivalence", fallback_equivalence, "reuse path == per-batch fallback over the logical region"),
    Property("reference-agreement", reference_agreement, "outputs == oracle from ancestor sets and depths"),
    Property("capacity-soundness", capacity_soundness, "fits(bs) => worst-case footprint fits the buffer"),
    Property("capacity-liveness", capacity_liveness, "bs <= max_bs => fits(bs)"),
    Property("multi-step-reuse", multi_step_reuse, "a reused buffer gives what a fresh one gives, step after step",
             steps=True),
    Property("trivial-path", trivial_path, "d = 1: reuse and fallback agree", trivial=True),
    Property("chain-writer", chain_writer, "build_chain_tree: no write leaves its buffers; == oracle, "
             "== the tree kernel on the same chain", chain=True, needs=("chain_write", "chain_kernel")),
    Property("reader-agreement", reader_agreement, "each reader's mask_indptr gives request b exactly its cells "
             "(eager and cuda-graph replay)", needs=("read_eager", "read_replay"), layouts=("FULL_MASK",)),
    Property("packed-mask", packed_mask, "bit packing stays in its buffer and yields the mask, LSB first, "
             "where the reader looks", needs=("pack_mask",), layouts=("FULL_MASK",)),
)}

from harness.properties.allocation import allocation_soundness  # noqa: E402 - after Property
from harness.properties.routers import routing  # noqa: E402

PROPERTIES.update({p.name: p for p in (
    Property("routing", routing, "each router hands out its TARGET_VERIFY child's mask and reports a "
             "context covering it", needs=("route", "verify_routed")),
    Property("allocation-soundness", allocation_soundness, "each allocating backend sizes the mask for "
             "the server's max_bs, context length and draft width", needs=("allocating_backends", "allocation_call")),
)})

__all__ = ["Observation", "PROPERTIES", "Property", "PropertyFailure"]
