"""The command lines README.md and docs/workflows.md show, read from their text, and the ledger of
the tests that run them.

A reader copies these lines; a test that ran a copy of its own would keep passing after the doc
changed under it. So every test of a documented command takes the command from here, read from the
doc at test time, and ``LEDGER`` says which test runs which command and what it had to change to
run it on a 2-core machine without a second host.

A documented command is a code-block line (indented at least 4 spaces) whose shell command, or one
of its ``&&`` parts, starts with ``vmfuzz`` or ``.venv/bin/vmfuzz`` followed by a command name; a
trailing ``\\`` joins the next line. ``$ `` (a transcript) and ``- run: `` (a workflow step) before
it are not the command's. ``vmfuzz run: target ...`` is output (a colon ends its first word), not
a command. A trailing comment ``# exit N`` states its exit code; ``# or --opt VALUE`` states a
second form, with ``--opt VALUE`` in place of the line's last option.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/workflows.md")

#: Every word a documented command may use as a stand-in, what it stands for, and the value the
#: parse test binds it to (a run test binds each to a real thing of its own scenario). A word
#: outside this table that looks like a stand-in (upper case, ``[...]``, ``~``, ``${{ }}``) is an
#: error: a reader could not tell what to type.
PLACEHOLDERS: dict[str, tuple[str, str]] = {
    "GOOD": ("a commit the repro holds on", "HEAD~1"),
    "BAD": ("a commit the repro fails on", "HEAD"),
    "~/sglang": ("an SGLang checkout", "sglang-checkout"),
    "origin/main": ("the branch a pull request is compared with", "origin/main"),
    "FILE": ("a file of changed paths, one a line", "changed.txt"),
    "A": ("an earlier run's report folder", "run-a"),
    "B": ("a later run's report folder", "run-b"),
    "DIR": ("a report folder", "compared"),
    "db-host:6379": ("a Redis server every shard reaches", "127.0.0.1:6379"),
    "localhost:6379": ("the job's own Redis service", "127.0.0.1:6379"),
    "${{ matrix.shard }}": ("the CI matrix's shard number", "1"),
}

_LOOKS_LIKE_A_STAND_IN = re.compile(r"(?<![\w-])[A-Z][A-Z0-9_]*(?![\w-])|\[|\]|~|\$\{\{|<[^>]*>")
_COMMAND = re.compile(r"^(?:\.venv/bin/)?vmfuzz\s+(\S+)")
_EXIT = re.compile(r"\bexit (\d+)\b")


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    #: as written, continuations joined, without its comment or a ``$ ``/``- run: `` before it
    text: str
    comment: str
    #: the exit code its comment states, else None
    exit: int | None
    #: which form of the line: "" as written, else where the second form comes from
    form: str = ""

    def where(self) -> str:
        return f"{self.doc}:{self.line}{' (' + self.form + ')' if self.form else ''}: {self.text}"

    def argv(self, bound: dict[str, str] | None = None, *, optional: bool = True,
             options: dict[str, str] | None = None, add: tuple[str, ...] = ()) -> list[str]:
        """The arguments after ``vmfuzz``: each stand-in bound (``bound``, else the parse value of
        ``PLACEHOLDERS``), ``[...]`` parts kept or dropped, the values of ``options`` replaced (a
        substitution the ledger states) and ``add`` appended. Raises ``ValueError`` naming a stand-in
        the table does not know, or an option to replace that the line does not have."""
        text = re.sub(r"\s*\[([^\]]*)\]", (lambda m: " " + m.group(1)) if optional else "", self.text)
        values = {k: v for k, (_, v) in PLACEHOLDERS.items()} | dict(bound or {})
        unknown = set(bound or ()) - set(PLACEHOLDERS)
        if unknown:
            raise ValueError(f"{self.where()}: binds {sorted(unknown)}, not in PLACEHOLDERS")
        keys = sorted(PLACEHOLDERS, key=len, reverse=True)
        # a word stands alone (A is not the A of ABC); ${{ ... }} sits inside a word (shard-${{ ... }})
        known = "|".join((r"(?<![\w-])" if k[0].isalnum() else "") + re.escape(k)
                         + (r"(?![\w-])" if k[-1].isalnum() else "") for k in keys)
        left = [m.group(0) for m in _LOOKS_LIKE_A_STAND_IN.finditer(re.sub(known, "", text))]
        if left:
            raise ValueError(f"{self.where()}: unknown placeholder {left[0]!r} (not in PLACEHOLDERS)")
        text = re.sub(known, lambda m: values[m.group(0)], text)
        args = shlex.split(text)[1:]
        for opt, value in (options or {}).items():
            if opt not in args:
                raise ValueError(f"{self.where()}: has no {opt} to replace")
            args[args.index(opt) + 1] = value
        return [*args, *add]


def _shell_parts(line: str) -> list[str]:
    """The commands of one code line: ``&&`` parts, a transcript's ``$ `` and a step's ``run:`` dropped."""
    line = re.sub(r"^(?:-\s+)?run:\s+|^\$\s+", "", line.strip())
    return [p.strip() for p in line.split("&&")]


def commands_in(text: str, doc: str) -> list[Command]:
    """Every documented command of one document's text, in order; a line's ``# or`` form after it."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        start, raw = i, lines[i]
        i += 1
        if not raw.startswith("    ") or not raw.strip():
            continue
        while raw.rstrip().endswith("\\") and i < len(lines):
            raw = raw.rstrip()[:-1].rstrip() + " " + lines[i].strip()
            i += 1
        for part in _shell_parts(raw):
            m = _COMMAND.match(part)
            if not m or m.group(1).endswith(":"):
                continue  # not vmfuzz, or its output ("vmfuzz run: target ...")
            body, comment = (re.split(r"\s+#\s+", part, maxsplit=1) + [""])[:2]
            comment = comment.strip()
            stated = _EXIT.search(comment)
            cmd = Command(doc, start + 1, body.strip(), comment, int(stated.group(1)) if stated else None)
            found.append(cmd)
            other = re.match(r"or\s+(--\S+(?:\s+[^-\s]\S*)?)\s*$", comment)
            if other:
                last = re.search(r"\s--\S+(?:\s+[^-\s]\S*)?\s*$", cmd.text)
                found.append(replace(cmd, text=cmd.text[:last.start()] + " " + other.group(1),
                                     form=f"its '# {comment}'"))
    return found


