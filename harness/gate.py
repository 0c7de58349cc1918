"""Does a change touch verify-mask code? The gate's first, cheap question.

The list names SGLang paths (as they appear in a diff of SGLang's repository)
that allocate, size, fill, forward or write the target-verify tree mask. Keep it
in step with SGLang: a new backend that forwards the mask belongs here.
"""

from __future__ import annotations

import fnmatch
import subprocess
from pathlib import Path

VERIFY_MASK_PATTERNS = (
    "*/layers/attention/verify_mask.py",  # allocation, tree_mask_numel, fits
    "*/speculative/spec_tree.py",  # the Triton tree kernel
    "*spec_tree*.py",
    "*/csrc/speculative/tree.cuh",  # the JIT CUDA tree kernel
    "*/speculative/tree*.cu*",
    "*/ops/speculative/eagle.py",  # build_chain_tree: the chain writer
    "*/speculative/eagle_utils.py",  # build_tree_kernel_efficient: reuse or per-batch fallback
    "*/speculative/eagle_worker*.py",  # call sites: build_eagle_verify_input, trivial verify input
    "*/speculative/eagle_info*.py",
    "*/speculative/spec_info.py",
    "*/managers/scheduler_pp_mixin.py",  # pipeline-parallel call site
    "*/model_executor/cuda_graph_runner.py",  # the captured max_bs the buffer is sized for
    "*/model_executor/model_runner.py",  # creates the verify mask
    # attention backends that allocate or forward a verify mask
    "*/layers/attention/flashinfer_backend.py",
    "*/layers/attention/flashinfer_mla_backend.py",
    "*/layers/attention/triton_backend.py",
    "*/layers/attention/flashattention_backend.py",
    "*/layers/attention/torch_native_backend.py",
    "*/layers/attention/aiter_backend.py",
    "*/layers/attention/*tree*.py",
    "*/layers/attention/base_attn_backend.py",
    # this harness itself, when it is vendored into the repository under test
    "*/vmfuzz/*",
)


def touches_verify_mask(paths: list[str]) -> list[str]:
    """The changed paths that match a pattern (``/`` prefixed so ``*/x`` matches a top-level ``x``)."""
    return [p for p in paths if any(fnmatch.fnmatchcase("/" + p.lstrip("./"), pat) for pat in VERIFY_MASK_PATTERNS)]


class ChangeError(Exception):
    """The changed files could not be listed: exit 2."""


def changed_from_file(path: str) -> list[str]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ChangeError(f"cannot read --changed-files {path}: {exc.strerror or exc}") from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def changed_since(rev: str) -> list[str]:
    try:
        out = subprocess.run(["git", "diff", "--name-only", f"{rev}...HEAD"], capture_output=True,
                             text=True, check=True)
    except FileNotFoundError:
        raise ChangeError("--base needs git on PATH") from None
    except subprocess.CalledProcessError as exc:
        msg = (exc.stderr or "").strip().splitlines()
        raise ChangeError(f"git diff against {rev!r} failed: {msg[0] if msg else exc}") from None
    return [line for line in out.stdout.splitlines() if line.strip()]
