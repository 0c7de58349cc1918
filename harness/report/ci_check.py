"""What a PR's required check says: the gate's exit code, turned into the CI job's pass or fail.

    python -m vmfuzz.harness.report.ci_check --exit-code RC --report-dir DIR [--label NAME] [--out FILE]

The example workflow (examples/sglang-verify-mask-gate.yml) runs the gate, keeps its
exit code, and leaves the job's outcome to this module, so the rule lives in code
that tests run on every exit code instead of in YAML. GitHub counts a neutral or
skipped check as a pass for a required check, so exit 3 (could not check) fails the
job here, and the job's summary names the lines the gate could not check, those that
need a GPU apart from those vmfuzz does not drive on this runner (read from the
gate's summary.json).

A maintainer may accept exit 3, and only exit 3, with a label on the PR
(``vmfuzz-accept-unchecked``): the job then passes, and the summary says who added
the label. The label vouches only for code it saw: it counts when adding it started
this run, or when the PR's events show it added after the code under test arrived
(the first workflow run for the head commit, or a later force-push). Whatever cannot
be read is said, and never counts as accepted. A finding (1), bad usage or set-up
(2) and any other code (a kill, an interrupt, a gate that never ran) always fail.

The markdown goes to ``$GITHUB_STEP_SUMMARY`` (and ``--out``, for the PR comment);
the first line of a failure is also a ``::error::`` annotation on the run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from vmfuzz.harness.model.errors import EXIT_COULD_NOT_CHECK, EXIT_FINDING, EXIT_OK, EXIT_USAGE

LABEL = "vmfuzz-accept-unchecked"
#: the words the gate's own could-not-check lines use for a line no CPU runs
NEEDS_GPU = "needs a GPU"
#: events on which the head commit may have just arrived: a label older than the run cannot vouch for it
PUSHES = ("opened", "synchronize", "reopened")


@dataclass(frozen=True)
class Acceptance:
    """Whether a maintainer accepted this run's exit 3, who (None: could not be read), and how it was read."""

    accepted: bool
    by: str | None = None
    note: str = ""


def unchecked(summary: dict | None) -> dict[str, list[str]]:
    """The gate's lines it could not check, by why: a GPU's, this runner's, vmfuzz out of step."""
    gate = (summary or {}).get("gate") or {}
    lines = list(gate.get("could_not_check") or [])
    gpu = set(gate.get("needs_gpu") or [line for line in lines if NEEDS_GPU in line])
    return {"Needs a GPU": [w for w in lines if w in gpu],
            "Not driven here": [w for w in lines if w not in gpu],
            "vmfuzz out of step": list(gate.get("out_of_step") or [])}


def _said(summary: dict | None) -> tuple[str, str, int | None]:
    """(headline, why, exit code) as summary.json carries them, for a search's summary or a command's."""
    v = (summary or {}).get("verdict")
    if isinstance(v, dict):
        return v.get("headline", ""), v.get("why", ""), v.get("exit_code")
    if summary and isinstance(v, str):  # a command's summary: a skipped gate, a checkout that cannot load
        return summary.get("verdict_kind", v), summary.get("headline", ""), summary.get("exit_code")
    return "", "", None


def _section(title: str, lines: list[str]) -> list[str]:
    return ([f"**{title}** ({len(lines)}):", ""] + [f"- {w}" for w in lines] + [""]) if lines else []