def documented(root: Path = ROOT) -> list[Command]:
    """Every documented command of ``DOCS``, read now."""
    return [c for doc in DOCS for c in commands_in((root / doc).read_text(encoding="utf-8"), doc)]


@dataclass(frozen=True)
class Entry:
    #: the test (in tests/test_documented_runs.py unless ``module`` says) that runs the command
    test: str
    #: what the run changes from the command as written, and why; "" when nothing
    substitution: str = ""
    #: the exit code the test asserts where the doc states none: the one its scenario must give
    exit: int | None = None
    module: str = "tests/test_documented_runs.py"


#: the shard lines' budget here: every step of a shard's night runs, its searches get no time
BUDGET = "1"

#: the README's nightly: one worker must reach a property's search before its budget is gone, and not
#: every property (10 s once did neither; since the interpreter got faster, 10 s reaches them all)
NIGHTLY_BUDGET = "4"

_BUDGET = (f"--time-budget {NIGHTLY_BUDGET} in place of 3600 s and --workers 1 for 4: the machine running the "
           "suite has 2 cores and minutes, not an hour; so small a budget runs out before most properties are "
           "reached (could not check, exit 3), every other step of the night still runs; a spawned worker imports "
           "torch and SGLang afresh (a minute on 2 busy cores), one worker runs in the test's own "
           "pre-imported process (spawned workers: tests/test_workflows.py's nightly)")
#: the one property the documented gate line searches here: what the line is run for (the checkout's code
#: under test, its changed verify_mask.py found from --base, fits' extra request caught: exit 1) needs no
#: other, and the whole gate's 17 properties (a whole gate caught by each property meant to catch its
#: alteration is tests/test_gate_catches_parts.py's) would cost CI a minute more
GATE_PROPERTY = "no-oob-write"
GATE_PROPERTY_ADDED = f"--property {GATE_PROPERTY} added (the property pr33127's repro names)"
_SHARD = (f"--time-budget {BUDGET} added (the profile's default is 1800 s); db-host:6379 is a redis-server "
          "the test starts on a free port of 127.0.0.1")

