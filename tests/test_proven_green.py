"""Green is measured, not declared.

The gate calls a file exercised only when coverage.py saw its changed lines run
inside a property's check; a changed line on the mask's path that no check ran
is "could not check" (exit 3), naming the lines. The change it measures is the
working tree against the base (uncommitted edits included), and a changed-files
list cannot lose an entry to its spelling. A run that drove no property is
never a pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vmfuzz.harness.engine.campaign.change_paths import changed_from_file, hunk_lines, normalise_entry
from vmfuzz.harness.engine.campaign.changes import ChangeError, changed_since
from vmfuzz.harness.engine.campaign.diff_coverage import CPU_CANNOT_TAKE, measure, parse, spans
from vmfuzz.harness.model.device_only import GPU_CHECK
from vmfuzz.harness.engine.search.results import PropertyResult
from vmfuzz.harness.engine.campaign.surface import gate_coverage
from tests.helpers import ROOT, vmfuzz


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


# -- change lists that cannot lose a file -----------------------------------------

@pytest.mark.parametrize("spelling", [
    "\ufeffpython/sglang/srt/layers/attention/verify_mask.py",  # a BOM glued to the first entry
    "python\\sglang\\srt\\layers\\attention\\verify_mask.py",  # Windows separators
    "./python/sglang/srt/layers/attention/verify_mask.py",
    "python//sglang/./srt/layers/attention/verify_mask.py",
])
def test_a_changed_files_entry_is_normalised_whatever_its_spelling(tmp_path, spelling):
    listed = tmp_path / "changed.txt"
    listed.write_bytes((spelling + "\r\n").encode("utf-8"))
    assert changed_from_file(str(listed), tmp_path) == ["python/sglang/srt/layers/attention/verify_mask.py"]


def test_an_absolute_entry_inside_the_checkout_is_made_relative_and_one_outside_is_refused(tmp_path):
    root = tmp_path / "checkout"
    (root / "python").mkdir(parents=True)
    inside = root / "python" / "x.py"
    assert normalise_entry(str(inside), root) == "python/x.py"
    assert normalise_entry(str(inside).replace("/", "\\"), root) == "python/x.py"
    with pytest.raises(ChangeError, match="absolute path outside the checkout"):
        normalise_entry("/etc/passwd", root)
    with pytest.raises(ChangeError, match="does not name a file inside the checkout"):
        normalise_entry("python/../../x.py", root)


def test_the_gate_refuses_an_entry_it_cannot_place_naming_it(tmp_path):
    listed = tmp_path / "changed.txt"
    listed.write_text("python/sglang/srt/layers/attention/verify_mask.py\n/elsewhere/verify_mask.py\n")
    r = vmfuzz("gate", "--target", "reference", "--changed-files", str(listed), "--report-dir", str(tmp_path / "r"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "/elsewhere/verify_mask.py" in r.stderr and "Traceback" not in r.stderr


def test_hunks_give_the_new_sides_lines_and_a_deletion_its_neighbours():
    diff = "@@ -3,0 +4,2 @@\n+a\n+b\n@@ -10 +12 @@\n-x\n+y\n@@ -20,2 +21,0 @@\n-p\n-q\n"
    assert sorted(hunk_lines(diff)) == [4, 5, 12, 21, 22]


def test_base_sees_uncommitted_and_untracked_changes(tmp_path):
    repo = tmp_path / "checkout"
    (repo / "python").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / "python" / "a.py").write_text("x = 1\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    assert changed_since(base, repo)[0] == []
    (repo / "python" / "a.py").write_text("x = 2\n")  # unstaged
    (repo / "python" / "new.py").write_text("y = 1\n")  # untracked
    changed, checkout = changed_since(base, repo)
    assert sorted(changed) == ["python/a.py", "python/new.py"]
    from vmfuzz.harness.engine.campaign.change_paths import changed_lines
    assert changed_lines(checkout, "python/a.py") == frozenset({1})
    assert changed_lines(checkout, "python/new.py") == frozenset({1, 2})  # every line of a new file


# -- changed lines judged by measurement -------------------------------------------

SOURCE = '''\
import os

LIMIT = 4


class Mask:
    def fits(self, bs):
        """docstring"""
        if _is_hip:
            return bs < LIMIT
        return bs <= LIMIT

    def decode_only(self):
        return 1


def helper():
    return 2
'''


def test_a_changed_line_on_the_mask_path_that_no_property_ran_is_named():
    ran = {11: {"no-oob-write"}, 7: {""}}  # line 11 ran in a check; the def line only at import
    m = measure("p.py", SOURCE, "/x/p.py", frozenset({3, 8, 10, 11, 14, 18}), {"Mask.fits": "no-oob-write"}, ran)
    assert m.judged == {11: ["no-oob-write"]}
    # the HIP branch of a mask-path function: no CPU takes it, so it needs a device, apart from a gap
    assert m.needs_device == [10]
    assert m.why_device[10] == "HIP branch: needs a ROCm device"
    # a module constant no check observed, and functions no surface row names that nothing ran: each is
    # could not check (the table gives the reason, the measurement decides)
    assert m.never_ran == [3, 14, 18]
    assert "not even at import" in m.why_never[3] and m.why_never[18].startswith("helper: ")
    assert not m.exercised
    m.path = "python/sglang/p.py"
    g = gate_coverage("sglang", None, [m.path], [m.path], [], lines={m.path: m})
    assert g["exercised"] == [] and g["not_driven"] == [m.path]
    assert g["needs_gpu"] == [
        f"python/sglang/p.py line 10 needs a GPU (HIP branch: needs a ROCm device); check them with {GPU_CHECK}"]
    assert g["could_not_check"][1].startswith("python/sglang/p.py lines 3, 14, 18 never ran (")


def test_a_cpu_engine_branch_is_not_driven_here_never_needs_a_gpu():
    text = SOURCE.replace("if _is_hip:", "if _is_cpu:")
    m = measure("p.py", text, "/x/p.py", frozenset({10}), {"Mask.fits": "no-oob-write"}, {})
    assert m.needs_device == [] and m.never_ran == [10]
    assert m.why_never[10] == f"not driven: {CPU_CANNOT_TAKE['_is_cpu']}"
    m.path = "python/sglang/p.py"
    g = gate_coverage("sglang", None, [m.path], [m.path], [], lines={m.path: m})
    assert g["needs_gpu"] == [] and g["could_not_check"][0].startswith("python/sglang/p.py line 10 never ran (not driven")


@pytest.mark.parametrize("condition,needs", [
    ("_is_cuda", "CUDA branch"),
    ("batch.seq_lens.is_cuda and topk == 1", "CUDA tensor branch"),
    ("_is_cuda or _is_hip", "CUDA branch"),
    ("self.fa_impl_ver == 4", "FA4 branch"),
    ("torch.cuda.is_available()", "CUDA branch"),
    ("not (not _is_cuda)", "CUDA branch"),  # the else of ``if not _is_cuda:``
    ("self._forks_draft_metadata_prep()", "CUDA side-stream fork"),  # true only on torch.cuda
    ("join_in_graph_metadata_prep()", "a forked draft in-graph metadata prep"),  # left only by that fork
    ("not join_in_graph_metadata_prep()", None),
    ("self.model_runner.capture_tail_hooks", "capture tail hook"),  # a loop over it: appended only on a GPU
    ("self.model_runner.capture_head_hooks", None),  # nothing appends one: not the device's
    ("self.model_runner.hisparse_coordinator is not None", "HiSparse row count"),
    ("self._cp_kv_pending is not None", "pending context-parallel"),
    ("self.hisparse_coordinator is not None", None),  # other HiSparse branches: not claimed here
    ("_is_cuda or bs > 8", None),  # a CPU takes it when bs > 8
    ("not _is_cuda", None),  # the CPU's own branch
    ("bs > 8", None),
])
def test_the_device_table_reads_a_branch_by_its_condition(condition, needs):
    from vmfuzz.harness.model.device_only import device_branch
    got = device_branch((condition,))
    assert (got is None) if needs is None else (got or "").startswith(needs), got


@pytest.mark.parametrize("path,triggered_as", [
    ("sgl-kernel/csrc/speculative/tree.cuh", "CUDA kernel source"),
    ("third_party/sglang/python/sglang/kernels/jit/csrc/speculative/tree.cuh", "CUDA kernel source"),
    ("sgl-kernel/include/sgl_kernel_ops.h", "SGLang's compiled kernel package"),
    ("sgl-kernel/python/sgl_kernel/speculative.py", "SGLang's compiled kernel package"),
])
def test_a_kernel_source_anywhere_in_the_checkout_is_could_not_check_and_needs_a_gpu(path, triggered_as):
    """Before: "not an SGLang file", exit 0, for the mask's own CUDA kernel outside python/sglang."""
    g = gate_coverage("sglang", None, [path], [path], [], lines={})
    assert g["exercised"] == [] and g["why_not_driven"][path].startswith("needs a GPU: " + triggered_as)
    assert g["could_not_check"] == g["needs_gpu"] and len(g["needs_gpu"]) == 1 and GPU_CHECK in g["needs_gpu"][0]