def _could_not_check(summary: dict | None, acceptance: Acceptance) -> tuple[int, list[str]]:
    headline, why, _ = _said(summary)
    kinds = unchecked(summary)
    if acceptance.accepted:
        who = f"@{acceptance.by}" if acceptance.by else "a maintainer (who added the label could not be read)"
        head = f"## vmfuzz gate: {headline or 'could not check'}; accepted by {who} (label `{LABEL}`)"
        code = EXIT_OK
    else:
        head = f"## vmfuzz gate: {headline or 'could not check'}; the required check fails (exit 3)"
        code = EXIT_COULD_NOT_CHECK
    out = [head, ""] + ([why, ""] if why else [])
    for title, lines in kinds.items():
        out += _section(title, lines)
    if not any(kinds.values()):
        out += ["The gate named no line; summary.md and the report folder say what it could not check.", ""]
    if acceptance.note:
        out += [acceptance.note, ""]
    if not acceptance.accepted:
        out += [f"A maintainer who accepts these as unchecked adds the label `{LABEL}` to the PR after its "
                "latest push; the job then passes and this summary names who did.", ""]
    return code, out


def verdict(rc: int | None, summary: dict | None, acceptance: Acceptance = Acceptance(False),
            labelled: bool = False) -> tuple[int, str]:
    """(the job's exit status, its summary in markdown) for the gate's exit code ``rc`` (None: the
    gate step left none), its summary.json (None: it wrote none), a maintainer's ``acceptance``
    (read for exit 3 alone) and whether the PR carries the label (``labelled``)."""
    headline, why, said = _said(summary)
    label_note = [f"The label `{LABEL}` accepts exit 3 only; it never passes this.", ""] if labelled else []
    if rc == EXIT_COULD_NOT_CHECK:
        code, out = _could_not_check(summary, acceptance)
    elif rc == EXIT_OK and said not in (None, EXIT_OK):
        code, out = EXIT_FINDING, [f"## vmfuzz gate: exited 0, but its summary.json says exit {said}: "
                                   "the two disagree, so the check fails", ""]
    elif rc == EXIT_OK:
        code, out = EXIT_OK, [f"## vmfuzz gate: {headline or 'passed'}", ""] + ([why, ""] if why else [])
        if summary is None:
            out += ["The gate exited 0 but left no summary.json.", ""]
    elif rc == EXIT_FINDING:
        code, out = rc, [f"## vmfuzz gate: {headline or 'FAILED'} (exit 1: a new finding)", ""] \
            + ([why, ""] if why else []) + ["The repro is under vmfuzz-report/findings/.", ""] + label_note
    elif rc == EXIT_USAGE:
        code, out = rc, ["## vmfuzz gate: could not run (exit 2: bad usage or a broken set-up)", ""] \
            + ([why, ""] if why else []) + ["The step's log has vmfuzz's one-line error.", ""] + label_note
    elif rc is None:
        code, out = EXIT_FINDING, ["## vmfuzz gate: did not run (its step left no exit code)", ""]
    else:
        code = rc if 0 < rc < 256 else EXIT_FINDING
        out = [f"## vmfuzz gate: ended with exit {rc}, none of vmfuzz's (0 passed, 1 finding, 2 usage, "
               "3 could not check): killed, interrupted, or not installed; the check fails", ""]
    return code, "\n".join(out).rstrip() + "\n"


# -- reading the acceptance from GitHub -------------------------------------------

def _documents(text: str) -> list:
    """Every JSON document in ``gh api --paginate``'s output (one per page, back to back)."""
    dec, out, i = json.JSONDecoder(), [], 0
    text = text.strip()
    while i < len(text):
        doc, i = dec.raw_decode(text, i)
        out.append(doc)
        while i < len(text) and text[i].isspace():
            i += 1
    return out