#: documented command (its text as written) -> the test that runs it. Every documented command has
#: an entry (tests/test_documented.py); a test named here takes its commands from ``run_by``.
LEDGER: dict[str, Entry] = {
    "vmfuzz run --target sglang --profile nightly --time-budget 3600 --workers 4 --db .vmfuzz-db":
        Entry("test_readme_nightly_runs_every_step_of_a_night", _BUDGET, exit=3),
    "vmfuzz replay crash.json --target sglang+fits-off-by-one":
        Entry("test_readme_s_minimize_walkthrough_runs_as_written", module="tests/test_for_users.py"),
    "vmfuzz minimize crash.json --target sglang+fits-off-by-one -o min.json":
        Entry("test_readme_s_minimize_walkthrough_runs_as_written", module="tests/test_for_users.py"),
    "vmfuzz bisect min.json --repo ~/sglang --good GOOD --bad BAD":
        Entry("test_readme_s_minimize_walkthrough_runs_as_written",
              "~/sglang is a stand-in SGLang repository (tests/sglang_repo.py): GOOD its first commit, the "
              "installed SGLang; BAD the next, whose fits admits max_bs + 1 (fits-off-by-one's bug)",
              module="tests/test_for_users.py"),
    "vmfuzz gate --target sglang --base origin/main":
        Entry("test_gate_lines_run_in_a_checkout",
              "run inside the stand-in repository, whose main is one commit past origin/main: fits admitting "
              f"max_bs + 1, which the gate must catch; {GATE_PROPERTY_ADDED}", exit=1),
    "vmfuzz gate --target sglang --changed-files FILE":
        Entry("test_gate_lines_run_in_a_checkout",
              "FILE lists a documentation file of the stand-in repository: a skip", exit=0),
    "vmfuzz surface --target sglang [--json]":
        Entry("test_surface_runs_as_written", "run with its [--json] kept (the parse test reads both forms)"),
    "vmfuzz bisect repro/pr33127/pr33127.json --repo ~/sglang --good v0.5.17 --bad main":
        Entry("test_workflows_bisect_names_the_commit_that_broke_fits",
              "~/sglang is the stand-in repository: v0.5.17 a tag on its first commit (the installed SGLang, "
              "fixed), main the commit whose fits admits max_bs + 1; repro/ the checkout's own"),
    "vmfuzz run --target reference+pr33127 --seed 1":
        Entry("test_what_a_run_prints_then_compare", exit=1),
    ".venv/bin/vmfuzz run --seed 1":
        Entry("test_what_a_run_prints_then_compare",
              ".venv/bin/vmfuzz is this interpreter's vmfuzz; bootstrap.sh before it is left out (it downloads)",
              exit=0),
    "vmfuzz compare A B [--report-dir DIR]":
        Entry("test_what_a_run_prints_then_compare",
              "A is the reports of `.venv/bin/vmfuzz run --seed 1`, B those of the transcript's run", exit=1),
    "vmfuzz run --target sglang --profile nightly --seed 7 --shard 1/3 --db redis://db-host:6379/0 "
    "--report-dir shard-1":
        Entry("test_shards_share_redis_and_merge", _SHARD + "; shards 2/3 and 3/3 are the CI matrix line's", exit=3),
    "vmfuzz merge shard-1 shard-2 shard-3 --report-dir nightly":
        Entry("test_shards_share_redis_and_merge", exit=3),
    ".venv/bin/vmfuzz run --target sglang --profile nightly --time-budget 3300 --seed 7 "
    "--shard ${{ matrix.shard }}/3 --db redis://localhost:6379/0 --report-dir shard-${{ matrix.shard }}":
        Entry("test_shards_share_redis_and_merge",
              f"--time-budget {BUDGET} in place of 3300 s; localhost:6379 is the test's redis-server; run for "
              "matrix.shard 2 and 3 (shard 1 is the line above's)", exit=3),
    ".venv/bin/vmfuzz merge shard-1 shard-2 shard-3 --report-dir nightly":
        Entry("test_shards_share_redis_and_merge",
              "run in a merge job's folder holding copies of the three shards (the line above's merge wrote its "
              "nightly/ beside them); bootstrap.sh before it is left out (it downloads)", exit=3),
}


def run_by(test: str, root: Path = ROOT) -> list[Command]:
    """The documented commands the ledger gives to ``test``, read from the docs now, in doc order,
    each once (README and workflows.md show the gate line both)."""
    seen, out = set(), []
    for cmd in documented(root):
        entry = LEDGER.get(cmd.text)
        if entry and entry.test == test and cmd.text not in seen:
            seen.add(cmd.text)
            out.append(cmd)
    if not out:
        raise AssertionError(f"the ledger gives {test} no documented command")
    return out


def expected_exit(cmd: Command) -> int:
    """The doc's stated exit code, else the ledger's for the test's scenario."""
    return cmd.exit if cmd.exit is not None else LEDGER[cmd.text].exit