@pytest.mark.parametrize("path,needs", [
    ("python/sglang/srt/layers/attention/deepseek_v4_backend_hip_radix.py", "HIP-only backend"),
    ("python/sglang/srt/layers/attention/aiter_backend.py", "AITER backend"),
    ("python/sglang/srt/layers/attention/triton_backend.py", None),
])
def test_a_traced_file_only_one_device_runs_needs_it_for_every_unrun_line(path, needs):
    """Before: the file-kind rows applied only to files with nothing traced, so a HIP backend's
    Python lines (no CPU branch test in them) read "not driven here", a harness gap to close."""
    m = measure(path, SOURCE, "/x/p.py", frozenset({11}), {"Mask.fits": "no-oob-write"}, {})
    if needs is None:
        assert m.needs_device == [] and m.never_ran == [11]
    else:
        assert m.needs_device == [11] and m.never_ran == [] and m.why_device[11].startswith(needs)
    ran = measure(path, SOURCE, "/x/p.py", frozenset({11}), {"Mask.fits": "no-oob-write"}, {11: {"no-oob-write"}})
    assert ran.judged == {11: ["no-oob-write"]} and ran.needs_device == []  # what ran is judged, device or not


def test_a_file_is_exercised_when_its_mask_path_lines_ran_under_a_property():
    ran = {10: {"shared:no-oob-write+fallback-equivalence"}, 11: {"capacity-soundness"}}
    m = measure("p.py", SOURCE, "/x/p.py", frozenset({10, 11}), {"Mask.fits": "no-oob-write"}, ran)
    from vmfuzz.harness.properties.shared import group_members, group_name
    group = group_name(("no-oob-write", "fallback-equivalence"))
    m2 = measure("p.py", SOURCE, "/x/p.py", frozenset({10}), {"Mask.fits": "no-oob-write"}, {10: {group}})
    assert m2.judged == {10: sorted(group_members(group))}  # a shared group's lines are each member's
    assert m.exercised and m.never_ran == [] and m.judged[11] == ["capacity-soundness"]
    g = gate_coverage("sglang", None, ["p.py"], ["p.py"], [], lines={"p.py": m})
    assert g["exercised"] == ["p.py"] and g["could_not_check"] == []


