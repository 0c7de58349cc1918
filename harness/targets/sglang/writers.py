"""SGLang's mask writers, run guarded.

The tree kernel is reached where SGLang's wrapper hands over to it (the kernel
entry, which moved between versions: see ``loader.KERNEL_ENTRIES``); there the
buffers it writes -- the reused one or the wrapper's own allocation -- are
swapped for redzoned stand-ins by ``guarded_write``.
"""

from __future__ import annotations

from harness.kernel_call import KernelCall, guarded_write
from harness.layouts import TreeMaskMode
from harness.targets.sglang.loader import KERNEL_ARGS

#: The SGLang code this module drives (see ``harness.surface``): the wrapper
#: that fills a reused buffer or allocates per batch, and the Triton tree kernel
#: behind its kernel entry. The JIT CUDA kernel runs instead only with
#: VMFUZZ_SGLANG_KERNEL=jit on a GPU, so it is not declared here.
SURFACE = tuple(
    (file, function, ("no-oob-write", "fallback-equivalence", "reference-agreement", "multi-step-reuse"))
    for file, function in (("srt/speculative/eagle_utils.py", "build_tree_kernel_efficient"),
                           ("kernels/ops/speculative/spec_tree.py", "sgl_build_tree_kernel_triton")))


def tree_kernel_patches(sg, kernel, heap) -> list[tuple]:
    """(owner, attr, value) binding SGLang's kernel entry to ``kernel`` behind the guard."""

    def kernel_entry(*args, **kwargs):
        bound = dict(zip(KERNEL_ARGS, args))
        bound.update(kwargs)
        seq = bound["seq_lens"]
        call = KernelCall(
            parent_list=bound["parent_list"], top_scores_index=bound["top_scores_index"], seq_lens=seq,
            tree_mask=bound["tree_mask"], positions=bound["positions"],
            retrieve_index=bound["retrieve_index"], retrieve_next_token=bound["retrieve_next_token"],
            retrieve_next_sibling=bound["retrieve_next_sibling"], topk=int(bound["topk"]),
            spec_steps=int(bound["spec_steps"]), d=int(bound["d"]), mode=TreeMaskMode(int(bound["mode"])),
            heap=heap)
        guarded_write(kernel, call, [int(s) for s in seq.tolist()])

    return [] if sg.entry is None else [(sg.eagle_utils, sg.entry, kernel_entry)]
