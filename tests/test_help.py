"""The command line explains itself, and docs/commands.md's synopses say what ``--help`` says."""

from __future__ import annotations

import argparse
import os
import re

import pytest

from vmfuzz.harness.cli.parser import REPORT_DIR_HELP, build_parser
from vmfuzz.harness.report.summary import default_report_dir
from tests.helpers import ROOT


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """Every visible option's long name (or short, if it has no long one)."""
    out = set()
    for a in parser._actions:
        if a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction) or not a.option_strings:
            continue
        out.add(max(a.option_strings, key=len))
    return out


def test_every_option_has_help_text():
    missing = [f"{name} {a.option_strings or a.dest}" for name, p in _subparsers().items() for a in p._actions
               if not isinstance(a, argparse._HelpAction) and not a.help]
    assert not missing, missing


def test_top_level_help_lists_the_commands_and_the_exit_codes():
    text = build_parser().format_help()
    for name in _subparsers():
        assert re.search(rf"^\s+{re.escape(name)}\b", text, re.M), name
    for code in ("0", "1", "2"):
        assert re.search(rf"^\s+{code}\s+\w", text, re.M), code


def test_help_names_the_default_report_dir_as_it_is_made():
    """The folder a run's reports go to, as --help writes it, is the one a run makes."""
    (shown,) = re.findall(r"reports/<.*>/", REPORT_DIR_HELP)
    assert f"(default {shown})" in build_parser().format_help().replace("\n", " ")
    made = re.escape(shown.rstrip("/")).replace(re.escape("<UTC timestamp>"), r"\d{8}T\d{6}Z")
    made = made.replace(re.escape("<pid>"), str(os.getpid()))
    assert re.fullmatch(made, default_report_dir().as_posix()), (shown, default_report_dir())


def readme_synopses() -> dict[str, str]:
    """docs/commands.md's "## Synopses" block: command -> its synopsis (continuation lines joined)."""
    text = (ROOT / "docs" / "commands.md").read_text()
    block = text.split("## Synopses", 1)[1].split("\n## ", 1)[0]
    out: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        m = re.match(r"    vmfuzz ([a-z-]+)\b(.*)", line)
        if m:
            current = m.group(1)
            out[current] = m.group(2).split("#", 1)[0]
        elif current and line.startswith("     ") and line.strip():
            out[current] += " " + line.split("#", 1)[0]
        else:
            current = None if not line.startswith("    ") else current
    return out


@pytest.mark.parametrize("name", sorted(_subparsers()))
def test_readme_synopsis_matches_help(name):
    synopses = readme_synopses()
    assert name in synopses, f"docs/commands.md has no synopsis for vmfuzz {name}"
    shown = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", synopses[name]))
    options = _options(_subparsers()[name])
    shown_long = {o for o in shown if o.startswith("--")} | ({"-v"} & shown) | ({"-o"} & shown)
    want = {o for o in options}
    # -o/--output and -v/--verbose may be shown by either name
    aliases = {"--output": "-o", "--verbose": "-v"}
    missing = sorted(o for o in want if o not in shown_long and aliases.get(o) not in shown_long)
    unknown = sorted(o for o in shown_long if o not in want and o not in aliases.values())
    assert not missing, f"docs/commands.md's synopsis of vmfuzz {name} lacks {missing}"
    assert not unknown, f"docs/commands.md's synopsis of vmfuzz {name} shows options it does not have: {unknown}"
