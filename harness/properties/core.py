"""The core checks that run alone: the capacity arithmetic (soundness, liveness) and the trivial path.

The four core properties that launch the kernel through the call site
(no-oob-write, fallback-equivalence, reference-agreement, multi-step-reuse)
are judged on one shared run of a case in ``shared``.
"""

from __future__ import annotations

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import worst_case_size
from vmfuzz.harness.model.oracle import expected
from vmfuzz.harness.model.origin import BEYOND_CAPACITY
from vmfuzz.harness.properties.kit import (VERIFY_STEP, Observation, allocated, capacity_of, fail, first_difference, guarded_step,
                                    reused_mask)


def capacity_soundness(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
    obs = Observation()
    mask = allocated("capacity-soundness", target, config, None)
    cap = capacity_of(mask)
    for batch in batches:
        # Judged at the worst case, not at the batch's own lengths: its own class.
        obs.add_step(config, Batch((config.max_context_len,) * batch.bs), None, cap,
                     synthetic="every request at max_context_len")
        if target.fits(mask, batch.bs):
            worst = worst_case_size(mask.mode, batch.bs, config.d, config.max_context_len)
            if worst > cap:
                fail("capacity-soundness",
                      f"fits({batch.bs}) is True for a {cap}-cell {mask.mode.name} buffer (max_bs {config.max_bs}), "
                      f"but {batch.bs} requests at max_context_len {config.max_context_len} need {worst} cells",
                      effect="overrun", writer=VERIFY_STEP, buffer="tree_mask", side="above",
                      cell=BEYOND_CAPACITY, stage="arithmetic")
    return obs


def capacity_liveness(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
    obs = Observation()
    mask = allocated("capacity-liveness", target, config, None)
    for batch in batches:
        obs.add_step(config, batch, None, capacity_of(mask))
        if batch.bs <= config.max_bs and not target.fits(mask, batch.bs):
            fail("capacity-liveness", f"fits({batch.bs}) is False although bs <= max_bs {config.max_bs}: "
                                       "every such step would silently fall back and allocate",
                 effect="unsound", writer="fits", buffer="tree_mask", cell="refused a captured bs",
                 stage="arithmetic")
    return obs



def trivial_path(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
    obs = Observation()
    for batch in batches:
        want = expected(config, batch)
        heap, mask = reused_mask(target, config, device, "trivial-path")
        reuse = guarded_step("trivial-path", target, mask, config, batch, heap)
        fallback = guarded_step("trivial-path", target, None, config, batch, heap)
        obs.add_step(config, batch, reuse, capacity_of(mask))
        for diff in (first_difference("reuse vs fallback", reuse, fallback, config, batch, want.compared),
                     first_difference("reuse vs oracle", reuse, want, config, batch, want.compared)):
            if diff:
                fail("trivial-path", diff, writer=VERIFY_STEP)
    return obs
