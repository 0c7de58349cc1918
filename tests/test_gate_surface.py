"""The gate's trigger read from the code under test, ``vmfuzz surface``, and the gate's coverage summary.

Most of these need no SGLang import: the trigger and the surface collector read
files, and a gate run on the reference target costs seconds. One test runs
``vmfuzz surface --target sglang`` on an altered copy of the installed package.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from html import escape
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from vmfuzz.harness.engine.search.results import PropertyResult
from vmfuzz.harness.engine.campaign.changes import Checkout, installed_sglang, triggers, touches_verify_mask
from vmfuzz.harness.engine.campaign.surface import Entry, declared, gate_coverage, grep_package, sglang_rows
from tests import zygote
from tests.helpers import ROOT, vmfuzz
from tests.sglang_copies import altered_copy

REQUIRE = os.environ.get("VMFUZZ_REQUIRE_SGLANG") == "1"
REGEX = ("verify_mask|VerifyMask|tree_mask_numel|build_tree_kernel_efficient|build_chain_tree|TreeMaskMode|"
         "tree_mask_buf|pack_verify_mask")


@pytest.fixture(scope="module")
def package() -> Path:
    """The installed SGLang's folder, found without importing it."""
    pkg = installed_sglang()
    if pkg is None:
        if REQUIRE:
            pytest.fail("VMFUZZ_REQUIRE_SGLANG=1 but no sglang package is installed")
        pytest.skip("no sglang package installed")
    return pkg


def _grep(pkg: Path) -> list[str]:
    """The grep for mask code over the package, run as a person would run it."""
    out = subprocess.run(f"grep -rlE '{REGEX}' --include=*.py --include=*.cuh --include=*.cu . | grep -v test",
                         shell=True, cwd=pkg, capture_output=True, text=True).stdout
    return sorted(line.removeprefix("./") for line in out.splitlines() if line.strip())


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def _repo(tmp_path: Path, files: dict[str, str]) -> tuple[Path, str]:
    """A git checkout holding ``files`` at its first commit; returns (root, that commit)."""
    repo = tmp_path / "checkout"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    return repo, _git(repo, "rev-parse", "HEAD")


def _commit(repo: Path, msg: str = "change") -> None:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", msg)


# -- the trigger ------------------------------------------------------------------

def test_every_file_of_the_installed_sglang_naming_mask_code_triggers(package, tmp_path):
    grep = _grep(package)
    assert grep_package(package) == grep  # the harness's grep is the acceptance grep
    try:
        if version("sglang") == "0.5.23":
            assert len(grep) == 29
    except PackageNotFoundError:
        pass
    changed = [f"python/sglang/{rel}" for rel in grep]
    # No checkout holds them (an empty folder): the installed package's text decides.
    empty = tmp_path / "empty"
    empty.mkdir()
    hit = touches_verify_mask(changed, Checkout(root=empty))
    assert hit == changed, sorted(set(changed) - set(hit))
    # The static rules (patterns, and the list the workflow filters on) cover 0.5.23's files
    # without reading them; the text rule is what covers a file neither names
    # (test_a_new_file_naming_verify_mask_triggers_without_editing_the_list).
    by_list = touches_verify_mask(changed, Checkout(root=empty), package=None)
    try:
        if version("sglang") == "0.5.23":
            assert by_list == changed, sorted(set(changed) - set(by_list))
    except PackageNotFoundError:
        pass
    # A file that names no mask code, and documentation, do not trigger.
    assert touches_verify_mask(["python/sglang/srt/layers/quantization/fp8.py", "docs/verify_mask.md"],
                               Checkout(root=empty)) == []


def test_every_driven_file_triggers_the_gate_even_naming_no_mask_code(tmp_path):
    """A file a property drives starts the gate even where its text names no mask code (the pp
    relay): a change to it was skipped as "touches no verify-mask code", exit 0 unchecked."""
    empty = tmp_path / "empty"
    empty.mkdir()
    driven = sorted({f"python/sglang/{e.file}" for e in declared()})
    assert "python/sglang/srt/speculative/pp_spec_relay.py" in driven
    assert touches_verify_mask(driven, Checkout(root=empty), package=None) == driven