def gh_api(endpoint: str) -> list:
    """The pages of one GitHub API read, through the gh CLI (the job's token, in GH_TOKEN)."""
    r = subprocess.run(["gh", "api", "--paginate", endpoint], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        said = (r.stderr or r.stdout).strip().splitlines()
        raise RuntimeError(said[-1] if said else f"gh exited {r.returncode}")
    return _documents(r.stdout)


def _label_and_arrival(repo: str, pr: int, head_sha: str, api) -> tuple[dict | None, str]:
    """(the label's last ``labeled`` event, when the head commit arrived), both server times."""
    events = [e for page in api(f"repos/{repo}/issues/{pr}/events?per_page=100") for e in page]
    added = [e for e in events if e.get("event") == "labeled" and (e.get("label") or {}).get("name") == LABEL]
    forced = [e["created_at"] for e in events if e.get("event") == "head_ref_force_pushed"]
    runs = [r["created_at"] for page in api(f"repos/{repo}/actions/runs?head_sha={head_sha}&per_page=100")
            for r in page.get("workflow_runs", [])]
    if not runs:
        raise RuntimeError(f"no workflow run is listed for the head commit {head_sha[:12]}")
    return (added[-1] if added else None), max([min(runs), *forced])


def labelled(event: dict) -> bool:
    """Does the PR carry the label, as the run's event saw it?"""
    return LABEL in [lab.get("name") for lab in (event.get("pull_request") or {}).get("labels") or []]


def acceptance(event: dict, repo: str, api=gh_api) -> Acceptance:
    """Did a maintainer accept exit 3 on this run: read from the run's event and the PR's history."""
    pr = event.get("pull_request") or {}
    if event.get("action") == "labeled" and (event.get("label") or {}).get("name") == LABEL:
        by = (event.get("sender") or {}).get("login")
        return Acceptance(True, by, f"`{LABEL}` was added{f' by @{by}' if by else ''}, which started this run.")
    if not labelled(event):
        return Acceptance(False)
    if event.get("action") in PUSHES:
        return Acceptance(False, None, f"`{LABEL}` is on the PR but was added before this {event['action']} "
                          "event: it does not vouch for code pushed after it. Remove it and add it again to accept.")
    try:
        added, arrived = _label_and_arrival(repo, pr["number"], pr["head"]["sha"], api)
    except (RuntimeError, KeyError, TypeError, ValueError, OSError, subprocess.SubprocessError) as exc:
        return Acceptance(False, None, f"`{LABEL}` is on the PR, but when it was added could not be read ({exc}); "
                          "not accepted. Remove it and add it again to accept.")
    if added is None or added.get("created_at", "") <= arrived:
        return Acceptance(False, None, f"`{LABEL}` is on the PR but was added before its latest push ({arrived}): "
                          "it does not vouch for this code. Remove it and add it again to accept.")
    by = (added.get("actor") or {}).get("login")
    return Acceptance(True, by, f"`{LABEL}` was added at {added['created_at']}"
                      + (f" by @{by}" if by else " (by whom could not be read)") + f", after this code arrived ({arrived}).")


# -- the command --------------------------------------------------------------------

def _read_json(path: str | Path | None) -> dict | None:
    try:
        return json.loads(Path(path).read_text()) if path else None
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vmfuzz.harness.report.ci_check", description=__doc__.splitlines()[0])
    ap.add_argument("--exit-code", default="", help="the gate's exit code (empty: the gate did not run)")
    ap.add_argument("--report-dir", type=Path, required=True, help="the gate's --report-dir")
    ap.add_argument("--out", type=Path, help="also write the summary here (for the PR comment)")
    args = ap.parse_args(argv)
    rc = int(args.exit_code) if args.exit_code.strip().lstrip("-").isdigit() else None
    summary = _read_json(args.report_dir / "summary.json")
    event = _read_json(os.environ.get("GITHUB_EVENT_PATH")) or {}
    # the PR's history is read for exit 3 alone: no other code can be accepted
    accept = (acceptance(event, os.environ.get("GITHUB_REPOSITORY", "")) if rc == EXIT_COULD_NOT_CHECK
              else Acceptance(False))
    code, text = verdict(rc, summary, accept, labelled(event))
    print(text, end="")
    if code != EXIT_OK:
        print(f"::error title=vmfuzz gate::{text.splitlines()[0].removeprefix('## ')}")
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as f:
            f.write(text + "\n")
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return code


if __name__ == "__main__":
    sys.exit(main())