def test_without_a_diff_every_mask_path_function_of_the_file_must_be_entered():
    entered = measure("p.py", SOURCE, "/x/p.py", None, {"Mask.fits": "no-oob-write"}, {11: {"no-oob-write"}})
    assert entered.exercised and entered.functions["Mask.fits"] == {
        "entered": True, "statements": 3, "ran": 1, "driven_by": "no-oob-write"}
    # entered only at import (the def line), or by no property: not exercised, and a could-not-check line
    path = "python/sglang/p.py"
    missed = measure(path, SOURCE, "/x/p.py", None, {"Mask.fits": "no-oob-write"}, {7: {""}, 11: {""}})
    assert not missed.exercised
    g = gate_coverage("sglang", None, [path], [path], [], lines={path: missed})
    assert g["could_not_check"] == [f"{path}: Mask.fits never ran (no-oob-write)"]


def test_statements_span_their_lines_and_headers_are_apart():
    src = parse(SOURCE)
    assert src.statement_at(8) is None  # a docstring runs nothing
    assert src.statement_at(7).header and src.statement_at(10).conditions == ("_is_hip",)
    assert src.statement_at(11).conditions == ()
    assert src.resolve("Scheduler.decode_only") == ["Mask.decode_only"]  # a mixin spelt by its host
    assert spans([3, 4, 5, 9]) == "3-5, 9"