@pytest.mark.slow
def test_a_new_file_naming_verify_mask_triggers_without_editing_the_list(tmp_path):
    repo, base = _repo(tmp_path, {"python/sglang/srt/layers/attention/old.py": "x = 1\n"})
    new = "python/sglang/srt/layers/attention/new_router.py"
    (repo / new).write_text("class Router:\n    def verify_mask(self):\n        return self.child.verify_mask\n")
    (repo / "python/sglang/srt/layers/attention/plain.py").write_text("y = 2\n")
    _commit(repo)
    [t] = triggers([new, "python/sglang/srt/layers/attention/plain.py"], Checkout(root=repo), package=None)
    assert t.path == new and t.why == "names verify-mask code"
    # end to end through the CLI, from git, on the cheap target
    r = vmfuzz("gate", "--target", "reference", "--base", base, "--repo", str(repo), "--report-dir", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"1 changed file(s) touch verify-mask code: {new}" in r.stdout
    # the same checkout through --changed-files and --repo
    listed = tmp_path / "changed.txt"
    listed.write_text(f"{new}\n")
    r = vmfuzz("gate", "--target", "reference", "--changed-files", str(listed), "--repo", str(repo), "--report-dir", str(tmp_path / "r2"))
    assert r.returncode == 0 and "1 changed file(s) touch verify-mask code" in r.stdout, r.stdout + r.stderr


def test_a_file_that_loses_or_is_deleted_with_its_mask_code_triggers(tmp_path):
    holder, dropper = "python/sglang/srt/foo/holder.py", "python/sglang/srt/foo/dropper.py"
    plain = "python/sglang/srt/foo/plain.py"
    repo, base = _repo(tmp_path, {holder: "def f(tree_mask_buf):\n    pass\n",
                                  dropper: "if verify_mask.fits(bs):\n    pass\n", plain: "z = 3\n"})
    (repo / holder).unlink()
    (repo / plain).unlink()
    # a bad PR that drops the capacity check: the file no longer names the mask
    (repo / dropper).write_text("if True:\n    pass\n")
    _commit(repo)
    from vmfuzz.harness.engine.campaign.changes import changed_since
    changed, checkout = changed_since(base, repo)
    assert sorted(changed) == sorted([holder, dropper, plain])
    why = {t.path: t.why for t in triggers(changed, checkout, package=None)}
    assert set(why) == {holder, dropper}
    assert all(w.startswith("named verify-mask code at") for w in why.values())
    # A deleted file the pattern list names triggers by the list.
    (repo / "python/sglang/srt/layers/attention").mkdir(parents=True)
    (repo / "python/sglang/srt/layers/attention/verify_mask.py").write_text("")
    _commit(repo, "add")
    head = _git(repo, "rev-parse", "HEAD")
    (repo / "python/sglang/srt/layers/attention/verify_mask.py").unlink()
    _commit(repo, "delete")
    changed, checkout = changed_since(head, repo)
    assert [t.why for t in triggers(changed, checkout, package=None)] == ["pattern"]


def test_documentation_only_change_skips_without_importing_sglang(tmp_path):
    listed = tmp_path / "changed.txt"
    listed.write_text("docs/advanced_features/speculative_decoding.md\nREADME.md\n"
                      "python/sglang/srt/layers/quantization/fp8.py\n")
    code = ("import sys; from vmfuzz.harness.cli import main; rc = main(['gate', '--changed-files', sys.argv[1]]); "
            "print('sglang imported' if 'sglang' in sys.modules else 'sglang not imported'); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, str(listed)], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "skipped: none of the 3 changed file(s)" in r.stdout and "sglang not imported" in r.stdout


@pytest.mark.parametrize("rev", ["--output=/tmp/vmfuzz-pwned", "-h", "HEAD\n--output=x", "no-such-rev"])
def test_a_hostile_base_is_one_line_exit_2_and_never_an_option(tmp_path, rev):
    repo, _ = _repo(tmp_path, {"a.py": "x = 1\n"})
    r = vmfuzz("gate", "--target", "reference", "--base", rev, "--repo", str(repo))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and not Path("/tmp/vmfuzz-pwned").exists()


@pytest.mark.slow
def test_a_hostile_repo_or_list_name_is_one_line_exit_2(tmp_path):
    for argv in (["--base", "HEAD", "--repo", str(tmp_path / "no\nsuch")],
                 ["--changed-files", str(tmp_path / "x"), "--repo", str(tmp_path / "no\nsuch")],
                 ["--changed-files", str(tmp_path / "mis\nsing.txt")]):
        (tmp_path / "x").write_text("a.py\n")
        r = vmfuzz("gate", "--target", "reference", *argv)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, argv


def test_hostile_paths_are_not_read_outside_the_checkout(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("VerifyMask\n")
    root = tmp_path / "root"
    root.mkdir()
    (root / "link.py").symlink_to(outside / "secret.py")
    os.mkfifo(root / "fifo.py")  # opened for reading, it would block a naive reader forever
    (root / "big.py").write_bytes(b"\0\xff" * (5 << 20) + b"VerifyMask")  # binary, past a 8 MiB cap
    paths = ["../outside/secret.py", str(outside / "secret.py"), "link.py", "fifo.py", "big.py",
             "nul\0.py", "python/sglang/../../outside/secret.py"]
    assert touches_verify_mask(paths, Checkout(root=root), package=None) == []
    (root / "small.py").write_bytes(b"\0\xff" * 100 + b"tree_mask_numel")
    assert touches_verify_mask(["small.py"], Checkout(root=root), package=None) == ["small.py"]


# -- the surface collector --------------------------------------------------------

def test_declared_parts_cover_the_existing_drivers_and_name_only_registered_properties():
    from vmfuzz.harness.properties import PROPERTIES
    entries = declared()
    where = {(e.file, e.function) for e in entries}
    assert {("srt/layers/attention/verify_mask.py", "maybe_create_verify_mask"),
            ("srt/layers/attention/verify_mask.py", "tree_mask_numel"),
            ("srt/layers/attention/verify_mask.py", "VerifyMask.fits"),
            ("srt/speculative/eagle_utils.py", "build_tree_kernel_efficient"),
            ("kernels/ops/speculative/spec_tree.py", "sgl_build_tree_kernel_triton"),
            ("srt/speculative/eagle_worker_common.py", "build_eagle_verify_input"),
            ("srt/speculative/eagle_worker_v2.py", "EAGLEWorkerV2._build_trivial_verify_input")} <= where
    unknown = {(e.module, p) for e in entries for p in e.properties if p not in PROPERTIES}
    assert not unknown, unknown


def test_a_new_module_declaring_surface_is_collected_without_editing_the_collector(tmp_path, monkeypatch):
    pkg = tmp_path / "fakedrivers"
    (pkg / "nested").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "quiet.py").write_text("X = 1\n")
    (pkg / "readers.py").write_text('SURFACE = (("srt/a.py", "read", ("no-oob-write",)),)\n')
    (pkg / "nested" / "__init__.py").write_text("")
    (pkg / "nested" / "routers.py").write_text('SURFACE = (("srt/b.py", "Router.route", ()),)\n')
    (pkg / "broken.py").write_text('SURFACE = (("python/sglang/srt/c.py", "f", ("x",)),)\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="broken.SURFACE: bad entry"):
        declared("fakedrivers")
    (pkg / "broken.py").unlink()
    got = {(e.module, e.file, e.function) for e in declared("fakedrivers")}
    assert got == {("fakedrivers.readers", "srt/a.py", "read"),
                   ("fakedrivers.nested.routers", "srt/b.py", "Router.route")}


def test_rows_say_driven_only_when_the_property_runs_and_the_code_is_there(tmp_path, monkeypatch):
    from vmfuzz.harness.properties import PROPERTIES, Property
    from vmfuzz.harness.targets.reference import ReferenceTarget
    pkg = tmp_path / "sglang"
    for rel, text in {"srt/a.py": "def read(VerifyMask):\n    pass\n", "srt/undeclared.py": "tree_mask_buf = 1\n",
                      "kernels/jit/k.cuh": "TreeMaskMode m;\n", "srt/test_a.py": "VerifyMask\n",
                      "srt/plain.py": "x = 1\n"}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    needy = Property("reader-agreement-x", PROPERTIES["no-oob-write"].check, "test", needs=("read_mask",))
    monkeypatch.setitem(PROPERTIES, needy.name, needy)
    entries = [Entry("srt/a.py", "read", ("no-oob-write", "no-such-property"), "m"),
               Entry("srt/a.py", "vanished", ("no-oob-write",), "m"),
               Entry("srt/a.py", "read", ("reader-agreement-x",), "m"),
               Entry("srt/gone.py", "f", ("no-oob-write",), "m")]
    rows = sglang_rows(ReferenceTarget(), pkg, entries)
    got = {(r.file, r.function, r.driven_by, r.why) for r in rows}
    assert ("srt/a.py", "read", ("no-oob-write",), "") in got
    assert ("srt/a.py", "vanished", (), "vanished not found in this SGLang's srt/a.py") in got
    assert ("srt/a.py", "read", (), "reader-agreement-x needs read_mask, which reference lacks") in got
    assert ("srt/gone.py", "f", (), "not in this SGLang") in got
    assert ("srt/undeclared.py", "", (), "no driver yet") in got
    assert ("kernels/jit/k.cuh", "", (), "JIT CUDA kernel: GPU only (scripts/gpu_check.sh)") in got
    assert not {r.file for r in rows} & {"srt/test_a.py", "srt/plain.py"}


# -- the gate's coverage summary ----------------------------------------------------

def test_coverage_counts_a_file_exercised_only_from_what_was_measured(package):
    # A property that is declared to drive a file and ran examples does not make the file
    # exercised: only its changed lines measured running under a property do.
    from vmfuzz.harness.engine.campaign.diff_coverage import measure
    changed = ["python/sglang/srt/layers/attention/verify_mask.py", "harness/x.py", "docs/a.md"]
    triggered = changed[:2]
    text = (package / "srt/layers/attention/verify_mask.py").read_text()
    ran_everything = [PropertyResult("no-oob-write", examples=9), PropertyResult("capacity-soundness", examples=9)]
    unmeasured = gate_coverage("sglang", None, changed, triggered, ran_everything)
    assert unmeasured["exercised"] == [] and unmeasured["why_not_driven"][changed[0]] == "not measured"
    assert unmeasured["why_not_driven"][changed[1]] == "not an SGLang file"
    fits = {"VerifyMask.fits": "no-oob-write"}
    nothing_ran = measure(changed[0], text, "/x", None, fits, {})
    g = gate_coverage("sglang", None, changed, triggered, ran_everything, lines={changed[0]: nothing_ran})
    assert g["exercised"] == [] and g["could_not_check"] == [f"{changed[0]}: VerifyMask.fits never ran (no-oob-write)"]
    body = [n for n, line in enumerate(text.splitlines(), 1) if "return bs <= self.max_bs" in line]
    fits_ran = measure(changed[0], text, "/x", None, fits, {body[0]: {"no-oob-write"}})
    assert gate_coverage("sglang", None, changed, triggered, [], lines={changed[0]: fits_ran})["exercised"] == changed[:1]
    assert gate_coverage("reference", None, changed, triggered, ran_everything)["exercised"] == []


@pytest.mark.slow
def test_gate_summary_lists_exercised_apart_from_triggered(tmp_path):
    listed = tmp_path / "changed.txt"
    listed.write_text("python/sglang/srt/layers/attention/verify_mask.py\n"
                      "python/sglang/srt/layers/attention/hybrid_attn_backend.py\ndocs/x.md\n")
    rep = tmp_path / "rep"
    r = vmfuzz("gate", "--target", "reference", "--changed-files", str(listed), "--report-dir", str(rep))
    assert r.returncode == 0, r.stdout + r.stderr
    g = json.loads((rep / "summary.json").read_text())["gate"]
    assert g["changed"] == listed.read_text().split()
    assert g["triggered"] == (g["changed"][:2] if installed_sglang() else g["changed"][:1])
    # the reference target runs its own model: it exercises no SGLang file, and says so
    assert g["exercised"] == [] and g["not_driven"] == g["triggered"]
    assert "runs its own model" in g["why_not_driven"][g["triggered"][0]]
    assert f"gate: {len(g['triggered'])} changed file(s) touch verify-mask code; exercised: none; " \
           f"triggered only (not driven): {', '.join(g['triggered'])}" in r.stdout
    assert "triggered only (not driven)" in (rep / "summary.md").read_text()
    # report.html says the same, file by file: each list under its own heading, a not-driven file with why
    html = (rep / "report.html").read_text()
    section = html[html.index('<h2 id="gate">'):]
    section = section[:section.index("</table>")]
    cells = dict(re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", section))
    heads = {re.sub("<[^>]+>", "", k).split(" (")[0]: v for k, v in cells.items()}
    assert all(f"<code>{p}</code>" in heads["changed"] for p in g["changed"])
    assert all(f"<code>{p}</code>" in heads["triggered the gate"] for p in g["triggered"])
    assert "docs/x.md" not in heads["triggered the gate"]
    assert heads["exercised"] == "none"
    assert all(f"<li><code>{p}</code>: {escape(g['why_not_driven'][p])}</li>" in heads["not driven"]
               for p in g["not_driven"])
    # a run (not a gate) has no gate object, and its page no gate section
    run = vmfuzz("run", "--max-examples", "2", "--property", "capacity-liveness", "--report-dir", str(tmp_path / "run"))
    assert run.returncode == 0 and json.loads((tmp_path / "run" / "summary.json").read_text())["gate"] is None
    assert 'id="gate"' not in (tmp_path / "run" / "report.html").read_text()


# -- vmfuzz surface ----------------------------------------------------------------

def test_surface_of_the_reference_target_says_it_runs_no_sglang_code(capsys, tmp_path):
    from vmfuzz.harness.cli import main  # in this process: the fast loop's run of the surface command

    assert main(["surface", "--target", "reference", "--json", "--report-dir", str(tmp_path / "a")]) == 0
    rep = json.loads(capsys.readouterr().out)
    from vmfuzz.harness.properties import PROPERTIES
    # the reference has no model of the cuda-graph path nor of the KV slots: those rows, and only those,
    # are not driven
    graph = {PROPERTIES[n].summary for n in ("graph-replay-equivalence", "padding-inert", "capture-replay-agreement",
                                             "kv-location-soundness", "graph-buffer-soundness")}
    assert rep["runs_sglang"] is False and len(rep["rows"]) >= 7
    assert {row["function"] for row in rep["rows"] if not row["driven"]} == graph
    assert main(["surface", "--target", "reference", "--report-dir", str(tmp_path / "b")]) == 0
    assert "runs no SGLang code" in capsys.readouterr().out


def test_surface_of_an_unavailable_target_is_one_line_exit_2():
    r = vmfuzz("surface", "--target", "nosuch")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.slow
def test_surface_on_sglang_lists_the_driven_parts_and_a_new_file_as_not_driven(package, tmp_path):
    site = altered_copy(tmp_path, [(["srt/layers/attention/verify_mask.py"], r"\Z", "\n# altered copy\n")],
                        "new router")
    (site / "sglang/srt/layers/attention/new_router.py").write_text(
        "class NewRouter:\n    @property\n    def verify_mask(self):\n        return self.child.verify_mask\n")
    r = zygote.run([sys.executable, "-m", "vmfuzz.harness.cli", "surface", "--target", "sglang", "--json"],
                   cwd=tmp_path, timeout=600, env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"})
    if r.returncode == 2 and not REQUIRE:
        pytest.skip(f"sglang target unavailable: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert Path(rep["package"]) == site / "sglang"  # the copy, not the installed package
    rows = {(row["file"], row["function"]): row for row in rep["rows"]}
    for key in (("srt/layers/attention/verify_mask.py", "VerifyMask.fits"),
                ("srt/layers/attention/verify_mask.py", "maybe_create_verify_mask"),
                ("srt/speculative/eagle_utils.py", "build_tree_kernel_efficient"),
                ("srt/speculative/eagle_worker_common.py", "build_eagle_verify_input"),
                ("srt/speculative/eagle_worker_v2.py", "EAGLEWorkerV2._build_trivial_verify_input")):
        assert rows[key]["driven"], rows[key]
    new = rows[("srt/layers/attention/new_router.py", None)]
    assert not new["driven"] and new["why"] == "no driver yet"
    assert rep["files"]["names_mask_code"] == len(_grep(package)) + 1
    listed = {row["file"] for row in rep["rows"]}
    assert set(_grep(package)) <= listed


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.slow
def test_the_gate_reads_git_paths_with_odd_names_safely(tmp_path):
    odd = "python/sglang/srt/we ird\n-name.py"
    repo, base = _repo(tmp_path, {"a.txt": "x\n"})
    (repo / "python/sglang/srt").mkdir(parents=True)
    (repo / odd).write_text("TreeMaskMode\n")
    _commit(repo)
    from vmfuzz.harness.engine.campaign.changes import changed_since
    changed, checkout = changed_since(base, repo)
    assert changed == [odd] and touches_verify_mask(changed, checkout, package=None) == [odd]
    r = vmfuzz("gate", "--target", "reference", "--base", base, "--repo", str(repo), "--report-dir", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stdout + r.stderr
    line = "vmfuzz gate: 1 changed file(s) touch verify-mask code: python/sglang/srt/we ird\\n-name.py"
    assert line in r.stdout.splitlines()
    g = json.loads((tmp_path / "rep" / "summary.json").read_text())["gate"]
    assert g["triggered"] == [odd]  # the record keeps the name as git spells it


def test_a_changed_files_list_is_capped_and_keeps_undecodable_names(tmp_path):
    from vmfuzz.harness.engine.campaign.change_paths import LIST_CAP, changed_from_file
    from vmfuzz.harness.engine.campaign.changes import ChangeError
    from vmfuzz.harness.report.terminal import shown
    listed = tmp_path / "changed.txt"
    listed.write_bytes(b"# comment\npython/sglang/srt/caf\xe9.py\n\n")
    [name] = changed_from_file(str(listed))
    assert os.fsencode(name) == b"python/sglang/srt/caf\xe9.py" and shown(name) == "python/sglang/srt/caf\ufffd.py"
    listed.write_bytes(b"a.py\n" * (LIST_CAP // 5 + 1))
    with pytest.raises(ChangeError, match="longer than|over MAX_FILE_BYTES"):
        changed_from_file(str(listed))


def test_sglang_free_helpers_stay_sglang_free():
    # The gate's skip path must not pay SGLang's import: vmfuzz.harness.engine.campaign.changes imports neither.
    code = textwrap.dedent("""
        import sys
        import vmfuzz.harness.engine.campaign.changes, vmfuzz.harness.engine.campaign.surface
        print(sorted(m for m in ('sglang', 'torch') if m in sys.modules))
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.stdout.strip() == "[]", r.stdout + r.stderr
