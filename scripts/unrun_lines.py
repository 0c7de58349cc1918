"""Which lines of the mask's path the gate never runs on the installed SGLang, and under what branch.

    python scripts/unrun_lines.py [--work DIR] [--out FILE]

Lays the installed SGLang out as a checkout in which every file is new (so every
line counts as changed), runs ``vmfuzz gate --target sglang --base HEAD`` on it,
and tabulates what the gate measured: each mask-path statement no property ran,
grouped by its function and the innermost branch condition it sits under (the
condition no case the gate ran made true), and the off-path branches it named.
docs/unrun-lines.md keeps the table for the release vmfuzz is written against.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def checkout_of_everything(work: Path) -> Path:
    """A git checkout whose one commit is empty and whose python/sglang is the installed package."""
    package = Path(find_spec("sglang").origin).parent
    repo = work / "checkout"
    shutil.copytree(package, repo / "python" / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    # an untagged checkout with no static version is of unknown version, and the shipped known
    # entries (upstream's defects, each for a range of releases) stop applying: the gate would
    # end a property's search at its known defect and the table would miss what it runs after
    from importlib.metadata import version
    (repo / "python" / "pyproject.toml").write_text(
        f'[project]\nname = "sglang"\nversion = "{version("sglang")}"\n')
    env = dict(os.environ, GIT_AUTHOR_NAME="vmfuzz", GIT_AUTHOR_EMAIL="vmfuzz@localhost",
               GIT_COMMITTER_NAME="vmfuzz", GIT_COMMITTER_EMAIL="vmfuzz@localhost")
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "empty"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)
    return repo


def surface_functions() -> dict[str, set[str]]:
    """sglang-relative file -> the functions ``vmfuzz surface`` lists there (driven or not)."""
    from vmfuzz.harness.engine.campaign import surface
    out: dict[str, set[str]] = {}
    for e in [*surface.declared(), *surface.not_driven()]:
        out.setdefault(e.file, set()).add(e.function)
    return out


def _within(function: str, listed) -> bool:
    """``function`` is a listed one or nested in one (a closure, a method of a listed class)."""
    return any(function == f or function.startswith(f + ".") for f in listed)


def table(summary: dict) -> list[str]:
    from vmfuzz.harness.engine.campaign.diff_coverage import parse
    from vmfuzz.harness.report.terminal import spans
    out = ["| file (sglang/) | function | branch never taken on the gate's cases | kind | statements | lines |",
           "|---|---|---|---|---:|---|"]
    off, counts = [], {"not driven here": 0, "needs a GPU": 0, "judged": 0}
    on_surface = surface_functions()
    for record in (summary.get("gate") or {}).get("lines") or []:
        if not record.get("traced"):
            continue
        rel = record["path"].split("python/sglang/", 1)[-1]
        source = parse(Path(record["traced"]).read_text(encoding="utf-8", errors="replace"))

        def mask_path(n: int) -> bool:
            st = source.statement_at(n)
            return bool(st) and _within(st.function, on_surface.get(rel, ()))
        why = record.get("why_never_ran") or {}

        def off_path(n: int) -> bool:  # another forward mode's branch: listed apart, as before
            return "off the mask's path" in str(why.get(str(n), why.get(n, "")))
        groups: dict[tuple[str, str, str], list[int]] = {}
        for kind, lines in (("not driven here", record.get("never_ran") or []),
                            ("needs a GPU", record.get("needs_device") or [])):
            # the gate traces every changed file; the table is of the surface's functions only
            lines = [n for n in lines if mask_path(n) and not off_path(n)]
            counts[kind] += len(lines)
            for n in lines:
                st = source.statement_at(n)
                cond = (st.conditions[-1] if st and st.conditions
                        else "(no branch: the function never ran, or left before this line)")
                groups.setdefault((st.function if st else "?", cond, kind), []).append(n)
        counts["judged"] += sum(1 for n in (record.get("judged") or {}) if mask_path(int(n)))
        for (fn, cond, kind), lines in sorted(groups.items()):
            out.append(f"| `{rel}` | `{fn}` | `{cond}` | {kind} | {len(lines)} | {spans(lines)} |")
        off += [f"{rel}:{n}" for n in why if off_path(int(n)) and mask_path(int(n))]
    on_path = sum(counts.values())
    head = [f"Mask-path statements the gate's properties ran: {counts['judged']} of {on_path}; never ran: "
            f"{counts['not driven here']} not driven here (vmfuzz's to drive), {counts['needs a GPU']} needing a GPU.", ""]
    return head + out + ["", f"{len(off)} statements of mask-path functions named off the mask's path "
                             "(other forward modes; `diff_coverage.OFF_MASK_PATH`)."]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="unrun_lines.py")
    ap.add_argument("--work", type=Path, default=None, help="where the checkout and the report go")
    ap.add_argument("--out", type=Path, default=None, help="also write the table to FILE")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="vmfuzz-unrun-"))
    repo = checkout_of_everything(work)
    report = work / "report"
    proc = subprocess.run([sys.executable, "-m", "vmfuzz", "gate", "--target", "sglang", "--base", "HEAD",
                           "--repo", str(repo), "--report-dir", str(report)],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)
    if not (report / "summary.json").is_file():
        sys.exit(f"unrun_lines: the gate wrote no summary (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    lines = table(json.loads((report / "summary.json").read_text()))
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    print(f"unrun_lines: the gate exited {proc.returncode}; its reports are in {report}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