# -- a run that drove nothing ---------------------------------------------------

def test_a_run_in_which_no_selected_property_was_driven_is_could_not_check(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "no_route_plugin.py").write_text(
        "from vmfuzz.harness.targets import resolve\nno_router = resolve('reference')\nno_router.route = None\n")
    r = vmfuzz("run", "--target", "no_route_plugin:no_router", "--property", "routing", "--seed", "1",
               "--report-dir", str(tmp_path / "r"),
               env={"PYTHONPATH": os.pathsep.join([str(ROOT), str(plugins)])})
    assert r.returncode == 3, r.stdout + r.stderr
    assert "could not check: none of the 1 selected property could be driven" in r.stderr


# -- the gate on a checkout under review (SGLang) -------------------------------

VERIFY_MASK = "srt/layers/attention/verify_mask.py"


@pytest.fixture
def checkout(tmp_path, sglang_target):
    """A git checkout of the installed SGLang (symlinks, verify_mask.py a real file), committed."""
    from importlib.util import find_spec

    from tests.sglang_copies import _mirror
    package = Path(find_spec("sglang").origin).parent
    repo = tmp_path / "sglang-checkout"
    (repo / "python").mkdir(parents=True)
    _mirror(package, repo / "python" / "sglang", package, {Path(VERIFY_MASK): (package / VERIFY_MASK).read_text()})
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    return repo


def _edit(repo: Path, old: str, new: str) -> None:
    path = repo / "python" / "sglang" / VERIFY_MASK
    text = path.read_text()
    assert old in text, f"{old!r} is no longer in {VERIFY_MASK}"
    path.write_text(text.replace(old, new, 1))


def _gate(repo: Path, tmp_path: Path):
    # One property, the one that judges fits: with a diff only the functions a change touches must run,
    # so the verdict is the same as the whole gate's in a fraction of its time (the whole gate on a
    # changed verify_mask.py is timed in PERFORMANCE.md; a pristine whole gate is test_deep_corpus's).
    reports = tmp_path / "reports"
    r = vmfuzz("gate", "--target", "sglang", "--base", "HEAD", "--repo", str(repo), "--report-dir", str(reports),
               "--property", "capacity-soundness", timeout=600)
    assert (reports / "summary.json").is_file(), f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    summary = json.loads((reports / "summary.json").read_text())
    return r, summary


