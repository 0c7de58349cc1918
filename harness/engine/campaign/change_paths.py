"""A change's entries and lines as CI lists and git diffs spell them.

``changed_from_file`` reads a changed-files list; ``normalise_entry`` turns whatever a CI system wrote into a changed-files list
into a path relative to the checkout, or refuses it by name; ``changed_lines``
asks git which lines of a file the working tree changed since the base, for
the gate's measurement of what ran (``diff_coverage``).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path, PurePosixPath

import os

from vmfuzz.harness.engine.campaign.changes import READ_CAP, ChangeError, Checkout, _git, _inside
from vmfuzz.harness.report.terminal import shown


#: Bytes of a --changed-files list; a real PR's list is kilobytes.
LIST_CAP = 16 << 20


def changed_from_file(path: str | Path, root: Path | str | None = None) -> list[str]:
    """One changed path per line, each normalised against ``root`` (``normalise_entry``).
    Only a regular file is read: a FIFO with no writer would block the gate forever,
    and /dev/zero never ends."""
    from vmfuzz.harness.model.validate import LimitError, read_input
    try:
        data = read_input(path, "--changed-files")
    except LimitError as exc:
        raise ChangeError(shown(str(exc))) from None
    if len(data) > LIST_CAP:
        raise ChangeError(f"--changed-files {shown(str(path))}: longer than {LIST_CAP >> 20} MiB")
    if b"\0" in data:
        raise ChangeError(f"--changed-files {shown(str(path))} holds NUL bytes, so it is not UTF-8 text "
                          "of one path per line")
    # A list saved by a Windows editor starts with a byte-order mark that would glue
    # itself to the first path and make it match nothing.
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    # Names as the filesystem spells them (undecodable bytes kept), so they can be read back.
    text = os.fsdecode(data)
    entries = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return list(dict.fromkeys(normalise_entry(e, root, path) for e in entries))


def normalise_entry(entry: str, root: Path | str | None, listed_in: str = "--changed-files") -> str:
    """A changed-files entry as a path relative to the checkout, with forward slashes.

    Lists come from every CI system there is: Windows separators, ``./`` prefixes
    and absolute paths inside the checkout all name a file the gate must see. A
    path that still names nothing inside the checkout (absolute elsewhere, or
    climbing out with ``..``) is refused, never dropped: a dropped file is a
    change the gate silently did not test.
    """
    path = entry.replace("\\", "/")
    if re.match(r"^[A-Za-z]:/", path) or path.startswith("/"):
        real_root = None
        if root is not None:
            try:
                real_root = Path(root).resolve()
            except (OSError, RuntimeError, ValueError):
                real_root = None
        rel = None
        if real_root is not None and path.startswith("/"):
            for candidate in (Path(path), _resolved(path)):
                if candidate is not None and candidate.is_relative_to(real_root):
                    rel = candidate.relative_to(real_root).as_posix()
                    break
        if rel is None:
            raise ChangeError(f"{listed_in}: entry {shown(entry)} is an absolute path outside the checkout "
                              f"{shown(str(root) if root is not None else '.')}; list paths relative to it")
        path = rel
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ChangeError(f"{listed_in}: entry {shown(entry)} does not name a file inside the checkout")
    return "/".join(parts)


def _resolved(path: str) -> Path | None:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError, ValueError):
        return None




_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


def hunk_lines(diff: str) -> frozenset[int]:
    """The new side's line numbers a ``git diff -U0`` touches.

    A pure deletion has no new line; the lines either side of the gap are what
    now runs in the deleted code's place, so they stand for it.
    """
    lines: set[int] = set()
    for row in diff.splitlines():
        m = _HUNK.match(row)
        if not m:
            continue
        start, count = int(m.group(1)), int(m.group(2) or 1)
        if count == 0:
            lines.update(n for n in (start, start + 1) if n > 0)
        else:
            lines.update(range(start, start + count))
    return frozenset(lines)


def changed_lines(checkout: Checkout, path: str) -> frozenset[int] | None:
    """The lines of ``path`` (relative to ``checkout.root``) that differ from ``checkout.base``
    in the working tree; every line of a file git does not track; None when no diff is known
    (no base) or the file is gone."""
    if checkout.root is None or checkout.base is None:
        return None
    real = _inside(checkout.root, path)
    if real is None:
        return None
    tracked = _git(checkout.root, "ls-files", "-z", "--", path)
    if not tracked.strip("\0") or not _at_base(checkout, path):
        try:
            with open(real, "rb") as f:
                text = f.read(READ_CAP).decode("utf-8", "replace")
        except OSError:
            return None
        moved = moved_lines(checkout, path, text)
        return moved if moved is not None else frozenset(range(1, text.count("\n") + 2))
    diff = _git(checkout.root, "diff", "-U0", "--no-color", "--no-renames", "--no-ext-diff",
                checkout.base, "--", path)
    return hunk_lines(diff)


def _at_base(checkout: Checkout, path: str) -> bool:
    try:
        _git(checkout.root, "cat-file", "-e", f"{checkout.base}:{path}")
    except ChangeError:
        return False
    return True


#: How alike a new file must be to a file the change modified or deleted to be read as its move.
MOVE_LIKENESS = 0.5
#: Candidates compared, at most: a move is among the few files a change edits.
MOVE_CANDIDATES = 64


def moved_lines(checkout: Checkout, path: str, text: str) -> frozenset[int] | None:
    """A new file's changed lines when it is a move: followed by content, the lines that differ from
    the most alike file the change modified or deleted (the old path may stay behind as a re-export);
    None when no such file is alike enough (a new file: every line is changed)."""
    import difflib
    new = text.splitlines()
    best, best_ratio = None, MOVE_LIKENESS
    for cand, old in _left_behind(str(checkout.root), checkout.base, PurePosixPath(path).suffix):
        if cand == path:
            continue
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        if matcher.real_quick_ratio() > best_ratio and matcher.quick_ratio() > best_ratio \
                and (ratio := matcher.ratio()) > best_ratio:
            best, best_ratio = matcher, ratio
    if best is None:
        return None
    lines: set[int] = set()
    for tag, _, _, j1, j2 in best.get_opcodes():
        if tag in ("replace", "insert"):
            lines.update(range(j1 + 1, j2 + 1))
        elif tag == "delete":  # the lines either side of the gap run in the deleted code's place
            lines.update(n for n in (j1, j1 + 1) if 0 < n <= len(new))
    return frozenset(lines)


@functools.lru_cache(maxsize=8)
def _left_behind(root: str, base: str, suffix: str) -> tuple[tuple[str, list[str]], ...]:
    """The files ending in ``suffix`` the change modified or deleted, with their text at ``base``:
    what a new file may have moved from. Read once per gate, however many files are new."""
    listed = _git(root, "diff", "--name-only", "-z", "--no-renames", "--diff-filter=DM", base, "--")
    out = []
    for cand in [c for c in listed.split("\0") if c and c.endswith(suffix)][:MOVE_CANDIDATES]:
        try:
            out.append((cand, _git(root, "cat-file", "blob", f"{base}:{cand}").splitlines()))
        except ChangeError:
            continue
    return tuple(out)
