"""The example workflow, checked the way GitHub will read it: actionlint, and its own rules.

tests/test_sglang_repo_workflow.py runs its gate command in a stand-in SGLang
repository; here the file itself is linted (a real workflow linter, installed by
the dev extra) and held to its rules: least privilege that works
on a fork's PR, a cache the nightly saves whatever its exit code, a paths filter
equal to the gate's own list, and versions read from the project.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vmfuzz.harness.engine.campaign.changes import workflow_path_filters
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


def test_the_steps_shell_passes_shellcheck_and_a_planted_slip_is_caught(tmp_path):
    """actionlint checks each run: script with shellcheck only when shellcheck is on PATH, and
    says nothing when it is not; so this test finds it, and under CI (.ci/run installs it) fails without it."""
    found = shutil.which("shellcheck")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is not installed: .ci/run installs it (apt-get install shellcheck)")
        pytest.skip("shellcheck is not installed (apt-get install shellcheck; .ci/run installs it)")
    r = subprocess.run([actionlint(), "-no-color", "-shellcheck", found, str(WORKFLOW)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    copy = tmp_path / "workflow.yml"
    copy.write_text(WORKFLOW.read_text().replace('echo "rc=$rc" >> "$GITHUB_OUTPUT"', 'echo "rc=$rc" >> $GITHUB_OUTPUT'))
    r = subprocess.run([actionlint(), "-no-color", "-shellcheck", found, str(copy)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "SC2086" in r.stdout, r.stdout + r.stderr


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
    from vmfuzz.harness.engine.campaign.changes import _matches_pattern
    admitted = any(_github_glob(p).fullmatch(path) for p in workflow_path_filters())
    assert admitted == _matches_pattern(path)


def _admitted(path: str) -> bool:
    return any(_github_glob(p).fullmatch(path) for p in workflow()[True]["pull_request"]["paths"])


def test_the_filter_admits_every_file_the_surface_drives():
    from vmfuzz.harness.engine.campaign.surface import declared
    driven = sorted({e.file for e in declared()})
    assert len(driven) > 20, driven
    missed = [f for f in driven if not _admitted(f"python/sglang/{f}")]
    assert not missed, f"the workflow's paths filter skips PRs that touch only these driven files: {missed}"


def test_the_filter_admits_every_sglang_module_the_harness_imports_by_name():
    """A PR that changes only a module vmfuzz imports (the forward modes, a call site's input class) can
    change what the gate judges: it must reach the gate."""
    import re
    from importlib.util import find_spec
    named = set()
    for source in (ROOT / "harness").rglob("*.py"):
        named |= set(re.findall(r'"(sglang\.(?:srt|kernels)\.\w[\w.]*\w)"', source.read_text()))
    assert len(named) > 15, named
    files = []
    for name in sorted(named):
        spec = find_spec(name) if find_spec("sglang") is not None else None
        rel = (Path(spec.origin).relative_to(Path(find_spec("sglang").origin).parent).as_posix() if spec and spec.origin
               else name.removeprefix("sglang.").replace(".", "/") + ".py")
        files.append(rel)
    missed = [f for f in files if not _admitted(f"python/sglang/{f}")]
    assert not missed, f"the workflow's paths filter skips PRs that touch only these imported modules: {missed}"


def test_the_filter_admits_every_file_of_the_installed_sglang_that_triggers_the_gate():
    """Whatever file the gate's text rule (MASK_CODE) would fire on: a PR touching only it must reach the gate."""
    import os

    from vmfuzz.harness.engine.campaign.changes import CODE_SUFFIXES, installed_sglang, path_names_mask_code
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
    assert gate["permissions"] == {"contents": "read", "pull-requests": "write", "actions": "read"}
    assert nightly["permissions"] == {"contents": "read"}
    # the steps that write to the PR are skipped on a fork's PR; the summary and artifact are not
    fork_safe = "github.event.pull_request.head.repo.full_name == github.repository"
    for st in gate["steps"]:
        writes = "gh api" in st.get("run", "") or "junit" in st.get("uses", "")
        assert (fork_safe in st.get("if", "")) == writes, st
    assert any("GITHUB_STEP_SUMMARY" in st.get("run", "") and "fork" in st.get("name", "") for st in gate["steps"])


def test_one_comment_is_found_by_its_marker_and_edited():
    [step] = [st for st in workflow()["jobs"]["gate"]["steps"] if "MARKER" in (st.get("env") or {})]
    assert step["env"]["MARKER"].startswith("<!--") and "-X PATCH" in step["run"]
    assert "gh pr comment" not in WORKFLOW.read_text()


def test_the_check_step_always_runs_and_nothing_posts_a_neutral_or_skipped_pass():
    steps = workflow()["jobs"]["gate"]["steps"]
    [check] = [st for st in steps if "vmfuzz.harness.report.ci_check" in st.get("run", "")]
    assert check["if"] == "${{ !cancelled() }}"  # after a failed step too: only a cancel skips it
    assert "--exit-code \"$GATE_RC\"" in check["run"] and check["env"]["GATE_RC"] == "${{ steps.gate.outputs.rc }}"
    text = WORKFLOW.read_text()
    assert "conclusion=neutral" not in text and "checks: write" not in text
    assert "vmfuzz-accept-unchecked" in text
    # every label event reruns the gate: a job skipped on a label would count as a pass
    assert {"labeled", "unlabeled", "synchronize"} <= set(workflow()[True]["pull_request"]["types"])
    assert "github.event.label" not in text


def _db_steps(job: dict) -> list[dict]:
    return [st for st in job["steps"] if (st.get("with") or {}).get("path") == ".vmfuzz-db"]


def test_the_nightly_saves_its_cache_whatever_the_exit_code_and_the_gate_only_restores():
    jobs = workflow()["jobs"]
    uses = {name: [st.get("uses", "") for st in job["steps"]] for name, job in jobs.items()}
    assert not any(u.startswith("actions/cache@") for u in uses["gate"] + uses["nightly"])
    db = {name: [st["uses"] for st in _db_steps(jobs[name])] for name in ("gate", "nightly")}
    assert any(u.startswith("actions/cache/restore@") for u in db["gate"])
    assert not any(u.startswith("actions/cache/save@") for u in db["gate"])
    [save] = [st for st in _db_steps(jobs["nightly"]) if st["uses"].startswith("actions/cache/save@")]
    assert save["if"] == "always()"
    names = [st.get("name", st.get("uses")) for st in jobs["nightly"]["steps"]]
    assert names.index("vmfuzz nightly") < jobs["nightly"]["steps"].index(save)


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


#: what goes into the venv, each pinned by one of these files
PIN_FILES = ("pyproject.toml", "scripts/bootstrap.sh", "scripts/install_sglang.sh", "scripts/sglang/*", "scripts/sglang/pins/*")


def _jobs_that_install_the_venv() -> list[str]:
    return [name for name, job in workflow()["jobs"].items()
            if any("bootstrap.sh" in st.get("run", "") for st in job["steps"])]


@pytest.mark.parametrize("job", _jobs_that_install_the_venv())
def test_the_venv_is_restored_before_the_install_keyed_on_every_pin_and_saved_after_it(job):
    steps = workflow()["jobs"][job]["steps"]
    venv = [i for i, st in enumerate(steps) if (st.get("with") or {}).get("path") == ".vmfuzz/.venv"]
    installs = [i for i, st in enumerate(steps) if "bootstrap.sh" in st.get("run", "")
                or "install_sglang.sh" in st.get("run", "")]
    assert len(venv) == 2, f"{job} installs the venv but does not both restore and save its cache"
    [restore, save] = venv
    assert steps[restore]["uses"].startswith("actions/cache/restore@")
    assert steps[save]["uses"].startswith("actions/cache/save@")
    assert restore < min(installs) and max(installs) < save
    key = steps[restore]["with"]["key"]
    hashed = re.search(r"hashFiles\((.*?)\)", key).group(1)
    with_sglang = any("install_sglang.sh" in st.get("run", "") for st in steps)
    # each pin file of this checkout of what the job installs, as the job sees it under .vmfuzz/
    for pin in PIN_FILES if with_sglang else PIN_FILES[:2]:
        assert f"'.vmfuzz/{pin}'" in hashed, pin
        assert list(ROOT.glob(pin)), f"{pin} is not in the project: the key hashes nothing"
    if with_sglang:
        assert "'python/pyproject.toml'" in hashed  # SGLang's release picks the pins
    else:  # a venv without SGLang must never be restored where SGLang is expected
        assert "vmfuzz-venv-" not in key
    assert "steps.python.outputs.python-version" in key  # the venv links to that interpreter
    assert steps[save]["with"]["key"] == "${{ steps.venv.outputs.cache-primary-key }}"
    assert steps[save]["if"].startswith("steps.venv.outputs.cache-hit != 'true'")


def _step_script(job: str, name: str) -> str:
    [st] = [st for st in workflow()["jobs"][job]["steps"] if st.get("name") == name]
    return st["run"].replace("${{ matrix.shard }}", "1")


@pytest.mark.parametrize("job, name", [("nightly", "vmfuzz nightly"), ("nightly-merge", "vmfuzz merge")])
@pytest.mark.parametrize("code, red", [(0, False), (1, True), (2, True), (3, False), (130, True)])
def test_the_nightly_is_red_only_for_a_new_group_or_a_broken_setup(tmp_path, job, name, code, red):
    """The step's own shell, as the runner runs it (bash -e), with vmfuzz answering ``code``:
    exit 1 (a new group) and 2 (bad set-up) are red, 3 (could not check) a warning and green."""
    fake = f"#!/bin/sh\nexit {code}\n"
    for where in (tmp_path / "bin", tmp_path / ".vmfuzz" / ".venv" / "bin"):
        where.mkdir(parents=True)
        (where / "vmfuzz").write_text(fake)
        (where / "vmfuzz").chmod(0o755)
    r = subprocess.run(["bash", "-e", "-c", _step_script(job, name)], cwd=tmp_path, capture_output=True, text=True,
                       env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}, timeout=60)
    assert (r.returncode != 0) == red, (r.returncode, r.stdout, r.stderr)
    assert r.returncode in (0, code)
    assert ("::warning" in r.stdout) == (code == 3)
    # a known finding exits 0 from the CLI: the workflow never opts in to failing on one
    runs = [st.get("run", "") for j in workflow()["jobs"].values() for st in j["steps"]]
    assert not any("--fail-on-known" in r for r in runs)


