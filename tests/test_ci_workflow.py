"""The example workflow, checked the way GitHub will read it: actionlint, and its own rules.

tests/test_sglang_repo_workflow.py runs its gate command in a stand-in SGLang
repository; here the file itself is linted (a real workflow linter, installed by
the dev extra) and held to its rules: least privilege that works
on a fork's PR, a cache the nightly saves whatever its exit code, a paths filter
equal to the gate's own list, and versions read from the project.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.engine.changes import workflow_path_filters
from tests.helpers import ROOT

WORKFLOW = ROOT / "examples" / "sglang-verify-mask-gate.yml"


def actionlint() -> str:
    # the interpreter's own bin/ first: the dev extra installs it there, and a venv need not be on PATH
    found = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
    if found is None:
        pytest.fail("actionlint is not installed: bash scripts/bootstrap.sh installs it (the dev extra)")
    return found


def lint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([actionlint(), "-no-color", str(path)], capture_output=True, text=True, timeout=120)


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def test_the_example_workflow_passes_actionlint():
    r = lint(WORKFLOW)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("old,new,complaint", [
    ("${{ github.base_ref }}", "${{ github.base_reff }}", "base_reff"),  # a context that does not exist
    ("      pull-requests: write", "      pull-request: write", "pull-request"),  # a permission scope that does not exist
    ("      - name: vmfuzz nightly\n", "      - nme: vmfuzz nightly\n", "nme"),  # a misspelt step key
])
def test_actionlint_finds_a_mistake_planted_in_a_copy(tmp_path, old, new, complaint):
    text = WORKFLOW.read_text()
    assert old in text
    copy = tmp_path / "workflow.yml"
    copy.write_text(text.replace(old, new, 1))
    r = lint(copy)
    assert r.returncode != 0 and complaint in r.stdout, r.stdout + r.stderr


def test_paths_filter_is_the_gates_own_list():
    assert workflow()[True]["pull_request"]["paths"] == workflow_path_filters()  # YAML reads `on` as True


def _github_glob(pattern: str) -> re.Pattern:
    """A paths filter as GitHub reads it: ``**`` crosses ``/``, ``*`` does not."""
    parts = (".*" if p == "**" else "[^/]*" if p == "*" else re.escape(p) for p in re.split(r"(\*\*|\*)", pattern))
    return re.compile("".join(parts))


@pytest.mark.parametrize("path", [
    "python/sglang/srt/layers/attention/verify_mask.py", "python/sglang/srt/speculative/eagle_worker_v2.py",
    "sgl-kernel/csrc/speculative/tree.cuh", "python/sglang/srt/speculative/tree_kernels.cu",
    "python/sglang/srt/layers/attention/tree_mask_helpers.py", "python/sglang/srt/my_spec_tree_utils.py",
    "third_party/vmfuzz/harness/cli/parser.py", "docs/index.md", "python/sglang/srt/layers/quantization/fp8.py",
    "python/sglang/srt/layers/attention/verify_mask.pyi", "README.md",
])
def test_the_filter_admits_exactly_the_paths_the_gate_matches(path):
    from harness.engine.changes import _matches_pattern
    admitted = any(_github_glob(p).fullmatch(path) for p in workflow_path_filters())
    assert admitted == _matches_pattern(path)


def _admitted(path: str) -> bool:
    return any(_github_glob(p).fullmatch(path) for p in workflow()[True]["pull_request"]["paths"])


def test_the_filter_admits_every_file_the_surface_drives():
    from harness.engine.surface import declared
    driven = sorted({e.file for e in declared()})
    assert len(driven) > 20, driven
    missed = [f for f in driven if not _admitted(f"python/sglang/{f}")]
    assert not missed, f"the workflow's paths filter skips PRs that touch only these driven files: {missed}"


def test_the_filter_admits_every_file_of_the_installed_sglang_that_triggers_the_gate():
    """Whatever file the gate's text rule (MASK_CODE) would fire on: a PR touching only it must reach the gate."""
    import os

    from harness.engine.changes import CODE_SUFFIXES, installed_sglang, path_names_mask_code
    from tests.helpers import REQUIRE_SGLANG
    package = installed_sglang()
    if package is None:
        if REQUIRE_SGLANG:
            pytest.fail("VMFUZZ_REQUIRE_SGLANG=1 but no sglang package is installed")
        pytest.skip("no sglang package installed (scripts/install_sglang.sh)")
    named = []
    for folder, subfolders, files in os.walk(package):
        subfolders[:] = [d for d in subfolders if d != "__pycache__"]
        named += [os.path.relpath(os.path.join(folder, f), package).replace(os.sep, "/") for f in files
                  if f.endswith(CODE_SUFFIXES) and path_names_mask_code(Path(folder) / f)]
    assert len(named) > 20, named
    missed = sorted(f for f in named if not _admitted(f"python/sglang/{f}"))
    assert not missed, f"the workflow's paths filter skips PRs that touch only these mask-code files: {missed}"


