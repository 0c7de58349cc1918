"""The ``sglang`` target: the installed SGLang package's real code, cut at the seams.

What runs is SGLang's own: ``maybe_create_verify_mask`` and ``tree_mask_numel``
size the allocation, ``VerifyMask.fits`` decides capacity, the call site the
case names decides reuse or fallback (``eagle_worker_common.build_eagle_verify_input``
when drafting, ``EAGLEWorkerV2._build_trivial_verify_input`` when d = 1, the
same on its ``build_chain_tree`` branch, or the pipeline-parallel
``Scheduler._pp_spec_rebuild_verify_input``), ``eagle_utils.build_tree_kernel_efficient``
fills and allocates, and its kernel writes -- or, for a topk-1 chain on the
chain branch, ``build_chain_tree`` allocates and writes. The batch, worker and attention backend are SimpleNamespace
stand-ins carrying only what those functions read, the way SGLang's own unit
tests drive them.

While one call runs, SGLang's module attributes that lead to a seam are bound to
this instance's seam, so a variant layered over the target (which replaces one
seam on a copy) reaches SGLang's real call site: the class's ``fits``, the
sizing helper, the call site's wrapper (for the reuse-path prefix fill) and the
kernel entry. They are restored when the call returns, raises or is interrupted.
At the kernel entry every buffer the kernel writes -- the reused one, or the one
SGLang's wrapper just allocated -- is swapped for a redzoned stand-in.

Versions: SGLang 0.5.17 ... 0.5.23 differ in where the kernel entry lives and
what the platform dispatch is called; the pre-#33127 API shape takes
``fits(bs, num_draft_tokens)`` and keeps ``max_context_len`` in the struct.
Both are detected from signatures and struct fields, never from version strings.
"""

from __future__ import annotations

import os

from vmfuzz.harness.targets.sglang.loader import INSTALL_HINT, import_sglang
from vmfuzz.harness.targets.sglang.target import SglangTarget

def load() -> SglangTarget:
    from vmfuzz.harness.targets.protocol import TargetUnavailable

    choice = os.environ.get("VMFUZZ_SGLANG_KERNEL", "triton")
    if choice not in ("triton", "jit"):
        raise TargetUnavailable(f"VMFUZZ_SGLANG_KERNEL={choice!r}: use triton or jit")
    try:
        sg = import_sglang(choice)
    except ImportError as exc:
        raise TargetUnavailable(f"cannot import SGLang ({exc}); {INSTALL_HINT}") from None
    return SglangTarget(sg, choice)


__all__ = ["INSTALL_HINT", "SglangTarget", "load"]