def test_the_header_states_the_measured_per_pr_cost_and_labels_the_estimate():
    header = WORKFLOW.read_text().split("\nname:")[0]
    assert re.search(r"took \d+(\.\d)? s wall", header) and "measured" in header.lower()
    assert "ESTIMATE" in header and "cache hit" in header


def test_the_release_matrix_runs_nightly_on_every_pinned_release_read_only(tmp_path):
    """release-list's own shell, run over this checkout as .vmfuzz, lists every scripts/sglang/pins/V.txt;
    release-matrix runs scripts/release_matrix.sh on each of them, one leg each, on the schedule only."""
    import json
    jobs = workflow()["jobs"]
    listing, matrix = jobs["release-list"], jobs["release-matrix"]
    for job in (listing, matrix):
        assert job["if"] == "github.event_name == 'schedule'" and job["permissions"] == {"contents": "read"}
    [step] = [st for st in listing["steps"] if st.get("id") == "list"]
    (tmp_path / ".vmfuzz").symlink_to(ROOT)
    out = tmp_path / "github_output"
    r = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=tmp_path, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "GITHUB_OUTPUT": str(out)}, timeout=60)
    assert r.returncode == 0, r.stderr
    key, _, value = out.read_text().strip().partition("=")
    pinned = sorted((p.stem for p in (ROOT / "scripts" / "sglang" / "pins").glob("[0-9]*.txt")),
                    key=lambda v: tuple(int(x) for x in v.split(".")))
    assert key == "releases" and json.loads(value) == pinned and len(pinned) >= 7
    assert listing["outputs"]["releases"] == "${{ steps.list.outputs.releases }}"
    assert matrix["needs"] == "release-list" and matrix["strategy"]["fail-fast"] is False
    assert matrix["strategy"]["matrix"]["release"] == "${{ fromJSON(needs.release-list.outputs.releases) }}"
    [leg] = [st for st in matrix["steps"] if "release_matrix.sh" in st.get("run", "")]
    assert leg["env"]["RELEASE"] == "${{ matrix.release }}" and '"$RELEASE"' in leg["run"]


