"""What a user meets first: --help's exit codes, a bad --base, surface's reports, and a
suite that leaves the checkout's reports/ as it found it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vmfuzz.harness.cli.parser import build_parser
from tests.helpers import ROOT, vmfuzz

PR33127 = ROOT / "repro" / "pr33127" / "pr33127.json"


def test_help_lists_every_exit_code_readme_lists():
    text = build_parser().format_help()
    for code in ("0", "1", "2", "3", "130", "143"):
        assert f"\n  {code} " in text, code


def test_a_bad_base_is_one_plain_line(tmp_path):
    r = vmfuzz("gate", "--target", "reference", "--base", "no-such-revision-xyz", "--repo", str(ROOT), "--report-dir", str(tmp_path / "r"))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == f"vmfuzz gate: --base 'no-such-revision-xyz' is not a commit in {ROOT}"


def test_a_base_outside_git_names_gits_reason(tmp_path):
    r = vmfuzz("gate", "--target", "reference", "--base", "main", "--repo", str(tmp_path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "not a git repository" in r.stderr and "Command '[" not in r.stderr


def test_surface_writes_its_summary(tmp_path):
    rep = tmp_path / "rep"
    r = vmfuzz("surface", "--target", "reference+pr33127", "--json", "--report-dir", str(rep))
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]  # stdout is still the JSON alone
    s = json.loads((rep / "summary.json").read_text())
    assert s["command"] == "surface" and s["target"] == "reference+pr33127"
    assert s["counts"]["checks"] == len(rows) > 0
    assert s["counts"]["held"] == sum(row["driven"] for row in rows)
    assert "vmfuzz surface" in (rep / "summary.md").read_text()
    assert f'tests="{len(rows)}"' in (rep / "junit.xml").read_text()
    assert f"reports: {rep}/" in r.stderr


def test_surface_refuses_a_report_dir_it_cannot_use(tmp_path):
    (tmp_path / "file").write_text("")
    r = vmfuzz("surface", "--target", "reference", "--report-dir", str(tmp_path / "file"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.slow
def test_a_run_without_report_dir_writes_under_the_tests_own_folder(tmp_path):
    """conftest puts each test in its own folder, so the checkout's reports/ is left alone."""
    assert Path.cwd() == tmp_path
    assert vmfuzz("replay", str(PR33127), "--target", "reference").returncode == 0
    assert [p.parent.name for p in (tmp_path / "reports").glob("*/summary.json")] != []


@pytest.mark.slow
def test_the_gate_defaults_to_sglang_and_without_it_says_so_in_one_line_exit_2(tmp_path):
    """A gate on the reference model tests no SGLang code, so sglang is the default; where
    SGLang cannot be imported (hidden here by a package that refuses to import) that is bad input."""
    hidden = tmp_path / "hide" / "sglang"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text('raise ImportError("No module named sglang (hidden by the test)")\n')
    changed = tmp_path / "changed.txt"
    changed.write_text("python/sglang/srt/layers/attention/verify_mask.py\n")
    r = vmfuzz("gate", "--changed-files", str(changed), "--report-dir", str(tmp_path / "r"),
               env={"PYTHONPATH": os.pathsep.join([str(tmp_path / "hide"), str(ROOT)])})
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "target 'sglang' unavailable" in r.stderr


@pytest.mark.slow
def test_readme_s_minimize_walkthrough_runs_as_written(sglang_target, fits_history, tmp_path):
    """The README's crash report and its three lines, as a user copies them (read from the README through
    tests/documented.py): the replay fails (exit 1), minimize writes a smaller repro that keeps the
    finding's origin (exit 1), and bisect, given that repro, names the commit that broke ``fits``."""
    import re

    from tests.documented import expected_exit, run_by
    text = (ROOT / "README.md").read_text()
    section = text.split("### Minimizing a failure", 1)[1].split("###", 1)[0]
    block = re.search(r"\n    (\{\"config\".*?\]\}\]\})\n", section, re.S).group(1)
    (tmp_path / "crash.json").write_text("\n".join(line.strip() for line in block.splitlines()))
    replay, minimize, bisect = run_by("test_readme_s_minimize_walkthrough_runs_as_written")
    assert [c.argv()[0] for c in (replay, minimize, bisect)] == ["replay", "minimize", "bisect"]
    for cmd in (replay, minimize):
        proc = vmfuzz(*cmd.argv(), cwd=tmp_path)
        assert proc.returncode == expected_exit(cmd), cmd.where() + "\n" + proc.stdout + proc.stderr
    small = json.loads((tmp_path / "min.json").read_text())
    assert sum(sum(b["seq_lens"]) for b in small["batches"]) < 9 * 4096 and small["origin"]["effect"] == "overrun"
    repo, good, bad = fits_history
    proc = vmfuzz(*bisect.argv({"~/sglang": str(repo), "GOOD": good, "BAD": bad}), cwd=tmp_path, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == expected_exit(bisect), bisect.where() + "\n" + out
    assert f"first bad commit: {bad} verify_mask: let one more request through" in out, out


def test_the_missing_sglang_hint_names_only_what_this_installation_has():
    """The hint names a command every installation has (a checkout's scripts/sglang and a wheel's
    shipped copy are the same installer); only an installation that lost it gets a pip line that
    keeps CUDA torch out, never a script the user does not have."""
    from vmfuzz.harness.targets.sglang.loader import install_hint, installer
    assert installer() == ROOT / "scripts" / "sglang" / "install_sglang.sh"
    assert "`vmfuzz install-sglang`" in install_hint() and "scripts/" not in install_hint()
    lost = install_hint(None, look=False)
    assert "pip install --no-deps sglang==0.5.23" in lost and "bash " not in lost and "scripts/" not in lost


def test_install_sglang_refuses_an_unknown_release_in_one_line():
    r = vmfuzz("install-sglang", "--version", "9.9.9", "--check")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "unknown sglang release '9.9.9'" in r.stderr and "Traceback" not in r.stderr


def test_install_sglang_maps_the_installers_exit_to_the_contract(capfd):
    """In this process (the command's own code, not only its subprocess): the installer's usage
    error stays 2, its failed check becomes 3 with a line that says so."""
    from vmfuzz.harness.commands.install_sglang import run
    from vmfuzz.harness.commands.request import InstallRequest
    assert run(InstallRequest(command="install-sglang", version="9.9.9", check=True)) == 2
    assert "unknown sglang release '9.9.9'" in capfd.readouterr().err
    assert run(InstallRequest(command="install-sglang", version="0.0.1", check=True)) == 2
    other = "0.5.18" if _installed_sglang() == "0.5.17" else "0.5.17"
    assert run(InstallRequest(command="install-sglang", version=other, check=True)) == 3
    assert "vmfuzz install-sglang: the check failed (installer exit" in capfd.readouterr().err


def _installed_sglang() -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def test_install_sglang_check_of_another_release_could_not_check():
    """--check of a release other than the installed one installs nothing and exits 3, saying which."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        have = version("sglang")
    except PackageNotFoundError:
        have = None  # the script says "no sglang installed": a failed check all the same
    other = "0.5.18" if have == "0.5.17" else "0.5.17"
    r = vmfuzz("install-sglang", "--version", other, "--check")
    assert r.returncode == 3, r.stdout + r.stderr
    assert (f"not {other}" if have else "no sglang installed") in r.stderr and "the check failed" in r.stderr
