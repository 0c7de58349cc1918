"""New means not on the base: which known findings a gate may excuse, decided on the base's code.

A known entry (``known/``) says a defect is upstream's. In a gate with a base,
what the pull request says of itself (its version, which picks an entry's
range) must never decide what is excused: a PR that reverts a fix and lowers
its version would have its regression listed as known. So, as OSS-Fuzz's
CIFuzz rules a PR's crash new unless it reproduces on the base, an entry is
excused in a gate only when its repro fails, the way the entry says, on the
``--base`` code, replayed in a fresh process that imports the base's SGLang
and nothing of the PR's. Where the base cannot say (its SGLang does not load),
the ranges decide, as without a base, and the summary says so; a gate of the
installed package (no checkout) has no base code to ask. Whatever its version range says, both ways: an entry
out of range still excuses a defect the base has (a checkout past a release tag
describes itself as a later version), and one in range excuses nothing the
base does not show. Without a base (``run``, a nightly), ranges apply as before.

    python -m vmfuzz.harness.engine.regression.known_on_base BASE_PYTHON_DIR ENTRY.json...

(the child) prints one JSON line per entry: its path, the replay's status, and
whether the entry's origin patterns match what the replay failed with.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

#: seconds the base's process may take for its import and every entry's replay
BASE_TIMEOUT = 600.0


@dataclass
class BaseVerdict:
    """What the base said of the entries a gate could excuse."""

    base: str
    #: entry path -> True (fails on the base as the entry says), False (holds there), or None: the
    #: base cannot say whether it has this one (another defect it has fails the case first, or vmfuzz
    #: cannot replay the entry on the base's release); that entry's version range decides
    reproduces: dict[str, bool | None] = field(default_factory=dict)
    #: why the base could say nothing (its SGLang does not load, the replay process failed): then the
    #: entries' version ranges decide, as without a base (the base is not the PR's to change)
    failed: str | None = None

    def said(self, path: Path) -> bool | None:
        return self.reproduces.get(str(path), False)

    def excused(self, found: list[tuple[Path, object]], in_range=()) -> list[tuple[Path, object]]:
        """The entries a gate excuses: those the base fails the same way, and those whose repro the
        base fails another way when their version range (``in_range``: the plan's) holds them."""
        ranged = {str(p) for p, _ in in_range}
        return [(p, k) for p, k in found if self.said(p) or (self.said(p) is None and str(p) in ranged)]

    def note(self, found: list[tuple[Path, object]]) -> str:
        """One line for the summary: which rule decided what is known, and what it decided."""
        if self.failed:
            return (f"known findings: the base {self.base[:12]} could not replay them ({self.failed}); version "
                    "ranges decide what is known, as without a base")
        kept = [k.name for p, k in found if self.said(p)]
        dropped = [k.name for p, k in found if self.said(p) is False]
        masked = [k.name for p, k in found if self.said(p) is None]
        return (f"known findings: judged on the base {self.base[:12]}, not on versions (a finding is new unless "
                f"the base fails the same way): reproduce there: {', '.join(kept) or 'none'}; "
                f"do not: {', '.join(dropped) or 'none'}"
                + (f"; the base cannot say (it fails their repro another way, or vmfuzz cannot replay it there), "
                   f"so their version ranges decide: {', '.join(masked)}"
                   if masked else ""))


#: the child's status for an entry whose property vmfuzz does not drive on the base's release
NOT_DRIVEN = "not driven"


def _said(d: dict) -> bool | None:
    """One child line as the base's answer: failed as the entry says (True), held (False), or cannot say
    (None: failed another way, or a replay vmfuzz could not make there), when the entry's range decides."""
    if d["status"] == "failed":
        return d["matches"] or None
    return None if d["status"] in (NOT_DRIVEN, "out of step") else False


class Pending:
    """The base's replay, started early so that it imports SGLang while the gate imports the PR's."""

    def __init__(self, base: str, proc: subprocess.Popen | None, scratch: Path, failed: str | None = None):
        self.base, self.proc, self.scratch, self.failed = base, proc, scratch, failed

    def result(self, timeout: float = BASE_TIMEOUT) -> BaseVerdict:
        """The base's answer, waited for at most ``timeout`` and never past a gate's time cap: a base the
        cap stops is could not check (``clock.cut``), and the entries' ranges decide meanwhile."""
        from vmfuzz.harness.engine.core import clock
        try:
            if self.failed or self.proc is None:
                return BaseVerdict(self.base, failed=self.failed or "no replay process")
            try:
                out, err = self.proc.communicate(timeout=clock.bounded(timeout))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()
                if clock.reached():
                    clock.cut(f"the time cap of {clock.cap():g} s was reached before the base {self.base[:12]} "
                              "had replayed the known entries, so which are known was not decided on the base")
                    return BaseVerdict(self.base, failed="the gate's time cap was reached first")
                return BaseVerdict(self.base, failed=f"no answer within {timeout:g}s")
            said = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            if self.proc.returncode or any("failed" in d for d in said):
                why = next((d["failed"] for d in said if "failed" in d), None) or \
                    (err.strip().splitlines() or [f"exit {self.proc.returncode}"])[-1]
                return BaseVerdict(self.base, failed=why)
            return BaseVerdict(self.base, {d["path"]: _said(d) for d in said})
        finally:
            remove_later(self.scratch)

    def cancel(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        remove_later(self.scratch)


def remove_later(scratch: Path) -> None:
    from vmfuzz.harness.engine.regression.base_code import remove_later as removal
    removal(scratch)


def start(checkout_root: Path, base: str, entry_paths: list[Path]) -> Pending:
    """The base's ``python/`` taken out of git (nothing of the user's checkout or its worktrees is
    touched) and a fresh process replaying ``entry_paths`` on it, started now."""
    from vmfuzz.harness.engine.regression.base_code import start_on_base
    scratch = Path(tempfile.mkdtemp(prefix="vmfuzz-base-"))
    proc, failed = start_on_base(checkout_root, base, scratch, __name__, list(map(str, entry_paths)))
    return Pending(base, proc, scratch, failed)


def _names_a_piece(entry, pieces: dict[str, str]) -> bool:
    """Whether every writer ``entry``'s origins name is a piece the base's target cannot drive (named by
    the words the target gives it): the defect is that piece's alone."""
    writers = [w for p in entry.origins for w in (p.writer if isinstance(p.writer, list) else [p.writer])]
    return bool(writers) and all(w and any(piece in w for piece in pieces) for w in writers)


def _child(python_dir: Path, paths: list[Path]) -> int:
    """In the fresh process: the base's SGLang imported from ``python_dir`` alone, each entry replayed."""
    from vmfuzz.harness.engine.regression.base_code import load_base
    from vmfuzz.harness.engine.regression.regressions import outcome_of
    from vmfuzz.harness.model.known_file import load
    try:
        target = load_base(python_dir)
    except Exception as exc:  # noqa: BLE001 - the base not loading: nothing can be excused, said why
        print(json.dumps({"failed": f"the base's SGLang does not load: {type(exc).__name__}: {exc}"[:300]}))
        return 0
    from vmfuzz.harness.engine.regression.replay import NotDriven
    pieces = getattr(target, "pieces_not_driven", dict)()
    for path in paths:
        entry = load(path)
        if _names_a_piece(entry, pieces):
            # its repro's case runs there without the piece the defect is of: a hold would say nothing
            print(json.dumps({"path": str(path), "status": NOT_DRIVEN, "matches": None}), flush=True)
            continue
        try:
            got = outcome_of(entry.repro, target, "cpu", False, 120.0)
        except NotDriven:
            # vmfuzz cannot drive this entry's property on the base's release (an older one): the base
            # cannot say, for this entry alone; the others are still asked
            print(json.dumps({"path": str(path), "status": NOT_DRIVEN, "matches": None}), flush=True)
            continue
        print(json.dumps({"path": str(path), "status": got.status, "matches": entry.matches(got.origin)}),
              flush=True)
    return 0


if __name__ == "__main__":
    import warnings
    warnings.simplefilter("ignore")
    sys.exit(_child(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]))