@pytest.mark.slow
def test_an_uncommitted_off_by_one_is_caught_not_skipped(checkout, tmp_path):
    # Before: --base compared the base with HEAD only, so this was a skip and exit 0.
    _edit(checkout, "return bs <= self.max_bs", "return bs <= self.max_bs + 1")
    r, summary = _gate(checkout, tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "capacity-soundness" in {f["property"] for f in summary["findings"]}


@pytest.mark.slow
def test_a_changed_line_no_property_ran_is_could_not_check_and_a_judged_one_is_judged(checkout, tmp_path):
    # A refactor of two lines: one in fits (every search runs it), one in tree_mask_numel's
    # refusal of the bit-packed layout (which no allocation asks it to size).
    # (fits' line only re-laid: the same expression, so reaching it judges it; `not bs > max_bs` would
    # be a rewrite equal only in fact, exit 3 unless an example told the two apart: test_provoked.py)
    _edit(checkout, "return bs <= self.max_bs", "return (bs <= self.max_bs)")
    _edit(checkout, 'raise NotImplementedError(f"Invalid tree mask: {mode=}")',
          'raise NotImplementedError(f"Invalid tree mask: mode={mode!r}")')
    r, summary = _gate(checkout, tmp_path)
    [lines] = summary["gate"]["lines"]
    assert lines["changed_lines"] and len(lines["changed_lines"]) == 2, lines
    [fits_line] = [int(k) for k in lines["judged"]]
    assert "capacity-soundness" in lines["judged"][str(fits_line)]
    [refusal] = lines["never_ran"]
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"verify_mask.py line {refusal} never ran (tree_mask_numel: " in r.stderr
    assert summary["gate"]["exercised"] == [] and summary["gate"]["could_not_check"]


@pytest.mark.slow
def test_a_refactor_whose_lines_all_ran_is_exercised(checkout, tmp_path):
    _edit(checkout, "return bs <= self.max_bs", "return (bs <= self.max_bs)")
    r, summary = _gate(checkout, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert summary["gate"]["exercised"] == [f"python/sglang/{VERIFY_MASK}"]


# -- the ledger of promised sub-checks -----------------------------------------------

#: The reference model, its eager reader gathering KV ids through "a kernel vmfuzz does not
#: recognise": the view comes back without them, so reader-agreement cannot judge them.
UNRECOGNISED_GATHER = '''
import dataclasses
from vmfuzz.harness.targets import resolve

blind = resolve("reference")
_read = blind.read_eager
blind.read_eager = lambda *a, **k: dataclasses.replace(_read(*a, **k), kv_indices=None)
'''


def test_a_sub_check_no_case_judged_is_not_held_and_the_gate_cannot_check(tmp_path):
    from vmfuzz.harness.properties import sub_checks_not_driven
    from vmfuzz.harness.properties.kit import Observation, ledger, sub_check_done, sub_check_skipped
    obs = Observation()
    sub_check_done(obs, "mask cells")
    sub_check_skipped(obs, "kv_indices", "gathered elsewhere")
    assert ledger(("mask cells", "kv_indices", "windows"), obs.classes) == {
        "mask cells": "done", "kv_indices": "not driven (gathered elsewhere)", "windows": "not driven (never reached)"}
    assert sub_checks_not_driven("capacity-soundness", obs.classes) == {}  # it promises none

    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "gather_plugin.py").write_text(UNRECOGNISED_GATHER)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(plugins)])}
    r = vmfuzz("run", "--target", "gather_plugin:blind", "--property", "reader-agreement", "--seed", "1",
               "--max-examples", "10", "--report-dir", str(tmp_path / "run"), env=env)
    # a promise not kept is never held: its own status and count, exit 3, "could not check" in every report
    assert r.returncode == 3, r.stdout + r.stderr
    assert "held in part" in r.stdout and "sub-check kv_indices: not driven" in r.stdout, r.stdout
    assert r.stdout.strip().splitlines()[-1].startswith("could not check (held in part): reader-agreement"), r.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    [prop] = summary["properties"]
    assert prop["sub_checks"]["kv_indices"].startswith("not driven") and prop["sub_checks"]["kv_indptr"] == "done"
    assert prop["status"] == "held in part", prop["status"]
    assert summary["counts"]["held_in_part"] == 1 and summary["counts"]["held"] == 0, summary["counts"]
    assert summary["verdict"]["kind"] == "held in part" and summary["verdict"]["exit_code"] == 3, summary["verdict"]
    assert "**COULD NOT CHECK** (held in part)" in (tmp_path / "run" / "summary.md").read_text().splitlines()[0]
    junit = (tmp_path / "run" / "junit.xml").read_text()
    assert 'name="reader-agreement"' in junit and "could not check: held in part: sub-check kv_indices" in junit, junit
    listed = tmp_path / "changed.txt"
    listed.write_text("python/sglang/srt/layers/attention/triton_backend.py\n")
    g = vmfuzz("gate", "--target", "gather_plugin:blind", "--changed-files", str(listed),
               "--report-dir", str(tmp_path / "gate"), env=env)
    assert g.returncode == 3, g.stdout + g.stderr
    assert "reader-agreement's sub-check kv_indices was not judged" in g.stderr
    # the gate's first line, title and counts say what its exit code says (they said "passed", count 0)
    gate_summary = json.loads((tmp_path / "gate" / "summary.json").read_text())
    assert gate_summary["counts"]["could_not_check"] >= 1 and gate_summary["verdict"]["exit_code"] == 3, gate_summary
    first = (tmp_path / "gate" / "summary.md").read_text().splitlines()[0]
    assert "**COULD NOT CHECK**" in first and "passed" not in first, first
    assert "<title>vmfuzz gather_plugin:blind: could not check" in (tmp_path / "gate" / "report.html").read_text()


# -- the recording itself ------------------------------------------------------------

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def add_one(ptr, n: tl.constexpr):
    i = tl.arange(0, n)
    tl.store(ptr + i, tl.load(ptr + i) + 1)
'''

HOST = '''
import torch
import kern_a
import kern_b


