"""Plug-in targets that misbehave the way foreign code does: abort, hang, raise.

Loaded with ``--target tests.plugins:NAME``; each behaves like the reference
target until it meets its trigger (a batch past the captured max_bs), which a
short search reaches within its first examples.
"""

from __future__ import annotations

import os
import time

from harness.targets.reference import ReferenceTarget


def _past_capacity(mask, batch) -> bool:
    return mask is not None and batch.bs > mask.max_bs


class AbortingTarget(ReferenceTarget):
    name = "aborting"

    def verify(self, mask, config, batch, heap):
        if _past_capacity(mask, batch):
            os.abort()  # what a device-side assert or a segfault looks like from here
        return super().verify(mask, config, batch, heap)


class HangingTarget(ReferenceTarget):
    name = "hanging"

    def verify(self, mask, config, batch, heap):
        if _past_capacity(mask, batch):
            while True:  # a kernel that never returns
                time.sleep(1)
        return super().verify(mask, config, batch, heap)


class RaisingTarget(ReferenceTarget):
    name = "raising"

    def verify(self, mask, config, batch, heap):
        if _past_capacity(mask, batch):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().verify(mask, config, batch, heap)
