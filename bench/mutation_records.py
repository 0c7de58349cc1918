"""What one mutant's kill command printed, and the fate a mutant is given from it.

Every module of the mutation bench reads these records; none of them is imported
from here, so the bench's imports run one way (a test holds it). The kill command
(bench/mutation_kill.py) prints one line per fact, each with its own prefix, so no
tail cut loses one:

- ``vmfuzz-kill: exit N``: the gate's own exit (cosmic-ray reads any non-zero as a kill);
- ``vmfuzz-origin: {...}``: each typed origin of what killed it;
- ``vmfuzz-lines: {...}``: what the gate measured of the mutated line;
- ``vmfuzz-equiv:``: a survivor's outputs against the pristine code's, on the gate's examples;
- ``vmfuzz-wide:``: the same comparison over a wider search (bench/mutation_wide.py), the only
  thing that makes a survivor "equivalent" rather than "suspected-equivalent";
- ``vmfuzz-stillborn:``, ``vmfuzz-sglang-tests:``, ``vmfuzz-cpu:``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
HARNESS_ROOT = HERE.parent

OUTCOMES = ("killed", "survived", "equivalent", "suspected-equivalent", "not-exercised", "off-path", "timed-out",
            "out-of-step", "error", "stillborn")
EXIT_LINE = re.compile(r"vmfuzz-kill: exit (-?\d+)")
EQUIV_LINE = re.compile(r"^vmfuzz-equiv: (.*)$", re.M)
WIDE_LINE = re.compile(r"^vmfuzz-wide: (.*)$", re.M)
STILLBORN_LINE = re.compile(r"^vmfuzz-stillborn: (.*)$", re.M)
TESTS_LINE = re.compile(r"^vmfuzz-sglang-tests: (.*)$", re.M)
LINES_LINE = re.compile(r"^vmfuzz-lines: (\{.*\})$", re.M)
CPU_LINE = re.compile(r"^vmfuzz-cpu: ([\d.]+) s gate; examples (\d+|None)", re.M)
ORIGIN_LINE = re.compile(r"^vmfuzz-origin: (\{.*\})$", re.M)
#: origin effects that are the mutant breaking, never a property seeing a wrong value
RAISING = ("raise", "crash", "hang")


def line(pattern: re.Pattern, output: str | None) -> str | None:
    """The last such line: a verdict appended after the run (a wider search, say) replaces the earlier one."""
    found = pattern.findall(output or "")
    return found[-1].strip() if found else None


def measured_lines(output: str | None) -> dict:
    """What the gate measured of the mutated line (``vmfuzz-lines:``)."""
    said = line(LINES_LINE, output)
    try:
        return json.loads(said) if said else {}
    except ValueError:
        return {}


def gate_exit(output: str | None) -> int | None:
    m = EXIT_LINE.search(output or "")
    return int(m.group(1)) if m else None


def passed_fate(output: str | None) -> str:
    """The fate of a mutant the gate passed on the mask's path. Identical outputs on the gate's own
    examples make it only suspected-equivalent; a wider search whose outputs are identical too makes it
    equivalent, and one that shows a difference (or a finding) makes it a survivor, a false green."""
    if not (line(EQUIV_LINE, output) or "").startswith("identical"):
        return "survived"
    wide = line(WIDE_LINE, output) or ""
    if wide.startswith("identical"):
        return "equivalent"
    if wide.startswith(("differs", "killed")):
        return "survived"
    return "suspected-equivalent"


def classify(result) -> str:
    """A cosmic-ray result's fate (``OUTCOMES``), read from the kill command's lines."""
    if result.worker_outcome != "normal":
        return "error"
    if result.output == "timeout":
        return "timed-out"
    code = gate_exit(result.output)
    measured = measured_lines(result.output)
    refused = (line(STILLBORN_LINE, result.output) or "").startswith("refused")
    if code == 0:
        if measured.get("outside") and not measured.get("judged_by"):
            return "off-path"
        return passed_fate(result.output)
    if code == 1:
        return "stillborn" if refused and killed_by(result.output) == "the mutant raising" else "killed"
    if code == 3:
        return "not-exercised" if measured.get("never_ran") else "out-of-step"
    # a mutant Python itself will not compile (the gate cannot import it: exit 2) never runs anywhere
    return "stillborn" if code == 2 and refused else "error"


def _origins(output: str | None) -> list[dict]:
    return [json.loads(m) for m in ORIGIN_LINE.findall(output or "")]


def killed_by(output: str | None) -> str:
    """Who killed it, from the origins the kill command printed (never from message text):
    a property's own check when some origin is a property's judgement; the mutant raising (or
    crashing) when every origin is a raise/crash/hang; "unknown" when no origin was printed."""
    origins = _origins(output)
    if not origins:
        return "unknown"
    if any(o.get("effect") not in RAISING for o in origins):
        return "a property's check"
    return "the mutant raising"


def killing_properties(output: str | None) -> list[str]:
    """The properties a kill is credited to: those named by a non-raise origin."""
    return sorted({o["property"] for o in _origins(output) if o.get("effect") not in RAISING and o.get("property")})


def killing_origins(summary: Path) -> list[dict]:
    """The origins of a run's new finding groups and of a command's failed checks (known groups left out),
    read from its summary.json."""
    try:
        s = json.loads(summary.read_text())
    except (OSError, ValueError):
        return []
    out = [g["origin"] for g in s.get("groups", []) if g.get("origin") and not g.get("known")]
    # a command's own checks: the code under test that does not import (stage import) is such a finding
    out += [c["origin"] for c in s.get("checks", []) if c.get("status") == "failed" and c.get("origin")]
    return out


def imported_from(summary: Path) -> str | None:
    """The SGLang package a run imported, as its summary.json records it (None: not recorded)."""
    try:
        return json.loads(summary.read_text())["versions"]["sglang path"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
