"""Every command README.md and docs/workflows.md show parses into its typed request, and the ledger
names, for each, the test that runs it as written (tests/documented.py)."""

from __future__ import annotations

import ast

import pytest

from vmfuzz.harness.cli.parser import build_parser
from vmfuzz.harness.commands.request import Request, request_of
from vmfuzz.harness.model.errors import UsageError
from tests.documented import DOCS, LEDGER, PLACEHOLDERS, ROOT, commands_in, documented


def parse_problems(commands) -> list[str]:
    """Each command, every ``[...]`` part kept and dropped, through the CLI's own parser and
    ``request_of``: a line naming the doc line for each that a user could not run."""
    problems = []
    for cmd in commands:
        for optional in (True, False):
            try:
                argv = cmd.argv(optional=optional)
                request = request_of(build_parser().parse_args(argv))
            except ValueError as exc:
                problems.append(str(exc))
                continue
            except (UsageError, SystemExit) as exc:  # argparse's refusal; --help would exit 0
                problems.append(f"{cmd.where()}: the parser refuses it: {exc}")
                continue
            if not isinstance(request, Request) or request.command != argv[0]:
                problems.append(f"{cmd.where()}: parsed to {request!r}")
    return problems


def test_every_documented_command_parses_into_its_request():
    commands = documented()
    assert parse_problems(commands) == []
    # an extraction that found nothing would pass the line above: each doc shows several
    assert all(sum(c.doc == doc for c in commands) >= 5 for doc in DOCS), [c.where() for c in commands]


def test_output_samples_and_other_programs_are_not_commands():
    text = ("    vmfuzz gate: code under test: sglang 0.5.23 from /src\n"
            "    vmfuzz run: target reference, seed 1\n"
            "      vmfuzz: could not check: verify_mask.py line 25 never ran\n"
            "    VMFUZZ_MAX_EXAMPLES=500 pytest -n 2 tests/properties\n"
            "vmfuzz run --seed 1 is prose, not a code block\n"
            "    $ vmfuzz targets\n"
            "    - run: bash scripts/bootstrap.sh && .venv/bin/vmfuzz merge a \\\n"
            "        b --report-dir c   # exit 1\n")
    found = commands_in(text, "t.md")
    assert [(c.line, c.text, c.exit) for c in found] == [
        (6, "vmfuzz targets", None), (7, ".venv/bin/vmfuzz merge a b --report-dir c", 1)]


@pytest.mark.parametrize("doc, plant, says", [
    ("README.md", ("--good GOOD", "--godo GOOD"), "the parser refuses it"),
    ("README.md", ("--target sglang --base origin/main", "--target sglang --base REV"),
     "unknown placeholder 'REV'"),
    ("docs/workflows.md", ("--shard 1/3", "--shard 1/three"), "the parser refuses it"),
    ("docs/workflows.md", ("vmfuzz compare A B", "vmfuzz comapre A B"), "the parser refuses it"),
])
def test_a_planted_mistake_in_a_copy_of_the_doc_fails_naming_its_line(doc, plant, says):
    text = (ROOT / doc).read_text(encoding="utf-8")
    old, new = plant
    assert text.count(old) >= 1, f"{old!r} is no longer in {doc}: plant another mistake"
    planted = text.replace(old, new)
    line = text[:text.index(old)].count("\n") + 1
    problems = parse_problems(commands_in(planted, doc))
    assert problems and all(f"{doc}:{line}" in p and says in p for p in problems), problems


def test_the_placeholder_table_is_used_and_known_words_are_not_stand_ins():
    texts = " ".join(c.text for c in documented())
    unused = [k for k in PLACEHOLDERS if k not in texts]
    assert unused == [], f"PLACEHOLDERS names stand-ins no doc uses: {unused}"


def _test_functions(module: str) -> dict[str, str]:
    """name -> source of each function of a test module."""
    source = (ROOT / module).read_text()
    return {n.name: ast.get_source_segment(source, n) for n in ast.parse(source).body
            if isinstance(n, ast.FunctionDef)}


def ledger_problems(commands, ledger) -> list[str]:
    problems = []
    texts = {c.text for c in commands}
    for cmd in commands:
        entry = ledger.get(cmd.text)
        if entry is None:
            problems.append(f"{cmd.where()}: no test runs it (no LEDGER entry)")
        elif (cmd.exit is None) == (entry.exit is None):
            problems.append(f"{cmd.where()}: the doc states exit {cmd.exit} and the ledger {entry.exit}: "
                            "exactly one of them must say what the test asserts")
    for text, entry in ledger.items():
        if text not in texts:
            problems.append(f"LEDGER entry {text!r}: no doc shows this command")
        source = _test_functions(entry.module).get(entry.test)
        if source is None:
            problems.append(f"LEDGER entry {text!r}: {entry.module} has no {entry.test}")
        elif f'run_by("{entry.test}")' not in source:
            problems.append(f"{entry.module}::{entry.test} does not take its commands from run_by")
    return problems


def test_each_documented_command_has_a_test_that_runs_it():
    assert ledger_problems(documented(), LEDGER) == []


def test_a_new_command_or_a_missing_test_fails_the_ledger():
    from dataclasses import replace
    commands = documented()
    added = commands_in("    vmfuzz selftest --target sglang\n", "docs/workflows.md")
    assert ledger_problems(commands + added, LEDGER) == [
        "docs/workflows.md:1: vmfuzz selftest --target sglang: no test runs it (no LEDGER entry)"]
    text, entry = next(iter(LEDGER.items()))
    wrong = {**LEDGER, text: replace(entry, test="test_nobody_wrote")}
    assert [p for p in ledger_problems(commands, wrong) if "has no test_nobody_wrote" in p]
    stated = next(c for c in commands if c.exit is not None)
    both = {**LEDGER, stated.text: replace(LEDGER[stated.text], exit=0)}
    assert [p for p in ledger_problems(commands, both) if "exactly one of them" in p]
