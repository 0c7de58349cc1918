"""SGLang's mask writers, run guarded.

The tree kernel is reached where SGLang's wrapper hands over to it (the kernel
entry, which moved between versions: see ``loader.KERNEL_ENTRIES``); there the
buffers it writes -- the reused one or the wrapper's own allocation -- are
swapped for redzoned stand-ins by ``guarded_write``.

The chain writer, ``build_chain_tree``, runs as SGLang wrote it (its
allocation, its assert on the buffer's size); its Triton launch is bound to a
launcher that swaps every buffer the kernel writes -- mask, positions, the
stacked retrieve arrays, tokens, KV-cache slots, M-RoPE positions -- for
redzoned stand-ins (``guarded_chain_write``) and then runs the target's
``chain_kernel`` seam, which relaunches SGLang's kernel on them.
"""

from __future__ import annotations

from vmfuzz.harness.guard.chain_write import ChainCall, guarded_chain_write
from vmfuzz.harness.guard.tree_write import KernelCall, guarded_write
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang.reach import patches_everywhere, raised_in
from vmfuzz.harness.targets.sglang.seams import Sentinel, bind, by_quantity, default_of, where

#: (SGLang file, function, properties that drive it): what ``vmfuzz surface`` lists.
_TREE = ("no-oob-write", "fallback-equivalence", "reference-agreement", "multi-step-reuse",
         "trivial-path", "chain-writer")  # trivial-path: the pp rebuild's one-node tree
_CHAIN = ("chain-writer", "no-oob-write", "fallback-equivalence", "reference-agreement", "multi-step-reuse")
SURFACE = (
    ("srt/speculative/eagle_utils.py", "build_tree_kernel_efficient", _TREE),
    ("kernels/ops/speculative/spec_tree.py", "sgl_build_tree_kernel_triton", _TREE),
    # the kernels themselves: their bodies run in Triton's interpreter, so the gate measures their lines
    ("kernels/ops/speculative/spec_tree.py", "sgl_build_tree_kernel_efficient_triton", _TREE),
    ("kernels/ops/speculative/eagle.py", "build_chain_tree", _CHAIN),
    ("kernels/ops/speculative/eagle.py", "_build_chain_tree_kernel", _CHAIN),
)

#: (sglang-relative path, what, why not driven): the writers' neighbours no property reaches.
NOT_DRIVEN: tuple[tuple[str, str, str], ...] = (
    ("kernels/ops/speculative/tree.py", "",
     "JIT CUDA kernel's entry: GPU only (scripts/gpu_check.sh)"),
    ("kernels/ops/speculative/__init__.py", "",
     "re-export: the op table names the kernels, runs none"),
    ("kernels/ops/speculative/uno_tree.py", "UnoTreeProposal",
     "names build_tree_kernel_efficient only in a docstring: it proposes the draft tree (parent_list, "
     "top_scores_index in EAGLE's encoding) from draft logits, upstream of the mask; it imports flashinfer "
     "(a CUDA package, absent here) at load, and its best-first trees are not among the shapes the tree "
     "strategies draw"),
)

#: The chain kernel's parameters vmfuzz reads, by the names SGLang's kernel gives them.
CHAIN_ARGS = ("bonus", "draft", "seq", "mask", "positions", "retrieve", "tokens", "BS", "WIDTH",
              "BONUS_STRIDE", "DRAFT_ROW", "DRAFT_COL", "SEQ_STRIDE")
#: ChainCall field -> the kernel's parameter name, for every buffer it writes.
CHAIN_BUFFERS = {"tree_mask": "mask", "positions": "positions", "retrieve": "retrieve", "tokens": "tokens",
                 "out_cache_loc": "out_cache_loc", "mrope": "mrope"}


EAGLE_UTILS = "srt/speculative/eagle_utils.py"


def kernel_signature_of(sg):
    """The function whose parameter names read a call of the kernel entry: the entry itself
    where this host defines it, else the Triton kernel it stands for (a CPU host never
    defines the CUDA entry an older wrapper names)."""
    entry = getattr(sg, "entry_fn", None) if sg.entry else None
    return entry if callable(entry) and not isinstance(entry, Sentinel) else (sg.triton or sg.jit)


