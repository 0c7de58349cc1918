"""The widths SGLang's mask path is built around, read from the code under test.

The packing kernel's block (``BLOCK=`` at its launch in pack_verify_mask.py), the
packed words EAGLE's verify step chooses between (``packed_dtypes`` in
eagle_utils.py) and the lanes a build-tree program runs (its launch's
``num_warps``, else Triton's default, times a warp). A number the source no
longer states falls back to the model's own, and the summary says which.
"""

from __future__ import annotations

import importlib
import inspect
import re

from vmfuzz.harness.model.shapes import ShapeConstants, model_constants

#: threads in one warp: what a Triton program's num_warps counts in
WARP_LANES = 32

_PACK = "sglang.kernels.ops.speculative.pack_verify_mask"
_EAGLE = "sglang.srt.speculative.eagle_utils"
_TREE = "sglang.kernels.ops.speculative.spec_tree"


def _source(module: str) -> str:
    try:
        return inspect.getsource(importlib.import_module(module))
    except (ImportError, OSError, TypeError):
        return ""


def shape_constants() -> ShapeConstants:
    base, said = model_constants(), []
    block = re.search(r"\bBLOCK\s*=\s*(\d+)", _source(_PACK))
    block_bytes = int(block.group(1)) if block else base.pack_block_bytes
    said.append(f"pack block {block_bytes} bytes ({'BLOCK= in ' + _PACK if block else 'model default'})")
    words = re.search(r"packed_dtypes\s*=\s*\[([^\]]*)\]", _source(_EAGLE))
    widths = tuple(int(w) for w in re.findall(r"uint(\d+)", words.group(1))) if words else ()
    widths = widths or base.packed_widths
    said.append(f"packed words {'/'.join(map(str, widths))} bits "
                f"({'packed_dtypes in ' + _EAGLE if words else 'model default'})")
    warps = re.search(r"\bnum_warps\s*=\s*(\d+)", _source(_TREE))
    n_warps = int(warps.group(1)) if warps else _triton_default_warps()
    lanes = n_warps * WARP_LANES
    said.append(f"{lanes} lanes ({n_warps} warps: {'num_warps in ' + _TREE if warps else 'Triton default'})")
    return ShapeConstants(packed_widths=widths, pack_block_bytes=block_bytes, lanes=lanes, source="; ".join(said))


def _triton_default_warps() -> int:
    try:
        import triton
        return int(inspect.signature(triton.Config).parameters["num_warps"].default)
    except (ImportError, KeyError, TypeError, ValueError):
        return 4  # Triton's documented default, where its signature cannot be read