def test_only_the_gate_job_may_write_and_the_workflow_reads():
    wf = workflow()
    assert wf["permissions"] == {"contents": "read"}
    gate, nightly = wf["jobs"]["gate"], wf["jobs"]["nightly"]
    assert gate["permissions"] == {"contents": "read", "pull-requests": "write", "checks": "write"}
    assert nightly["permissions"] == {"contents": "read"}
    # the steps that write to the PR are skipped on a fork's PR; the summary and artifact are not
    fork_safe = "github.event.pull_request.head.repo.full_name == github.repository"
    for st in gate["steps"]:
        writes = "gh api" in st.get("run", "") or "junit" in st.get("uses", "")
        assert (fork_safe in st.get("if", "")) == writes, st
    assert any("GITHUB_STEP_SUMMARY" in st.get("run", "") and "fork" in st.get("name", "") for st in gate["steps"])


def test_one_comment_is_found_by_its_marker_and_edited():
    [step] = [st for st in workflow()["jobs"]["gate"]["steps"] if "gh api" in st.get("run", "")]
    assert step["env"]["MARKER"].startswith("<!--") and "-X PATCH" in step["run"]
    assert "gh pr comment" not in WORKFLOW.read_text()


def test_the_nightly_saves_its_cache_whatever_the_exit_code_and_the_gate_only_restores():
    jobs = workflow()["jobs"]
    uses = {name: [st.get("uses", "") for st in job["steps"]] for name, job in jobs.items()}
    assert not any(u.startswith("actions/cache@") for u in uses["gate"] + uses["nightly"])
    assert any(u.startswith("actions/cache/restore@") for u in uses["gate"])
    assert not any(u.startswith("actions/cache/save@") for u in uses["gate"])
    [save] = [st for st in jobs["nightly"]["steps"] if st.get("uses", "").startswith("actions/cache/save@")]
    assert save["if"] == "always()"
    names = [st.get("name", st.get("uses")) for st in jobs["nightly"]["steps"]]
    assert names.index("vmfuzz nightly") < names.index(save["uses"])


def test_versions_come_from_the_project():
    text = WORKFLOW.read_text()
    assert "bootstrap.sh" in text and "pip install" not in text  # the torch pin and deps: the project's
    assert "torch==" in (ROOT / "scripts" / "bootstrap.sh").read_text()


def test_the_nightly_shards_cover_every_property_once_and_are_merged():
    """--shard K/N with N the matrix's size, each K in it once, and a merge job over them all."""
    import re
    jobs = workflow()["jobs"]
    shards = jobs["nightly"]["strategy"]["matrix"]["shard"]
    [run] = [st["run"] for st in jobs["nightly"]["steps"] if st.get("name") == "vmfuzz nightly"]
    n = int(re.search(r'--shard "\$\{\{ matrix\.shard \}\}/(\d+)"', run).group(1))
    assert sorted(shards) == list(range(1, n + 1))
    merge = jobs["nightly-merge"]
    assert merge["needs"] == "nightly" and "always()" in merge["if"]
    assert merge["permissions"] == {"contents": "read"}
    assert any("vmfuzz merge shards/*" in st.get("run", "") for st in merge["steps"])