@pytest.mark.parametrize("code", [0, 1, 2])
def test_a_release_below_the_bar_makes_its_leg_red(tmp_path, code):
    """The leg's own shell with release_matrix.sh answering ``code``: red unless it exits 0."""
    [step] = [st for st in workflow()["jobs"]["release-matrix"]["steps"] if "release_matrix.sh" in st.get("run", "")]
    script = tmp_path / ".vmfuzz" / "scripts" / "release_matrix.sh"
    script.parent.mkdir(parents=True)
    script.write_text(f"echo \"$@\" > \"$GITHUB_WORKSPACE/args\"\nexit {code}\n")
    env = {"PATH": "/usr/bin:/bin", "RUNNER_TEMP": str(tmp_path / "tmp"), "GITHUB_WORKSPACE": str(tmp_path),
           "RELEASE": "0.5.17"}
    r = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=tmp_path, capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert (tmp_path / "args").read_text().split()[-1] == "0.5.17"


def test_no_checkout_keeps_credentials_and_no_third_party_action_is_pinned_by_tag_alone():
    """The gate job runs the PR's code: a token left in .git would be the PR's to read. An action outside
    GitHub's own (``actions/``) runs with the job's token: pinned by commit, or not used."""
    steps = [(name, step) for name, job in workflow()["jobs"].items() for step in job.get("steps", [])]
    checkouts = [(name, step) for name, step in steps if step.get("uses", "").startswith("actions/checkout@")]
    assert len(checkouts) >= 4
    leaky = [name for name, step in checkouts if (step.get("with") or {}).get("persist-credentials") is not False]
    assert not leaky, f"checkouts that keep the token in .git: {leaky}"
    loose = [step["uses"] for _, step in steps if "uses" in step and not step["uses"].startswith("actions/")
             and not re.fullmatch(r"[^@]+@[0-9a-f]{40}", step["uses"])]
    assert not loose, f"third-party actions pinned by a tag, not a commit: {loose}"


def test_every_job_installs_a_cpu_torch():
    """bootstrap.sh installs its torch pin from VMFUZZ_TORCH_INDEX; a stock runner's PyPI torch is the CUDA
    build (torch plus 16 nvidia/cuda wheels, a 5.5 GB venv), so the workflow names the CPU index for every
    job that bootstraps, and no step overrides it."""
    wf = workflow()
    assert wf["env"]["VMFUZZ_TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"
    for name, job in wf["jobs"].items():
        for step in job.get("steps", []):
            if "bootstrap.sh" in step.get("run", ""):
                assert "VMFUZZ_TORCH_INDEX" not in (step.get("env") or {}) | (job.get("env") or {}), name
                assert "VMFUZZ_TORCH=" not in step["run"], name
    assert "installs the torch it pins from\n# VMFUZZ_TORCH_INDEX" in WORKFLOW.read_text()