def step():
    x = torch.zeros(4, dtype=torch.int32)
    kern_a.add_one[(1,)](x, 4)
    after_a = int(x.sum())
    kern_b.add_one[(1,)](x, 4)
    return after_a + int(x.sum())
'''

DRIVE = '''
import json, sys
from pathlib import Path
from vmfuzz.harness.engine.core import line_trace
here = Path(sys.argv[1])
sys.path.insert(0, str(here))
line_trace.start(here / "rec", [here / "host.py", here / "kern_b.py"])
import host
with line_trace.judging("no-oob-write"):
    assert host.step() == 12
line_trace.stop()
print(json.dumps({Path(f).name: {n: sorted(c) for n, c in lines.items()}
                  for f, lines in line_trace.merged(here / "rec").items()}))
'''


def test_lines_are_recorded_under_the_property_and_kernels_of_unchanged_files_run_untraced(tmp_path):
    pytest.importorskip("triton")
    (tmp_path / "kern_a.py").write_text(KERNEL)
    (tmp_path / "kern_b.py").write_text(KERNEL)
    (tmp_path / "host.py").write_text(HOST)
    (tmp_path / "drive.py").write_text(DRIVE)
    r = subprocess.run([sys.executable, str(tmp_path / "drive.py"), str(tmp_path)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    ran = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(ran) == {"host.py", "kern_b.py"}  # kern_a.py is traced by nobody
    # the host frame is still measured after an untraced kernel's launch returns (lines 8-12)
    assert sorted(map(int, ran["host.py"])) == [8, 9, 10, 11, 12]
    assert all(ctx == ["no-oob-write"] for ctx in ran["host.py"].values())
    assert {8, 9} <= set(map(int, ran["kern_b.py"]))  # a changed kernel's own body is measured


def test_a_process_that_cannot_record_says_so_and_its_check_still_runs(tmp_path, monkeypatch):
    """coverage missing in a worker is the harness's own failure: never the check's raise (a finding on
    SGLang), and the gate reads it as could not check."""
    from vmfuzz.harness.engine.core import line_trace
    monkeypatch.setitem(sys.modules, "coverage", None)  # import coverage -> ImportError
    monkeypatch.setattr(line_trace, "_recorder", None)
    line_trace.start(tmp_path / "rec", [tmp_path / "x.py"])
    try:
        with line_trace.judging("no-oob-write"):
            ran = True
    finally:
        line_trace.stop()
    assert ran and line_trace.failures(tmp_path / "rec")[0].startswith(("ImportError", "ModuleNotFoundError"))


def test_a_decode_branch_of_a_mask_path_function_is_could_not_check_and_the_table_says_why():
    src = ("def init_forward_metadata(forward_mode, bs):\n"
           "    if forward_mode.is_decode_or_idle():\n"
           "        cu = bs + 1\n"
           "    elif forward_mode.is_target_verify():\n"
           "        cu = bs * 2\n"
           "    if not (forward_mode.is_target_verify()):\n"
           "        cu = 0\n"
           "    return cu\n")
    m = measure("python/sglang/b.py", src, "/x/b.py", frozenset({3, 5, 7}),
                {"init_forward_metadata": "reader-agreement"}, {})
    # before: the decode lines were "outside" and the gate exited 0 on them; no property ran them
    assert m.never_ran == [3, 5, 7]
    assert m.why_never[3] == ("not driven: init_forward_metadata: off the mask's path: runs only when "
                              "forward_mode.is_decode_or_idle()")
    assert m.why_never[5] == "init_forward_metadata: reader-agreement"


def test_a_loop_body_is_read_by_what_it_iterates():
    """A body that runs only when its loop's iterable holds something: the decode runner's capture tail hooks,
    which only a GPU kernel plugin appends (0.5.23's line 1470 was "not driven" before)."""
    from vmfuzz.harness.engine.campaign.diff_coverage import parse
    text = ("def run_once(self, out):\n"
            "    for hook in self.model_runner.capture_tail_hooks:\n"
            "        hook(self, out)\n"
            "    else:\n"
            "        done = True\n"
            "    return out\n")
    by_line = {s.first: s.conditions for s in parse(text).statements}
    assert by_line[3] == ("self.model_runner.capture_tail_hooks",) and by_line[5] == ()
