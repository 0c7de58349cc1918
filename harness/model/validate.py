"""The edge checks: every input from outside meets ``vmfuzz.harness.model.limits`` here, before use.

Each check raises ``LimitError`` (a ``ValueError``) whose message names the field
and the limit; the loaders turn it into their own exit-2 error.
"""

from __future__ import annotations

import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from vmfuzz.harness.model import limits
from vmfuzz.harness.model.config import Batch, Config, num_candidates

T = TypeVar("T")


class LimitError(ValueError):
    """An input outside ``vmfuzz.harness.model.limits`` (or not a readable regular file)."""


def read_input(path: str | Path, what: str = "file") -> bytes:
    """The bytes of a regular file of at most MAX_FILE_BYTES, read once.

    A FIFO would block, /dev/zero never ends and a second read of a pipe sees
    nothing: only a regular file is accepted.
    """
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise LimitError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise LimitError(f"{what} {path} is {kind}")
    if st.st_size > limits.MAX_FILE_BYTES:
        raise LimitError(f"{what} {path} has {st.st_size} bytes, over MAX_FILE_BYTES ({limits.MAX_FILE_BYTES})")
    try:
        with open(path, "rb") as fh:
            data = fh.read(limits.MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise LimitError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > limits.MAX_FILE_BYTES:
        raise LimitError(f"{what} {path} is over MAX_FILE_BYTES ({limits.MAX_FILE_BYTES})")
    return data


def repeated_key(data: bytes) -> str | None:
    """The first key an object of this JSON repeats, or None (also for JSON that does not
    parse: the decoder says why). msgspec keeps the last of a repeated key silently, so
    a file that says ``d`` twice would be read as something its author may not have meant."""
    import json
    found: list[str] = []

    def pairs(items):
        seen = set()
        for key, _ in items:
            if key in seen and not found:
                found.append(key)
            seen.add(key)
        return {}  # the values are not needed, only the keys of each object

    try:
        json.loads(data, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    return found[0] if found else None


def load_file(path: str | Path, what: str, decode: Callable[[bytes, Path], T], error: type[Exception]) -> T:
    """Read ``path`` within the file limits and decode it; a limit is ``error`` with one line."""
    path = Path(path)
    try:
        data = read_input(path, what)
    except LimitError as exc:
        raise error(str(exc)) from None
    return decode(data, path)


def _cap(field: str, value: int, limit: int, name: str) -> None:
    if value > limit:
        raise LimitError(f"{field} = {value} is over {name} ({limit}, harness/model/limits.py)")


CONFIG_FIELDS = {"max_bs": "config.max_bs", "max_context_len": "config.max_context_len",
                 "num_draft_tokens": "config.num_draft_tokens", "topk": "config.topk",
                 "spec_steps": "config.spec_steps"}


def check_config(config: Config, fields: dict[str, str] | None = None) -> Config:
    """Arithmetic limits of one configuration: what even the capacity check can take."""
    f = {**CONFIG_FIELDS, **(fields or {})}
    _cap(f["max_bs"], config.max_bs, limits.MAX_REQUESTS, "MAX_REQUESTS")
    _cap(f["max_context_len"], config.max_context_len, limits.MAX_CONTEXT_LEN, "MAX_CONTEXT_LEN")
    _cap(f["num_draft_tokens"], config.num_draft_tokens, limits.MAX_DRAFT_TOKENS, "MAX_DRAFT_TOKENS")
    _cap(f["topk"], config.topk, limits.MAX_TOPK, "MAX_TOPK")
    _cap(f["spec_steps"], config.spec_steps, limits.MAX_SPEC_STEPS, "MAX_SPEC_STEPS")
    _cap(f"candidates of {f['topk']} x {f['spec_steps']}", num_candidates(config.topk, config.spec_steps),
         limits.MAX_CANDIDATES, "MAX_CANDIDATES")
    _cap(f"buffer cells at {f['max_bs']}", buffer_cells(config), limits.MAX_ARITHMETIC_CELLS,
         "MAX_ARITHMETIC_CELLS")
    return config


def buffer_cells(config: Config, bs: int | None = None) -> int:
    """Worst-case cells of ``bs`` requests (default: the captured max_bs) in ``config``'s layout."""
    from vmfuzz.harness.model.layouts import worst_case_size
    return worst_case_size(config.mode, config.max_bs if bs is None else bs, config.d, config.max_context_len)


def check_case(config: Config, batches: Sequence[Batch], prop: str) -> None:
    """Limits of one replayed case; a property that allocates also gets the memory limits."""
    check_config(config)
    if len(batches) > limits.MAX_STEPS:
        raise LimitError(f"batches has {len(batches)} steps, over MAX_STEPS ({limits.MAX_STEPS})")
    for i, b in enumerate(batches):
        _cap(f"len(batches[{i}].seq_lens)", b.bs, limits.MAX_REQUESTS_PER_STEP, "MAX_REQUESTS_PER_STEP")
    if not limits.allocates(prop):
        return
    from vmfuzz.harness.model.layouts import logical_size
    cells = buffer_cells(config)
    if cells > limits.MAX_BUFFER_CELLS:
        raise LimitError(f"property {prop} allocates the verify mask for config.max_bs: {cells} cells, over "
                         f"MAX_BUFFER_CELLS ({limits.MAX_BUFFER_CELLS}, harness/model/limits.py); only "
                         f"{', '.join(sorted(limits.ARITHMETIC_PROPERTIES))} replay at that size")
    total = 0
    for i, b in enumerate(batches):
        need = logical_size(config.mode, b.seq_lens, config.d)
        if need > limits.MAX_BUFFER_CELLS:
            raise LimitError(f"batches[{i}] needs a {need}-cell fallback buffer, over MAX_BUFFER_CELLS "
                             f"({limits.MAX_BUFFER_CELLS}, harness/model/limits.py)")
        total += max(need, cells)
    if total > limits.MAX_CASE_CELLS:
        raise LimitError(f"the {len(batches)} steps of batches touch {total} cells in all, over MAX_CASE_CELLS "
                         f"({limits.MAX_CASE_CELLS}, harness/model/limits.py)")


def number(option: str, value, *, low: float, high: float, integer: bool = False, low_open: bool = False):
    """A command-line number that is finite and inside [low, high] (``low_open``: (low, high])."""
    if value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        raise LimitError(f"{option} must be a finite number, got {value}")
    if (value <= low if low_open else value < low) or value > high:
        lo = f"({low:g}" if low_open else f"[{low:g}"
        raise LimitError(f"{option} must be in {lo}, {high:g}], got {value:g}")
    return int(value) if integer else value


def ready_dir(path: str | Path, what: str) -> Path:
    """``usable_dir`` for a command: a folder that cannot be used is one line (exit 2)."""
    from vmfuzz.harness.model.errors import UsageError
    try:
        return usable_dir(path, what)
    except LimitError as exc:
        raise UsageError(f"vmfuzz: {exc}") from None


def not_a_folder(path: Path, what: str) -> tuple[str, ...]:
    """The warning for ``path`` that should be a folder and is something else (a FIFO, a file):
    whatever reads or saves there is skipped, which must show, never pass in silence."""
    if not os.path.lexists(path) or path.is_dir():
        return ()
    return (f"{what} {path} is not a directory: skipped, never opened (nothing read or saved there)",)


def usable_dir(path: str | Path, what: str) -> Path:
    """Create ``path`` if needed and prove a file can be written in it, before any work is done."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".vmfuzz-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise LimitError(f"{what} {path} is not usable: {exc.strerror or exc}") from None
    return path


_FALLBACK: Path | None = None


def fallback_dir() -> Path:
    """Where a finding goes when its own directory broke mid-run: ~/.cache/vmfuzz, else a tempdir.

    One per process, so a run's repros and reports end up side by side.
    """
    global _FALLBACK
    if _FALLBACK is not None and _FALLBACK.is_dir():
        return _FALLBACK
    _FALLBACK = _new_fallback_dir()
    return _FALLBACK


def _new_fallback_dir() -> Path:
    import datetime as dt
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vmfuzz" / "fallback" / stamp
    try:
        return usable_dir(base, "fallback directory")
    except LimitError:
        return Path(tempfile.mkdtemp(prefix=f"vmfuzz-fallback-{stamp}-"))


def server_problem(config: Config) -> str | None:
    """Why no SGLang server could run with ``config``, or None when one could.

    ``Config.validate`` accepts every case the arithmetic can take (a context of
    0, a topk-1 tree wider than its steps); a server cannot have those. What
    SGLang's argument handling settles before a server starts: at least one
    captured request; with topk 1 the draft is a chain, so its width is the step
    count plus one; and a model's context holds at least one verify pass of the
    draft. A minimized repro stays inside these, so its config is one a server
    could really run.
    """
    if config.max_bs < 1:
        return f"max_bs {config.max_bs}: a server captures at least one request"
    if config.max_context_len < max(1, config.num_draft_tokens):
        return (f"max_context_len {config.max_context_len} is below the {config.num_draft_tokens} draft "
                "tokens one verify pass appends: no model's context is that short")
    if not config.trivial and config.topk == 1 and config.num_draft_tokens != config.spec_steps + 1:
        return (f"topk 1 with spec_steps {config.spec_steps} drafts a chain of {config.spec_steps + 1} tokens, "
                f"not num_draft_tokens {config.num_draft_tokens} (SGLang sets it to spec_steps + 1)")
    return None
