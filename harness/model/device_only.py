"""What a CPU host truly cannot run: the one reviewed table behind the gate's "needs a GPU".

A changed line the gate's properties never ran is exit 3 either way. The table
says why for the lines that no CPU can run, so a maintainer reads two different
things: **needs a GPU** (check it on a GPU runner, ``GPU_CHECK``) apart from
**not driven here** (a harness gap: vmfuzz has no case or stand-in that takes
it, which is vmfuzz's to close). It is keyed by what the code itself says, never
by what a change under review claims: a branch's condition as the source spells
it, or a file's kind. Reviewed with each SGLang release.
"""

from __future__ import annotations

import ast
import re
from fnmatch import fnmatch

#: the command that checks these lines on a machine with a CUDA device
GPU_CHECK = "bash scripts/gpu_check.sh (on a CUDA runner)"

#: A branch condition's atom -> the device it needs. An atom is a name, a call of one,
#: or an attribute test (``x.seq_lens.is_cuda``); matched against the atom's source.
DEVICE_ATOMS: tuple[tuple[re.Pattern, str], ...] = tuple((re.compile(p), why) for p, why in (
    (r"^_?is_cuda(?:_alike)?(?:\(\))?$", "CUDA branch: needs a CUDA GPU"),
    (r"^torch\.cuda\.is_available\(\)$", "CUDA branch: needs a CUDA GPU"),
    (r"^(?:\w+\.)+is_cuda$", "CUDA tensor branch: needs its tensor on a CUDA GPU"),
    (r"^_?is_hip(?:\(\))?$", "HIP branch: needs a ROCm device"),
    (r"^_use_aiter$", "AITER branch: needs a ROCm device"),
    (r"^_?is_npu(?:\(\))?$", "NPU branch: needs an Ascend device"),
    (r"^_?is_xpu(?:\(\))?$", "XPU branch: needs an Intel GPU"),
    (r"^_?is_musa(?:\(\))?$", "MUSA branch: needs a Moore Threads device"),
    (r"^(?:\w+\.)*fa_impl_ver == 4$", "FA4 branch: needs a Blackwell GPU"),
    (r"^(?:[\w()]+\.)*_?is_(?:sm\d+|blackwell|hopper)\w*(?:\(\))?$", "device-capability branch: needs that GPU generation"),
    (r"^(?:\w+\.)*get_device_capability\(.*\).*$", "device-capability branch: needs a CUDA GPU"),
    # true only where the runner's device module is torch.cuda (its own test says so); what it sets up is a
    # side stream and an event recorded inside a capture, which one in-order CPU stream cannot be faithful to
    (r"^(?:\w+\.)*_forks_draft_metadata_prep\(\)$",
     "CUDA side-stream fork of the draft's in-graph metadata prep: needs a CUDA GPU"),
    # what that fork leaves: a forked prep pending its join (only ``fork_in_graph_metadata_prep``, called only
    # with the fork the test above sets up, leaves one)
    (r"^(?:\w+\.)*join_in_graph_metadata_prep\(\)$",
     "a forked draft in-graph metadata prep pending its join (only the CUDA side-stream fork leaves one): "
     "needs a CUDA GPU"),
    # a loop over the capture's tail hooks: only a GPU kernel plugin's install appends one (the NVIDIA
    # megakernel's, the AMD monokernel's), after building its kernels on the device
    (r"^(?:\w+\.)*capture_tail_hooks$",
     "capture tail hook of a GPU kernel plugin (NVIDIA megakernel, AMD monokernel): needs a GPU"),
    # the decode graph runner's HiSparse row count: only the JIT CUDA swap-in kernels (kvcacheio/hisparse.cuh)
    # read num_real_reqs, so nothing a CPU runs reads what the branch sets
    (r"^(?:self\.model_runner|forward_batch)\.hisparse_coordinator is not None$",
     "HiSparse row count for the JIT CUDA swap-in kernels (its only readers): needs a CUDA GPU"),
    # Qwen sparse attention's context-parallel K/V prefetch left pending: set only by prefetch_cp_kv, a gather
    # on the CP group in a side CUDA stream (several GPUs)
    (r"^(?:\w+\.)*_cp_kv_pending is not None$",
     "pending context-parallel K/V prefetch (a CP group's gather on a side CUDA stream): needs several GPUs"),
))

#: Files no CPU runs at all: kernel sources, wherever in the checkout they sit (first match wins).
DEVICE_FILES: tuple[tuple[str, str], ...] = (
    ("*.cu", "CUDA kernel source: needs a CUDA GPU"),
    ("*.cuh", "CUDA kernel source: needs a CUDA GPU"),
    ("*/csrc/*", "compiled kernel source: needs a CUDA GPU"),
    ("sgl-kernel/*", "SGLang's compiled kernel package (its sources, headers and op wrappers): needs a CUDA GPU"),
    ("*.h", "C/C++ kernel header: needs a CUDA GPU"),
    ("*.hpp", "C/C++ kernel header: needs a CUDA GPU"),
    ("kernels/jit/*", "JIT CUDA kernel: needs a CUDA GPU"),
    ("*_hip*", "HIP-only backend: needs a ROCm device"),
    # AMD's kernel library: the module imports without it only to fail at its first call
    ("*/aiter_backend.py", "AITER backend: needs a ROCm device with aiter installed"),
)


def device_file(path: str) -> str | None:
    """Why no CPU runs the file at ``path`` (any path spelling; matched on its tail), or None."""
    path = path.replace("\\", "/")
    for pattern, why in DEVICE_FILES:
        if fnmatch(path, pattern) or fnmatch(path, "*/" + pattern):
            return why
    return None


def _atom(source: str) -> str | None:
    for pattern, why in DEVICE_ATOMS:
        if pattern.match(source):
            return why
    return None


def _needs(node: ast.expr) -> str | None:
    """The device a branch under ``node`` needs taken: an atom; ``a and b`` needs what either
    operand needs; ``a or b`` only what every operand needs (else a CPU may take it)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and \
            isinstance(node.operand, ast.UnaryOp) and isinstance(node.operand.op, ast.Not):
        return _needs(node.operand.operand)  # the else of ``if not _is_cuda:``
    if isinstance(node, ast.BoolOp):
        found = [_needs(v) for v in node.values]
        if isinstance(node.op, ast.And):
            return next((w for w in found if w), None)
        return found[0] if all(found) else None
    return _atom(ast.unparse(node))


def device_branch(conditions: tuple[str, ...]) -> str | None:
    """Why no CPU takes a branch under these conditions (outermost first), or None. A negated
    device test (``not _is_cuda``, an ``else``) is what a CPU takes: never in the table."""
    for cond in conditions:
        try:
            node = ast.parse(cond, mode="eval").body
        except SyntaxError:
            continue
        why = _needs(node)
        if why:
            return why
    return None
