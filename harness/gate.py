"""Does a change touch verify-mask code? The gate's first, cheap question.

The list names SGLang paths (as they appear in a diff of SGLang's repository)
that allocate, size, fill, forward or write the target-verify tree mask. Keep it
in step with SGLang: a new backend that forwards the mask belongs here.
"""

from __future__ import annotations

import fnmatch
import subprocess

VERIFY_MASK_PATTERNS = (
    "*/layers/attention/verify_mask.py",  # allocation, tree_mask_numel, fits
    "*/speculative/spec_tree.py",  # the Triton tree kernel
    "*spec_tree*.py",
    "*/csrc/speculative/tree.cuh",  # the JIT CUDA tree kernel
    "*/speculative/tree*.cu*",
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
    from harness.validate import LimitError, read_input
    try:
        data = read_input(path, "--changed-files")
    except LimitError as exc:
        raise ChangeError(str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChangeError(f"--changed-files {path} is not UTF-8 text (byte {exc.start}): "
                          "expected one path per line") from None
    if "\0" in text:
        raise ChangeError(f"--changed-files {path} holds NUL bytes: expected one path per line")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                             stdin=subprocess.DEVNULL, timeout=120)
    except FileNotFoundError:
        raise ChangeError("--base needs git on PATH") from None
    except subprocess.TimeoutExpired:
        raise ChangeError(f"git {args[0]} did not answer within 120 s") from None
    except subprocess.CalledProcessError as exc:
        msg = (exc.stderr or "").strip().splitlines()
        raise ChangeError(f"git {args[0]} failed: {msg[0] if msg else exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ChangeError(f"git {args[0]} failed: {exc}") from None
    return out.stdout


def changed_since(rev: str) -> list[str]:
    """Paths changed between ``rev`` and HEAD; ``rev`` reaches git only as a resolved commit.

    ``--base=--output=FILE`` must never become an option of ``git diff`` (git
    would write FILE): the revision is resolved with ``rev-parse --verify
    --end-of-options`` first and only its sha is passed on.
    """
    if not rev or rev.startswith("-") or any(c in rev for c in "\0\n\r"):
        raise ChangeError(f"--base {rev!r} is not a revision")
    try:
        sha = _git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}").strip()
    except ChangeError:
        raise ChangeError(f"--base {rev!r} is not a commit in this repository") from None
    if len(sha) not in (40, 64) or any(c not in "0123456789abcdef" for c in sha):
        raise ChangeError(f"--base {rev!r}: git rev-parse gave {sha!r}, not a commit id")
    out = _git("diff", "--name-only", "--no-ext-diff", "--no-textconv", f"{sha}...HEAD", "--")
    return [line for line in out.splitlines() if line.strip()]