def tree_kernel_patches(sg, kernel, heap) -> list[tuple]:
    """(owner, attr, value, may_add) binding SGLang's kernel entry to ``kernel`` behind the guard.

    The entry's arguments are read by SGLang's own parameter names, however the
    wrapper passed them (positionally or by keyword). The patch is a
    ``Sentinel``: the caller checks it was gone through.
    """
    if sg.entry is None:
        return []
    named_by = kernel_signature_of(sg)
    seam = f"eagle_utils.{sg.entry}"

    def kernel_entry(*args, **kwargs):
        q = by_quantity(named_by, seam, EAGLE_UTILS, args, kwargs)
        seq = q["seq_lens"]
        # A call that leaves the layout out gets the entry's own default; an entry naming
        # no layout at all predates the layouts and writes the full mask.
        mode = q["mode"] if "mode" in q else default_of(named_by, "mode", seam, EAGLE_UTILS,
                                                          TreeMaskMode.FULL_MASK)
        call = KernelCall(
            parent_list=q["parent_list"], top_scores_index=q["top_scores_index"], seq_lens=seq,
            tree_mask=q["tree_mask"], positions=q["positions"], retrieve_index=q["retrieve_index"],
            retrieve_next_token=q["retrieve_next_token"], retrieve_next_sibling=q["retrieve_next_sibling"],
            topk=int(q["topk"]), spec_steps=int(q["spec_steps"]), d=int(q["d"]),
            mode=TreeMaskMode(int(mode)), heap=heap)
        guarded_write(kernel, call, [int(s) for s in seq.tolist()])

    sentinel = Sentinel(kernel_entry, seam, EAGLE_UTILS)
    # Bound wherever the entry is held -- where it is defined and every module that imported it,
    # under any name -- so a wrapper that reaches it through a helper, its home module or a
    # renamed import still goes through the guard. An older wrapper names the CUDA entry even
    # where this host never defined it: bound by that name in eagle_utils too.
    return patches_everywhere(getattr(sg, "entry_fn", None), sentinel, (sg.eagle_utils, sg.entry, True))


class _GuardedChainLaunch:
    """Stands where ``build_chain_tree`` finds its kernel: ``launch[grid](*args, **kwargs)``."""

    def __init__(self, chain_kernel, heap, kernel=None):
        self._chain_kernel, self._heap, self._kernel = chain_kernel, heap, kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            # Read by the kernel's own parameter names, however build_chain_tree passed them.
            named = dict(bind(self._kernel.fn, self._seam, self._file, *args, **kwargs).arguments)
            missing = [p for p in CHAIN_ARGS if p not in named]
            if missing:
                raise OutOfStep(self._seam, self._file, f"the kernel names no parameter {', '.join(missing)}")
            call = ChainCall(
                bonus_tokens=named["bonus"], draft_tokens=named["draft"], seq_lens=named["seq"],
                tree_mask=named["mask"], positions=named["positions"], retrieve=named["retrieve"],
                tokens=named["tokens"], req_pool_indices=named.get("req_indices"),
                req_to_token=named.get("req_to_token"), out_cache_loc=named.get("out_cache_loc"),
                mrope=named.get("mrope"), width=int(named["WIDTH"]), heap=self._heap, launch=(grid, named))
            guarded_chain_write(self._chain_kernel, call)
        return launch


def chain_kernel_patches(sg, chain_kernel, heap) -> list[tuple]:
    """(owner, attr, value) binding ``build_chain_tree``'s launch to ``chain_kernel`` behind the guard."""
    if sg.chain_launch is None:
        return []
    launch = _GuardedChainLaunch(chain_kernel, heap, sg.chain_launch)
    launch._seam, launch._file = sg.chain_launch_name, where(sg.chain_module)
    # wherever the kernel is held, so a launch from a helper (of this module or another) is guarded too
    return patches_everywhere(sg.chain_launch, Sentinel(launch, launch._seam, launch._file))


def relaunch_chain(sg, call: ChainCall) -> None:
    """Run SGLang's chain kernel as ``build_chain_tree`` launched it, on ``call``'s buffers."""
    grid, named = call.launch
    named = dict(named)
    for field, param in CHAIN_BUFFERS.items():
        named[param] = getattr(call, field)
    # Strides and the batch size stay as build_chain_tree computed them: the
    # stand-ins have the shapes of the buffers they replace.
    sg.chain_launch[grid](**named)


def unguarded_write(exc: Exception, sg, kernel: list) -> None:
    """Out of step when the wrapper raised on a path vmfuzz's guard never stood on.

    With no kernel entry found, or the real entry running although every place
    that holds it was bound to the guard, SGLang's device dispatch ran on a host
    it was not built for: what it raised is the harness's doing, not SGLang's.
    """
    if isinstance(exc, OutOfStep):
        return
    if not kernel:
        raise OutOfStep("build_tree_kernel_efficient", EAGLE_UTILS,
                        "no kernel entry found along the calls it makes, for vmfuzz to guard; it raised "
                        f"{type(exc).__name__}: {exc}") from None
    # Only the guard launches SGLang's tree kernels: their module's code running before it was
    # reached means the wrapper got there some way vmfuzz did not bind.
    if not kernel[0][2].calls and raised_in(exc, getattr(sg, "entry_fn", None), sg.spec_tree):
        raise OutOfStep(kernel[0][2].seam, EAGLE_UTILS,
                        "the wrapper reached the kernel entry by a path vmfuzz did not bind, and its unguarded "
                        f"dispatch raised {type(exc).__name__}: {exc}") from None
