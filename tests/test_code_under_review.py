"""The code under review cannot steer its own verdict, nor where the verdict is written.

In CI the working directory is the pull request's own checkout. Whatever it
holds -- a ``known/`` whose broad entry would excuse a defect, a ``repro/`` that
would stand in for the canonical #33127 repros, an ``__init__`` that changes
directory on import -- must not change the exit code or move the reports. Only
what vmfuzz ships and what the CI configuration names on the command line
(``--known DIR``, ``--repros DIR``) counts. A ``--repo`` that is no SGLang
checkout, and a saved repro that cannot be replayed, are never a pass either.

The targets are the reference model with known-bad variants, and plug-ins
(written here) over it, so each check takes seconds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from xml.etree import ElementTree

import pytest

from tests.helpers import ROOT, vmfuzz

#: A plug-in over the reference model. ``fake_sglang``: it reports an SGLang version, so
#: the known findings of that range apply to it (they apply to no other target), and
#: DFlash's verify-mask policy resolves the wrong child (a real defect of ``routing``).
#: ``no_router``: it cannot drive ``routing``. ``moves``: importing it changes directory.
PLUGIN = '''
import os
from vmfuzz.harness.targets import resolve

fake_sglang = resolve("reference+dflash-policy-prefill")
_own = fake_sglang.versions
fake_sglang.versions = lambda: {**_own(), "sglang": "0.5.23"}

no_router = resolve("reference")
no_router.route = None

moves = resolve("reference")
if os.environ.get("VMFUZZ_TEST_MOVE_TO"):
    os.chdir(os.environ["VMFUZZ_TEST_MOVE_TO"])
'''

CONFIG = {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 4, "num_draft_tokens": 3, "topk": 2,
          "spec_steps": 2}


def _plugin_env(tmp_path: Path, **extra: str) -> dict:
    folder = tmp_path / "plugins"
    folder.mkdir(exist_ok=True)
    (folder / "review_plugin.py").write_text(PLUGIN)
    return {"PYTHONPATH": os.pathsep.join([str(ROOT), str(folder)]), **extra}


def _pr_checkout(where: Path) -> Path:
    """A checkout under review that carries its own known/ (one entry excusing anything) and repro/."""
    where.mkdir(parents=True)
    (where / "known").mkdir()
    (where / "known" / "anything.json").write_text(json.dumps({
        "sglang": ">=0,<=99", "reason": "excuses every routing failure",
        "origins": [{"property": "routing", "effect": e} for e in ("unsound", "wrong", "overrun", "raise")],
        "repro": {"target": "sglang", "property": "routing", "config": CONFIG, "batches": [{"seq_lens": [4, 1]}]}}))
    (where / "repro" / "harmless").mkdir(parents=True)
    (where / "repro" / "harmless" / "holds.json").write_text(json.dumps({
        "target": "reference", "property": "capacity-liveness", "config": CONFIG,
        "batches": [{"seq_lens": [4, 1]}]}))
    return where


# target, property searched: a defect only the shipped repros catch (the search of
# capacity-liveness cannot see #33127), and one only a broad known entry would excuse
CASES = {"repro": ("reference+pr33127", "capacity-liveness"), "known": ("review_plugin:fake_sglang", "routing")}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.slow
def test_a_checkouts_own_known_and_repro_do_not_change_the_verdict(tmp_path, case):
    target, prop = CASES[case]
    env = _plugin_env(tmp_path)
    verdicts = {}
    for name, cwd in (("clean", tmp_path / "clean"), ("pr", _pr_checkout(tmp_path / "pr"))):
        cwd.mkdir(exist_ok=True)
        r = vmfuzz("gate", "--target", target, "--property", prop, "--isolate", "off", "--report-dir", "rep",
                   cwd=cwd, env=env)
        verdicts[name] = r.returncode
        assert r.returncode == 1, f"{name}: {r.stdout}{r.stderr}"
        replayed = {Path(x["repro"]).name for x in json.loads((cwd / "rep" / "summary.json").read_text())["replays"]}
        assert replayed == {"pr33127.json", "minimized-deployment.json"}, (name, replayed)
        assert "anything" not in r.stdout
    assert verdicts["clean"] == verdicts["pr"]


@pytest.mark.slow
def test_the_command_line_names_more_known_findings_and_repros(tmp_path):
    """What CI names explicitly does count: the broad entry excuses the defect when given with --known."""
    env = _plugin_env(tmp_path)
    pr = _pr_checkout(tmp_path / "pr")
    r = vmfuzz("gate", "--target", "review_plugin:fake_sglang", "--property", "routing", "--isolate", "off",
               "--known", str(pr / "known"), "--repros", str(pr / "repro"), "--report-dir", str(tmp_path / "rep"),
               env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "known finding (upstream's to fix, not a new cause): anything (routing)" in r.stdout
    replayed = {Path(x["repro"]).name for x in json.loads((tmp_path / "rep" / "summary.json").read_text())["replays"]}
    assert replayed == {"pr33127.json", "minimized-deployment.json", "holds.json"}
    for option in ("--known", "--repros"):
        r = vmfuzz("run", "--max-examples", "5", option, str(tmp_path / "missing"), "--report-dir",
                   str(tmp_path / f"r{option}"))
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            f"vmfuzz: {option} {tmp_path / 'missing'}: not a directory"], r.stdout + r.stderr


@pytest.mark.parametrize("report_dir", [["--report-dir", "rep"], []], ids=["given", "default"])
def test_a_target_that_changes_directory_on_import_does_not_move_the_reports(tmp_path, report_dir):
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    # another run's reports, where a relative --report-dir would land after the move
    (elsewhere / "rep").mkdir(parents=True)
    (elsewhere / "rep" / "summary.json").write_text("another run's\n")
    env = _plugin_env(tmp_path, VMFUZZ_TEST_MOVE_TO=str(elsewhere))
    r = vmfuzz("run", "--target", "review_plugin:moves", "--property", "capacity-liveness", "--max-examples", "5",
               "--isolate", "off", *report_dir, cwd=here, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (elsewhere / "rep" / "summary.json").read_text() == "another run's\n"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["rep"]
    written = [here / "rep"] if report_dir else list((here / "reports").iterdir())
    assert len(written) == 1 and (written[0] / "summary.json").is_file() and (written[0] / "junit.xml").is_file()


def _bad_repos(tmp_path: Path) -> dict[str, Path]:
    plain = tmp_path / "not-sglang"
    (plain / "python" / "other").mkdir(parents=True)
    (plain / "python" / "other" / "__init__.py").write_text("")
    a_file = tmp_path / "a-file"
    a_file.write_text("x\n")
    return {"no python/sglang/__init__.py in it": plain, "not a directory": a_file,
            "no such path": tmp_path / "missing"}


@pytest.mark.slow
def test_a_repo_that_is_no_sglang_checkout_is_one_line_exit_2(tmp_path):
    changed = tmp_path / "changed.txt"
    changed.write_text("python/sglang/srt/layers/attention/verify_mask.py\n")
    for why, repo in _bad_repos(tmp_path).items():
        for argv in (["gate", "--target", "sglang", "--repo", str(repo)],
                     ["gate", "--target", "sglang+pr33127", "--repo", str(repo), "--changed-files", str(changed)],
                     ["bisect", str(ROOT / "repro" / "pr33127" / "pr33127.json"), "--repo", str(repo),
                      "--good", "HEAD~1", "--bad", "HEAD"]):
            r = vmfuzz(*argv, "--report-dir", str(tmp_path / "rep"), timeout=120)
            command = argv[0]
            assert r.returncode == 2, (argv, r.stdout, r.stderr)
            assert r.stderr.strip().splitlines() == [
                f"vmfuzz {command}: --repo {repo} is not an SGLang checkout ({why})"], (argv, r.stderr)
            assert not (tmp_path / "rep").exists()


def test_bisect_refuses_a_repo_that_is_no_sglang_checkout_before_any_git(tmp_path, capsys):
    """The fast loop's run of the bisect command, in this process (the test above runs every command
    as a user does, in a subprocess, and is slow)."""
    from vmfuzz.harness.cli import main

    missing = tmp_path / "missing"
    argv = ["bisect", str(ROOT / "repro" / "pr33127" / "pr33127.json"), "--repo", str(missing),
            "--good", "HEAD~1", "--bad", "HEAD", "--report-dir", str(tmp_path / "rep")]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"vmfuzz bisect: --repo {missing} is not an SGLang checkout (no such path)"]
    assert not (tmp_path / "rep").exists()


def _saved(folder: Path, name: str, body) -> Path:
    (folder / "saved").mkdir(parents=True, exist_ok=True)
    path = folder / "saved" / f"{name}.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path


BAD_FILES = {
    "not json": "{not json",
    "unknown property": {"target": "reference", "property": "no-such-property", "config": CONFIG,
                         "batches": [{"seq_lens": [4, 1]}]},
    # trivial-path judges only num_draft_tokens 1: here it would judge nothing and read "held"
    "property does not apply": {"target": "reference", "property": "trivial-path", "config": CONFIG,
                                "batches": [{"seq_lens": [4, 1]}]},
}


@pytest.mark.parametrize("option", ["--repros", "--repro-root"])
@pytest.mark.parametrize("bad", sorted(BAD_FILES))
@pytest.mark.slow
def test_a_saved_repro_that_is_no_valid_repro_is_exit_2_naming_it(tmp_path, bad, option):
    path = _saved(tmp_path / "mine", "bad", BAD_FILES[bad])
    r = vmfuzz("gate", "--target", "reference", "--property", "capacity-liveness", option, str(tmp_path / "mine"),
               "--report-dir", str(tmp_path / "rep"))
    assert r.returncode == 2, r.stdout + r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"vmfuzz: saved repro {path} cannot be replayed: "), line
    assert not (tmp_path / "rep" / "summary.json").exists()  # no report says otherwise


@pytest.mark.parametrize("option", ["--repros", "--repro-root"])
@pytest.mark.slow
def test_a_saved_repro_the_target_cannot_drive_is_could_not_check_everywhere(tmp_path, option):
    path = _saved(tmp_path / "mine", "routing", {"target": "reference", "property": "routing", "config": CONFIG,
                                                 "batches": [{"seq_lens": [4, 1]}]})
    rep = tmp_path / "rep"
    r = vmfuzz("gate", "--target", "review_plugin:no_router", "--property", "capacity-liveness", "--isolate", "off",
               option, str(tmp_path / "mine"), "--report-dir", str(rep), env=_plugin_env(tmp_path))
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"vmfuzz: could not check: saved repro {path} could not be replayed: "), r.stderr
    md = (rep / "summary.md").read_text()
    assert "**COULD NOT CHECK**" in md.split("\n")[0] and "passed" not in md.split("\n")[0], md
    assert f"could not check: saved repro {path} could not be replayed" in md, md
    assert "0 did not hold, 1 could not be replayed" in md and f"could not replay `{path}`" in md
    cases = {c.get("name"): c for c in ElementTree.parse(rep / "junit.xml").iter("testcase")}
    assert cases[str(path)].find("error") is not None and cases[str(path)].find("failure") is None
    s = json.loads((rep / "summary.json").read_text())
    assert s["counts"]["replays_failed"] == 0 and s["findings"] == []


def test_a_saved_repro_out_of_step_stops_the_gate_whatever_the_change_touches():
    """Out of step on a check that drives no changed file is a warning; on a saved repro it is exit 3."""
    from types import SimpleNamespace

    from vmfuzz.harness.engine.campaign.watch import out_of_step_coverage
    saved = str(ROOT / "repro" / "pr33127" / "pr33127.json")
    outcome = SimpleNamespace(out_of_step=[(saved, "fits in verify_mask.py: no longer there")])
    cov = out_of_step_coverage(["python/sglang/srt/layers/attention/tbo_backend.py"], outcome)
    assert cov["warnings"] == [] and cov["out_of_step"] == [
        f"fits in verify_mask.py: no longer there (saved repro {saved})"]
