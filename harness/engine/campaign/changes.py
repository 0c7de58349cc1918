"""Does a change touch verify-mask code? The gate's first, cheap question.

Two answers, either of which triggers the gate:

- the changed path matches ``VERIFY_MASK_PATTERNS``, a list of SGLang paths (as
  they appear in a diff of SGLang's repository) that allocate, size, fill,
  forward or write the target-verify tree mask;
- the file's text names verify-mask code (``MASK_CODE``), read from the code
  under test: the checkout the changed paths are relative to (``--repo``), the
  text before the change (the merge base of ``--base``, or, without one, the
  installed SGLang package the path maps onto). A file that is new, moved or
  deleted is judged the same way, so the list need not be kept in step with
  SGLang for the gate to notice a new backend that hands out the mask.

Only source files are read (``CODE_SUFFIXES``): documentation that mentions the
mask cannot break it, and a docs-only change must stay a skip that costs
seconds -- nothing on this path imports SGLang or torch.

Paths come from a user's file or a diff, so they are treated as hostile: a path
is read only when it resolves inside the root it is relative to and is a regular
file; reads are capped and binary-safe; a revision reaches git only after
``rev-parse --verify --end-of-options`` has turned it into a commit id.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import re
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from vmfuzz.harness.engine.campaign.covered_files import COVERED_BY_PROPERTIES
from vmfuzz.harness.report.terminal import shown

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

#: SGLang 0.5.23's files (sglang-relative) that name verify-mask code (``MASK_CODE``) or that
#: a property drives (``vmfuzz surface``) and that no pattern above matches. A workflow's
#: ``paths:`` filter decides before anything is read, so it names them, and the gate triggers
#: on each of them too (a driven file may name no mask code); tests/test_ci_workflow.py checks
#: none is missing.
NAMED_FOR_THE_WORKFLOW = (
    "kernels/jit/include/sgl_kernel/speculative/eagle.cuh",
    "kernels/ops/sampling/murmur_hash.py",  # driven: the seeded draft sampling's per-request hash (draft_seeded)
    "kernels/ops/speculative/__init__.py",
    "kernels/ops/speculative/cache_locs.py",  # driven: the draft and verify windows' KV slots
    "kernels/ops/speculative/multi_layer_eagle.py",  # driven: the multi-layer draft-extend prepare and id rotation
    "kernels/ops/speculative/pack_verify_mask.py",
    "kernels/ops/speculative/tree.py",
    "kernels/ops/speculative/uno_tree.py",
    "srt/layers/attention/deepseek_v4_backend.py",
    "srt/layers/attention/deepseek_v4_backend_hip_radix.py",
    "srt/layers/attention/dots_hybrid_backend.py",
    "srt/layers/attention/flashmla_backend.py",
    "srt/layers/attention/hybrid_attn_backend.py",
    "srt/layers/attention/hybrid_linear_attn_backend.py",
    "srt/layers/attention/qwen_sparse_attn_backend.py",
    "srt/layers/attention/tbo_backend.py",
    "srt/layers/attention/trtllm_mla_backend.py",
    "srt/distributed/__init__.py",  # imported by the KV driver: the tp group 0.5.19-0.5.20's sampler asks for
    "srt/layers/logits_processor.py",  # imported by the graph driver: the output its model stand-in returns
    "srt/mem_cache/allocation_sizing.py",  # driven: the decode allocation a draft writes inside
    "srt/mem_cache/kv_index_translator.py",  # driven: the draft graphs' KV read source (a static pool)
    "srt/mem_cache/unified_draft_pool.py",  # run: the window-pool translator asks whether its pool is a fused draft
    "srt/model_executor/cuda_graph_buffer_registry.py",  # driven: the graph replay's copy-in and padding
    "srt/model_executor/cuda_graph_config.py",  # imported by the draft-side drivers: the graph backend kinds
    "srt/model_executor/forward_batch_info.py",  # imported by the harness: the forward modes it hands in
    "srt/model_executor/forward_context.py",  # imported by the graph driver: how attention finds its backend
    "srt/model_executor/input_buffers.py",  # driven: the draft-side runners' process-wide buffer pool
    "srt/model_executor/runner/base_cuda_graph_runner.py",  # driven: the graph runner's bucket padding
    "srt/model_executor/runner/base_runner.py",  # driven: the graph runner's base
    "srt/model_executor/runner/decode_cuda_graph_runner.py",
    "srt/model_executor/runner/early_verify_metadata.py",  # driven: DSpark's early verify metadata (dspark_verify)
    "srt/model_executor/runner/metadata_glue_graph.py",  # driven: the verify metadata prep's glue graph
    "srt/model_executor/runner_backend/full_cuda_graph_backend.py",  # driven: the graph capture and replay
    "srt/model_executor/runner_backend/utils.py",  # driven: the draft-side runners pick their graph backend
    "srt/model_executor/runner_utils/buffers.py",  # driven: the graph runner's static buffers
    "srt/model_executor/runner_utils/capture_mode.py",  # driven: the draft runner's capture mode
    "srt/model_executor/runner_utils/pool.py",  # driven: the graph memory pool the capture opens
    "srt/sampling/sampling_batch_info.py",  # imported by the draft graph driver: the live batch's sampling info
    "srt/speculative/base_spec_worker.py",  # driven: the topk-1 chain buffers draft_forward returns
    "srt/speculative/dflash_utils.py",
    "srt/speculative/eagle_draft_cuda_graph_runner.py",  # driven: the draft-decode cuda graphs
    "srt/speculative/eagle_draft_extend_cuda_graph_runner.py",  # driven: the EAGLE v2 draft-extend graphs
    "srt/speculative/frozen_kv_mtp_info.py",  # imported by the harness: the frozen-KV MTP call site's input
    "srt/speculative/frozen_kv_mtp_worker_v2.py",
    "srt/speculative/multi_layer_eagle_draft_extend_cuda_graph_runner.py",  # driven: multi-layer draft extend
    "srt/speculative/multi_layer_eagle_utils.py",  # imported by its driver: the prepare forms it binds
    "srt/speculative/pp_spec_relay.py",  # driven (the pipeline-parallel relay), names no mask code
    "srt/speculative/ragged_verify.py",  # driven: FA3's ragged chain verify layout
    "srt/speculative/spec_utils.py",  # driven: the accepted tokens' KV moves
)


def workflow_path_filters() -> list[str]:
    """``VERIFY_MASK_PATTERNS`` spelled as a GitHub Actions ``paths:`` filter, then the files of
    ``NAMED_FOR_THE_WORKFLOW`` and ``COVERED_BY_PROPERTIES`` as they sit in SGLang's repository
    (``python/sglang/...``).

    The example workflow filters pull requests on these before it installs
    anything, and tests/test_ci_workflow.py checks its list equals this one.
    fnmatch's ``*`` crosses ``/`` (and a path is matched with a leading ``/``);
    in a GitHub filter only ``**`` does, so every ``*`` becomes ``**``.
    """
    named = [*NAMED_FOR_THE_WORKFLOW, *(rel for rel in COVERED_BY_PROPERTIES if rel not in NAMED_FOR_THE_WORKFLOW
                                        and not _matches_pattern(f"python/sglang/{rel}"))]
    return ([pat.replace("*", "**") for pat in VERIFY_MASK_PATTERNS]
            + [f"python/sglang/{rel}" for rel in dict.fromkeys(named)])


#: Names only verify-mask code uses: the struct, its layout enum, its sizing and
#: packing helpers, both writers and the buffer argument the call sites pass.
MASK_CODE = re.compile(rb"verify_mask|VerifyMask|tree_mask_numel|build_tree_kernel_efficient|"
                       rb"build_chain_tree|TreeMaskMode|tree_mask_buf|pack_verify_mask")
#: The longest name above, so a name split across two reads is still seen.
_LONGEST = 32

#: Files whose text is read: Python and the CUDA/C++ kernels.
CODE_SUFFIXES = (".py", ".pyi", ".pyx", ".cu", ".cuh", ".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp")

#: Bytes read from one file; SGLang's largest source file is well under 1 MiB.
READ_CAP = 8 << 20


class ChangeError(Exception):
    """The changed files could not be listed: exit 2."""


@dataclass(frozen=True)
class Checkout:
    """Where a changed path's text is read: ``root`` (the tree the paths are
    relative to; None: no checkout) and ``base`` (the commit whose text judges
    the path as it was, usually the merge base; None: the installed package)."""

    root: Path | None = None
    base: str | None = None


@dataclass(frozen=True)
class Trigger:
    path: str  # as the change listed it
    why: str  # "pattern", or where its text names verify-mask code


# -- reading text safely ------------------------------------------------------

def scan(read) -> bool:
    """``read(n) -> bytes`` until empty or READ_CAP: does the text name verify-mask code?"""
    tail, total = b"", 0
    while total < READ_CAP:
        chunk = read(min(1 << 20, READ_CAP - total))
        if not chunk:
            return False
        total += len(chunk)
        if MASK_CODE.search(tail + chunk):
            return True
        tail = chunk[-_LONGEST:]
    return False


def _inside(root: Path, rel: str) -> Path | None:
    """``root/rel`` resolved, or None when it leaves ``root`` (``..``, absolute, a link out)."""
    try:
        real_root = root.resolve(strict=True)
        real = (real_root / rel).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # missing, a link loop, a NUL in the name
        return None
    return real if real.is_relative_to(real_root) else None


def path_names_mask_code(path: Path) -> bool | None:
    """True/False for a regular file (links followed); None when there is none to read."""
    try:
        # O_NONBLOCK: a FIFO put where a file was expected must not hang the gate.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except (OSError, ValueError):
        return None
    with os.fdopen(fd, "rb", buffering=0) as f:
        try:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            return scan(f.read)
        except OSError:
            return None


def file_names_mask_code(root: Path, rel: str) -> bool | None:
    """``rel`` read inside an untrusted tree ``root`` (a checkout under review): never outside it."""
    path = _inside(root, rel)
    return None if path is None else path_names_mask_code(path)


def _git(root: Path | str, *args: str) -> str:
    """One git command's stdout (text); raises ChangeError with git's first line."""
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True,
                             stdin=subprocess.DEVNULL, timeout=120)
    except FileNotFoundError:
        raise ChangeError("--base needs git on PATH") from None
    except subprocess.TimeoutExpired:
        raise ChangeError(f"git {args[0]} did not answer within 120 s") from None
    except (ValueError, OSError) as exc:  # a NUL in an argument, an unusable --repo
        raise ChangeError(f"git {args[0]} failed: {exc}") from None
    except subprocess.CalledProcessError as exc:
        msg = exc.stderr.decode("utf-8", "replace").strip().splitlines()
        # git's own first line; a git that said nothing (--quiet) gets its status, never Python's repr
        err = ChangeError(f"git {args[0]} failed: {shown(msg[0])}" if msg
                          else f"git {args[0]} exited with status {exc.returncode}")
        err.silent = not msg
        raise err from None
    return os.fsdecode(out.stdout)


def blob_names_mask_code(root: Path, commit: str, rel: str) -> bool | None:
    """The path's text at ``commit`` (a verified id); None when it has none there."""
    if rel.startswith("/") or "\0" in rel or "\n" in rel:
        return None
    try:
        proc = subprocess.Popen(["git", "-C", str(root), "cat-file", "blob", f"{commit}:{rel}"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except (OSError, ValueError):
        return None
    try:
        hit = scan(proc.stdout.read)
    finally:
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
        rc = proc.wait()
    return hit if hit or rc == 0 else None


# -- mapping a changed path onto SGLang ----------------------------------------

def sglang_relative(path: str) -> str | None:
    """``python/sglang/srt/x.py`` or ``sglang/srt/x.py`` -> ``srt/x.py``; None for a non-SGLang path."""
    parts = PurePosixPath(path.replace("\\", "/")).parts
    if "sglang" not in parts:
        return None
    # a checkout vendored inside another (third_party/sglang/python/sglang/...): the package is the
    # last python/sglang, else the first sglang folder
    at = max((i for i in range(1, len(parts)) if parts[i - 1:i + 1] == ("python", "sglang")),
             default=parts.index("sglang"))
    rest = parts[at + 1:]
    if not rest or any(p in ("..", "/") for p in rest):
        return None
    return "/".join(rest)


def installed_sglang() -> Path | None:
    """The installed package's folder, found without importing it (its import costs ~20 s)."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    locations = list(getattr(spec, "submodule_search_locations", None) or [])
    return Path(locations[0]) if locations else None


def sglang_checkout(start: str | Path) -> Path | None:
    """The SGLang checkout ``start`` lies in (a folder holding ``python/sglang/__init__.py``),
    looked for from ``start`` up to its repository's root; None when there is none."""
    try:
        here = Path(start).resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    for folder in (here, *here.parents):
        try:
            if (folder / "python" / "sglang" / "__init__.py").is_file():
                return folder
            if (folder / ".git").exists():
                return None  # the repository ends here: an SGLang further up is not this one's
        except OSError:
            return None
    return None


# -- the decision ---------------------------------------------------------------

def _matches_pattern(path: str) -> bool:
    norm = "/" + path.replace("\\", "/").lstrip("./")
    return any(fnmatch.fnmatchcase(norm, pat) for pat in VERIFY_MASK_PATTERNS)


_AUTO = object()


def triggers(paths: list[str], checkout: Checkout | None = None, package=_AUTO) -> list[Trigger]:
    """The changed paths that trigger the gate, each with why.

    ``package``: the SGLang folder that stands in for the text before the change
    when there is no base commit (default: the installed package; None: none).
    """
    checkout = checkout or Checkout()
    if package is _AUTO:
        package = installed_sglang() if any(p.endswith(CODE_SUFFIXES) for p in paths) else None
    out = []
    for path in paths:
        if _matches_pattern(path):
            out.append(Trigger(path, "pattern"))
            continue
        if sglang_relative(path) in COVERED_BY_PROPERTIES:
            # measured: the gate's own properties ran this file's code on the release
            out.append(Trigger(path, "ran under a property (covered_files)"))
            continue
        if sglang_relative(path) in NAMED_FOR_THE_WORKFLOW:
            # A file a property drives may name no mask code at all (the pp relay): the gate
            # starts on exactly the files the workflow starts it for, never skips one of them.
            out.append(Trigger(path, "driven or named (listed)"))
            continue
        if not path.endswith(CODE_SUFFIXES):
            continue
        # The text after the change, then the text before it: a change that
        # removes the last mention of the mask from a file is still a mask change.
        if checkout.root is not None and file_names_mask_code(checkout.root, path):
            out.append(Trigger(path, "names verify-mask code"))
        elif checkout.root is not None and checkout.base and blob_names_mask_code(checkout.root,
                                                                                 checkout.base, path):
            out.append(Trigger(path, f"named verify-mask code at {checkout.base[:12]}"))
        elif not checkout.base and package is not None and (rel := sglang_relative(path)) \
                and path_names_mask_code(package / rel):
            out.append(Trigger(path, "names verify-mask code in the installed sglang"))
    return out


def touches_verify_mask(paths: list[str], checkout: Checkout | None = None, package=_AUTO) -> list[str]:
    """The changed paths that trigger the gate (see ``triggers``)."""
    return [t.path for t in triggers(paths, checkout, package)]


# -- listing the change ---------------------------------------------------------

def checkout_at(repo: str | Path) -> Checkout:
    """The checkout for ``--changed-files``: the folder the paths are relative to."""
    root = Path(repo)
    if not root.is_dir():
        raise ChangeError(f"--repo {shown(str(repo))}: not a directory")
    return Checkout(root=root)


def changed_since(rev: str, repo: str | Path = ".") -> tuple[list[str], Checkout]:
    """Paths changed between ``rev``'s merge base with HEAD and the working tree, and where to read them.

    ``--base=--output=FILE`` must never become an option of git (git would write
    FILE): the revision is resolved with ``rev-parse --verify --end-of-options``
    and only the commit id it gives is passed on.
    """
    if not rev or rev.startswith("-") or any(c in rev for c in "\0\n\r"):
        raise ChangeError(f"--base {shown(repr(rev))} is not a revision")
    try:
        commit = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}").strip()
    except ChangeError as exc:
        # rev-parse --quiet says nothing for a name that is no commit: that is the whole story
        why = "" if getattr(exc, "silent", False) else f" ({exc})"
        raise ChangeError(f"--base {shown(repr(rev))} is not a commit in {shown(str(repo))}{why}") from None
    if not re.fullmatch(r"[0-9a-f]{40,64}", commit):
        raise ChangeError(f"--base {rev!r} is not a commit in {shown(str(repo))}")
    top = Path(_git(repo, "rev-parse", "--show-toplevel").strip())
    base = _git(top, "merge-base", commit, "HEAD").strip()
    # The gate tests the working tree, so the change is the working tree against the
    # merge base: commits on the branch, staged and unstaged edits, and new files git
    # does not ignore. --no-renames: a move lists the old path too, judged by its old text.
    out = _git(top, "diff", "--name-only", "--no-renames", "-z", base, "--")
    new = _git(top, "ls-files", "--others", "--exclude-standard", "-z")
    paths = [p for p in out.split("\0") if p.strip()] + [p for p in new.split("\0") if p.strip()]
    return list(dict.fromkeys(paths)), Checkout(root=top, base=base)
