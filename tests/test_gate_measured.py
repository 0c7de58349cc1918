"""What needs a check is measured, never read from a table.

Each changed statement of a triggered file is judged (coverage.py saw it run in
a property's check), a pure definition (import, ``@overload`` stub,
``TYPE_CHECKING`` block, bare annotation), or could not check: exit 3, "needs a
GPU" where no CPU takes its branch, else "not driven here". Tables (the surface,
the off-path modes) give reasons only. The end-to-end cases plant each change
in a git checkout of the installed SGLang (symlinks, the edited files real) and
run the gate on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from vmfuzz.harness.commands.gate import vendored_checkout
from vmfuzz.harness.engine.campaign.change_paths import changed_lines
from vmfuzz.harness.engine.campaign.changes import Checkout, sglang_relative, triggers
from vmfuzz.harness.engine.campaign.covered_files import COVERED_BY_PROPERTIES
from vmfuzz.harness.engine.campaign.bound_at_import import read_plan, reads
from vmfuzz.harness.engine.campaign.diff_coverage import measure, properties
from vmfuzz.harness.engine.core.line_trace import AT_IMPORT
from vmfuzz.harness.engine.campaign.surface import gate_coverage
from tests.helpers import ROOT, vmfuzz


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


# -- the measurement decides, line by line ---------------------------------------

MODULE = '''\
from typing import TYPE_CHECKING, overload

import torch

if TYPE_CHECKING:
    from x import Y

_SLACK = 0
if torch.cuda.is_available():
    _SLACK = 1


class Mask:
    max_bs: int
    is_read: bool = True

    def fits(self, bs):
        return bs <= self.max_bs + _slack()


def _slack():
    if torch.cuda.is_available():
        return 1
    return _SLACK


@overload
def make(n: int) -> int: ...
@overload
def make(n: str) -> str: ...
def make(n):
    return n
'''


def test_a_module_level_line_under_a_cuda_test_needs_a_gpu_and_one_seen_only_at_import_is_not_judged():
    ran = {8: {""}, 9: {""}, 18: {"capacity-soundness"}, 22: {"capacity-soundness"}, 24: {"capacity-soundness"}}
    m = measure("p.py", MODULE, "/x/p.py", frozenset({8, 9, 10}), {}, ran)
    # before: all three were "at import" and the gate exited 0 without ever seeing line 10 run
    assert m.needs_device == [10] and m.why_device[10].startswith("CUDA branch")
    assert m.never_ran == m.at_import == [8, 9] and "outside every property's check" in m.why_never[8]
    assert not m.exercised


def test_a_new_helper_whose_cuda_branch_never_ran_counts_though_no_surface_row_names_it():
    ran = {18: {"capacity-soundness"}, 22: {"capacity-soundness"}, 24: {"capacity-soundness"}}
    m = measure("p.py", MODULE, "/x/p.py", frozenset(range(21, 25)), {"Mask.fits": "capacity-soundness"}, ran)
    # before: "outside" (no surface row names _slack), exit 0
    assert m.judged == {21: ["capacity-soundness"], 22: ["capacity-soundness"], 24: ["capacity-soundness"]}
    assert m.needs_device == [23]


def test_pure_typing_is_a_definition_and_a_class_field_default_is_code():
    ran = {18: {"capacity-soundness"}, 33: {"capacity-soundness"}}
    m = measure("p.py", MODULE, "/x/p.py", frozenset({1, 5, 6, 14, 15, 27, 28, 29, 30}), {}, ran)
    # before: the overload stubs' bodies "never ran" (exit 3) on a change that is typing alone
    assert m.definitions == [1, 5, 6, 14, 27, 28, 29, 30] and m.never_ran == [15]
    assert m.judged == {} and m.needs_device == []
    typing_only = measure("p.py", MODULE, "/x/p.py", frozenset({1, 5, 6, 14, 27, 28, 29, 30}), {}, ran)
    g = gate_coverage("sglang", None, ["python/sglang/p.py"], ["python/sglang/p.py"], [],
                      lines={"python/sglang/p.py": typing_only})
    assert g["could_not_check"] == [], g


def test_a_def_line_is_judged_once_its_body_ran_in_a_check():
    m = measure("p.py", MODULE, "/x/p.py", frozenset({17, 21}), {}, {18: {"no-oob-write"}})
    assert m.judged == {17: ["no-oob-write"]} and m.never_ran == [21]


def test_a_module_table_entry_no_check_read_is_not_judged():
    text = "POLICY = {\n    'triton': 1,\n    'aiter': 2,\n}\n\ndef pick(name):\n    return POLICY[name]\n"
    ran = {1: {AT_IMPORT}, 2: {AT_IMPORT}, 3: {AT_IMPORT}, 7: {"routing"}}
    # routing read the table, but a lookup of 'triton' never consults the changed 'aiter' entry
    m = measure("p.py", text, "/x/p.py", frozenset({3}), {}, ran, _reads(text, {3}, ran))
    assert m.at_import == [1] and "no literal scalar" in m.why_never[1]


def _reads(text, changed, ran, plan=(), counts=None):
    return reads(text, changed, ran, properties, list(plan), counts or {})


CONSTANTS = '''\
MARGIN = 0
UNREAD = 0


class Runner:
    """Docstring."""

    slack = 0
    spare = 0

    def __init__(self):
        self.spare = 1

    def fits(self, bs, max_bs):
        return bs <= max_bs + MARGIN + self.slack + self.spare


def local(MARGIN=3):
    UNREAD = 2
    return MARGIN + UNREAD
'''


def test_a_module_constant_a_check_read_is_judged_and_one_nobody_read_is_could_not_check():
    ran = {1: {AT_IMPORT}, 2: {AT_IMPORT}, 15: {"capacity-soundness"}, 19: {"routing"}, 20: {"routing"}}
    m = measure("p.py", CONSTANTS, "/x/p.py", frozenset({1, 2}), {}, ran, _reads(CONSTANTS, {1, 2}, ran))
    assert m.judged == {1: ["capacity-soundness"]} and m.rules[1].startswith("read: MARGIN")
    # a local and a parameter of the same name are not the module's constant
    assert m.never_ran == m.at_import == [2] and "no property's check read UNREAD" in m.why_never[2]


def test_a_class_default_is_judged_by_a_read_that_reached_the_class_not_by_the_instances_value():
    plan = read_plan(CONSTANTS, {8, 9}, "/x/p.py", "p", "c0")
    assert [(p["class"], p["name"]) for p in plan] == [("Runner", "slack"), ("Runner", "spare")]
    counts = {plan[0]["id"]: {"installed": True, "by": {"capacity-soundness": [3, 0, 0], "": [1, 0, 0]}},
              plan[1]["id"]: {"installed": True, "by": {"": [1, 0, 0]}}}  # read once, outside any check
    ran = {8: {AT_IMPORT}, 9: {AT_IMPORT}, 15: {"capacity-soundness"}}
    m = measure("p.py", CONSTANTS, "/x/p.py", frozenset({8, 9}), {}, ran,
                _reads(CONSTANTS, {8, 9}, ran, plan, counts))
    assert m.judged == {8: ["capacity-soundness"]} and "class default" in m.rules[8]
    assert m.at_import == [9] and "from the class" in m.why_never[9]


def test_a_default_that_never_ran_at_import_is_never_ran_and_no_read_stands_for_a_run():
    ran = {15: {"capacity-soundness"}}  # the import was not observed: nothing shows line 1 ran
    m = measure("p.py", CONSTANTS, "/x/p.py", frozenset({1}), {}, ran, _reads(CONSTANTS, {1}, ran))
    assert m.never_ran == [1] and m.at_import == [] and "not even at import" in m.why_never[1]


def test_a_watched_class_default_counts_reads_of_the_class_value_only():
    from vmfuzz.harness.engine.core import class_reads
    import types
    mod = types.ModuleType("m")
    exec("class C:\n    x = 5\n    y = 6\n    def __init__(self):\n        self.y = 7\n", mod.__dict__)
    seen = []
    assert class_reads.watch(mod, "C", "x", lambda: seen.append("x")) == ""
    assert class_reads.watch(mod, "C", "y", lambda: seen.append("y")) == ""
    c = mod.C()
    assert (c.x, c.y, mod.C.x) == (5, 7, 5) and seen == ["x", "x"]
    c.x = 9
    assert c.x == 9 and seen == ["x", "x"]  # the instance's own value wins, unwatched
    exec("import enum\nclass E(enum.Enum):\n    A = 1\n", mod.__dict__)
    assert "not plain" in class_reads.watch(mod, "E", "A", lambda: None)


def test_a_rebound_global_and_a_compound_statement_are_not_judged_by_a_read():
    text = "FLAG = 0\nif FLAG:\n    X = 1\n\ndef f():\n    global FLAG\n    FLAG = 1\n    return FLAG + X\n"
    ran = {1: {AT_IMPORT}, 2: {AT_IMPORT}, 8: {"routing"}}
    m = measure("p.py", text, "/x/p.py", frozenset({1, 2}), {}, ran, _reads(text, {1, 2}, ran))
    assert m.judged == {} and m.at_import == [1, 2]
    assert "bound again at run time" in m.why_never[1] and "compound statement" in m.why_never[2]


# -- where the checkout and its files are ------------------------------------------

def test_a_vendored_checkout_maps_onto_the_package_and_is_found_from_the_changed_paths(tmp_path):
    path = "third_party/sglang/python/sglang/srt/layers/attention/verify_mask.py"
    assert sglang_relative(path) == "srt/layers/attention/verify_mask.py"
    assert sglang_relative("python/sglang/srt/x.py") == "srt/x.py" and sglang_relative("sglang/srt/x.py") == "srt/x.py"
    (tmp_path / "third_party/sglang/python/sglang").mkdir(parents=True)
    (tmp_path / "third_party/sglang/python/sglang/__init__.py").write_text("")
    found = vendored_checkout(Checkout(root=tmp_path), ["README.md", path])
    assert found == (tmp_path / "third_party/sglang").resolve()
    assert vendored_checkout(Checkout(root=tmp_path), ["docs/x.md"]) is None


def test_a_file_the_properties_ran_triggers_though_it_names_no_mask_code():
    rel = "kernels/ops/attention/trtllm_mha_page_table.py"
    assert rel in COVERED_BY_PROPERTIES
    [hit] = triggers([f"python/sglang/{rel}"], Checkout(), package=None)
    assert hit.why == "ran under a property (covered_files)"
    assert triggers(["python/sglang/srt/entrypoints/openai/protocol.py"], Checkout(), package=None) == []


def test_a_move_is_followed_by_content(tmp_path):
    repo = tmp_path / "r"
    (repo / "pkg").mkdir(parents=True)
    body = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(12))
    (repo / "pkg" / "old.py").write_text(body)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    (repo / "pkg" / "old.py").write_text("from pkg.new import *  # noqa: F403\n")
    (repo / "pkg" / "new.py").write_text(body.replace("return x + 5", "return x - 5"))
    lines = changed_lines(Checkout(root=repo, base=base), "pkg/new.py")
    assert lines == frozenset({22}), sorted(lines)  # only the edited line, not the whole moved file
    (repo / "pkg" / "other.py").write_text("print('new')\n")
    assert changed_lines(Checkout(root=repo, base=base), "pkg/other.py") == frozenset({1, 2})


# -- end to end, on a checkout of the installed SGLang ---------------------------------

VERIFY_MASK = "srt/layers/attention/verify_mask.py"


def checkout_with(root: Path, real: list[str], at: str = "") -> Path:
    """A git checkout (at ``root/at``) of the installed SGLang: symlinks, the ``real`` files copied."""
    from tests.sglang_copies import _mirror
    package = Path(find_spec("sglang").origin).parent
    repo = root / "checkout"
    sg = repo / at / "python" / "sglang"
    sg.parent.mkdir(parents=True)
    _mirror(package, sg, package, {Path(r): (package / r).read_text() for r in real})
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    return repo


def edit(repo: Path, rel: str, old: str, new: str, at: str = "") -> None:
    path = repo / at / "python" / "sglang" / rel
    text = path.read_text()
    assert old in text, f"{old!r} is no longer in {rel}"
    path.write_text(text.replace(old, new, 1))


def gate(repo: Path, tmp_path: Path, *props: str):
    reports = tmp_path / "reports"
    args = [a for p in props for a in ("--property", p)]
    r = vmfuzz("gate", "--target", "sglang", "--base", "HEAD", "--repo", str(repo), "--report-dir", str(reports),
               *args, timeout=900)
    out = f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert (reports / "summary.json").is_file(), out
    return r.returncode, json.loads((reports / "summary.json").read_text())["gate"], out


FITS = "return bs <= self.max_bs"


@pytest.mark.slow
def test_a_module_flag_and_a_helper_that_fits_reads_need_a_gpu(tmp_path, sglang_target):
    repo = checkout_with(tmp_path, [VERIFY_MASK])
    edit(repo, VERIFY_MASK, "\n\ndef tree_mask_numel(", "\n\n_FITS_SLACK = 0\nif torch.cuda.is_available():\n"
         "    _FITS_SLACK = 1\n\n\ndef _slack(bs):\n    if torch.cuda.is_available():\n        return _FITS_SLACK\n"
         "    return 0\n\n\ndef tree_mask_numel(")
    edit(repo, VERIFY_MASK, FITS, FITS + " + _slack(bs)")
    rc, g, out = gate(repo, tmp_path, "capacity-soundness")
    assert rc == 3, out
    [lines] = g["lines"]
    needs = {int(n) for n in lines["why_needs_device"]}
    text = (repo / "python/sglang" / VERIFY_MASK).read_text().splitlines()
    assert {text[n - 1].strip() for n in needs} == {"_FITS_SLACK = 1", "return _FITS_SLACK"}, lines
    # fits' changed test ran under the property, but on a CPU _slack is 0: it never differed from the base's
    assert any("return bs <= self.max_bs + _slack(bs)" == text[int(n) - 1].strip() for n in lines["unprovoked"]), lines
    assert g["needs_gpu"], g


@pytest.mark.slow
def test_a_new_module_that_fits_calls_is_measured_though_it_names_no_mask_code(tmp_path, sglang_target):
    new = "srt/layers/attention/capacity_slack.py"
    repo = checkout_with(tmp_path, [VERIFY_MASK])
    (repo / "python/sglang" / new).write_text(
        "import torch\n\n\ndef slack():\n    if torch.cuda.is_available():\n        return 1\n    return 0\n")
    edit(repo, VERIFY_MASK, "import torch\n", "import torch\n\nfrom sglang.srt.layers.attention.capacity_slack "
         "import slack\n")
    edit(repo, VERIFY_MASK, FITS, FITS + " + slack()")
    rc, g, out = gate(repo, tmp_path, "capacity-soundness")
    assert rc == 3, out
    assert f"python/sglang/{new}" in g["triggered"], g["triggered"]  # before: listed, never measured
    [slack] = [f for f in g["lines"] if f["path"].endswith(new)]
    assert slack["needs_device"] == [6] and "capacity-soundness" in slack["judged"]["4"], slack


@pytest.mark.slow
def test_a_moved_verify_mask_is_followed_and_its_unrun_change_is_could_not_check(tmp_path, sglang_target):
    moved = "srt/layers/attention/verify_mask_impl.py"
    repo = checkout_with(tmp_path, [VERIFY_MASK])
    sg = repo / "python/sglang"
    text = (sg / VERIFY_MASK).read_text()
    (sg / moved).write_text(text.replace('raise NotImplementedError(f"Invalid tree mask: {mode=}")',
                                         'raise NotImplementedError(f"Invalid tree mask {mode!r}")'))
    (sg / VERIFY_MASK).write_text("from sglang.srt.layers.attention.verify_mask_impl import (  # noqa: F401\n"
                                  "    VerifyMask,\n    maybe_create_verify_mask,\n    tree_mask_numel,\n)\n")
    rc, g, out = gate(repo, tmp_path, "capacity-soundness")
    assert rc == 3, out
    [impl] = [f for f in g["lines"] if f["path"].endswith(moved)]
    # only the edited line counts (the move is followed by content); before: exit 0, "outside"
    assert len(impl["changed_lines"]) == 1 and impl["never_ran"] == impl["changed_lines"], impl
    [old] = [f for f in g["lines"] if f["path"].endswith(VERIFY_MASK)]
    assert old["never_ran"] == [] and old["definitions"], old


@pytest.mark.slow
def test_a_vendored_checkout_is_the_code_under_test(tmp_path, sglang_target):
    at = "third_party/sglang"
    repo = checkout_with(tmp_path, [VERIFY_MASK], at=at)
    edit(repo, VERIFY_MASK, FITS, FITS + " + 1", at=at)
    rc, g, out = gate(repo, tmp_path, "capacity-soundness")
    # before: every path mapped to a file "deleted or moved" and the installed SGLang was tested: exit 0
    assert rc == 1, out
    assert f"from {repo / at / 'python' / 'sglang'}" in out, out
    [lines] = g["lines"]
    assert lines["traced"] and "capacity-soundness" in sum(lines["judged"].values(), []), lines


@pytest.mark.slow
def test_a_module_table_entry_for_a_backend_never_built_is_could_not_check(tmp_path, sglang_target):
    dflash = "srt/speculative/dflash_utils.py"
    repo = checkout_with(tmp_path, [dflash])
    edit(repo, dflash, '        "TritonAttnBackend",\n', '        "TritonAttnBackend",\n        "AiterAttnBackend",\n')
    rc, g, out = gate(repo, tmp_path, "routing")
    assert rc == 3, out  # before: "at import", exit 0
    [lines] = g["lines"]
    # it ran at import, and routing reads the tuple, but no lookup of it is shown to consult the new entry
    assert lines["at_import"] == lines["never_ran"] != [], lines
    assert "no literal scalar" in next(iter(lines["why_never_ran"].values())), lines


TRITON = "srt/layers/attention/triton_backend.py"


def _with_margins(tmp_path) -> Path:
    """A checkout whose triton backend sizes its verify mask with a class default and a module constant."""
    repo = checkout_with(tmp_path, [TRITON])
    edit(repo, TRITON, "    needs_cpu_seq_lens: bool = False\n",
         "    needs_cpu_seq_lens: bool = False\n    _verify_mask_margin = 0\n")
    edit(repo, TRITON, "import torch\n", "import torch\n\n_VERIFY_MASK_SLACK = 0\n")
    edit(repo, TRITON, "            max_bs=max_bs,\n            max_context_len=self.max_context_len,",
         "            max_bs=max_bs - self._verify_mask_margin + _VERIFY_MASK_SLACK,\n"
         "            max_context_len=self.max_context_len,")
    _git(repo, "commit", "-qam", "margins")
    return repo


@pytest.mark.slow
def test_a_class_default_the_allocation_reads_is_caught_when_it_shrinks_the_mask(tmp_path, sglang_target):
    repo = _with_margins(tmp_path)
    edit(repo, TRITON, "    _verify_mask_margin = 0\n", "    _verify_mask_margin = 1\n")
    rc, g, out = gate(repo, tmp_path, "allocation-soundness")
    assert rc == 1 and "allocation-soundness   FAILED" in out, out
    [lines] = g["lines"]
    # before: "never ran" (the class body ran at import, unobserved); now the read from the class judged it
    [line] = lines["changed_lines"]
    assert lines["judged"] == {str(line): ["allocation-soundness"]}, lines
    assert "read from the class" in lines["rules"][str(line)], lines


@pytest.mark.slow
def test_a_read_constant_is_judged_an_unread_default_is_could_not_check_and_typing_stays_typing(
        tmp_path, sglang_target):
    repo = _with_margins(tmp_path)
    edit(repo, TRITON, "_VERIFY_MASK_SLACK = 0\n", "_VERIFY_MASK_SLACK = False\n")  # the same margin, respelled
    edit(repo, TRITON, "    _verify_mask_margin = 0\n", "    _verify_mask_margin = 0\n    _unread_margin = 0\n")
    edit(repo, TRITON, "import torch\n", "import torch\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
         "    from sglang.srt.layers.attention.verify_mask import VerifyMask\n")
    rc, g, out = gate(repo, tmp_path, "allocation-soundness")
    assert rc == 3, out  # never 0: nobody read the new default
    [lines] = g["lines"]
    text = (repo / "python/sglang" / TRITON).read_text().splitlines()
    said = {text[int(n) - 1].strip(): rule for n, rule in lines["rules"].items()}
    assert said["_VERIFY_MASK_SLACK = False"].startswith("read: _VERIFY_MASK_SLACK"), lines
    assert [text[n - 1].strip() for n in lines["at_import"]] == ["_unread_margin = 0"], lines
    assert lines["never_ran"] == lines["at_import"], lines
    assert {text[n - 1].strip() for n in lines["definitions"]} == {
        "from typing import TYPE_CHECKING", "if TYPE_CHECKING:",
        "from sglang.srt.layers.attention.verify_mask import VerifyMask"}, lines
    assert f"line {lines['at_import'][0]} ran only at import, and no property judged it" in out, out


@pytest.mark.slow
def test_a_page_table_helper_the_readers_run_is_judged_though_it_names_no_mask_code(tmp_path, sglang_target):
    rel = "kernels/ops/attention/trtllm_mha_page_table.py"
    repo = checkout_with(tmp_path, [rel])
    edit(repo, rel, "return (num_pages + pages_per_block - 1) // pages_per_block",
         "return -(-num_pages // pages_per_block)")
    rc, g, out = gate(repo, tmp_path, "reader-agreement")
    # before: a skip in seconds (it names no mask code); now its changed line is measured: it ran under
    # reader-agreement, and the rewrite rounds up alike, so no example made it differ from the base's
    assert g["triggered"] == [f"python/sglang/{rel}"], out
    [lines] = g["lines"]
    assert lines["unprovoked"] == [36] and "evaluated" in lines["why_unprovoked"]["36"], lines
    assert rc == 3, out


@pytest.mark.slow
def test_overload_stubs_on_the_allocator_are_pure_typing(tmp_path, sglang_target):
    repo = checkout_with(tmp_path, [VERIFY_MASK])
    edit(repo, VERIFY_MASK, "from typing import Optional\n", "from typing import Literal, Optional, overload\n")
    edit(repo, VERIFY_MASK, "\n\ndef maybe_create_verify_mask(",
         "\n\n@overload\ndef maybe_create_verify_mask(*, is_draft_runner: Literal[True], **kw) -> None: ...\n"
         "@overload\ndef maybe_create_verify_mask(*, is_draft_runner: bool, **kw) -> Optional[VerifyMask]: ...\n"
         "\n\ndef maybe_create_verify_mask(")
    rc, g, out = gate(repo, tmp_path, "capacity-soundness")
    assert rc == 0, out  # before: exit 3, the stubs' "..." bodies "never ran"
    [lines] = g["lines"]
    assert lines["never_ran"] == [] and len(lines["definitions"]) == 5, lines


@pytest.mark.slow
def test_flashmla_verify_lengths_left_unwidened_is_could_not_check(tmp_path, sglang_target):
    flashmla = "srt/layers/attention/flashmla_backend.py"
    repo = checkout_with(tmp_path, [flashmla])
    edit(repo, flashmla, "                seq_lens = seq_lens + self.num_draft_tokens\n",
         "                seq_lens = seq_lens + 0 * self.num_draft_tokens\n")
    rc, g, out = gate(repo, tmp_path, "allocation-soundness")
    assert rc == 3, out  # before: the function is in no surface row, "triggered only (not driven)", exit 0
    [lines] = g["lines"]
    assert len(lines["never_ran"]) == 1 and lines["judged"] == {}, lines
    assert any("flashmla_backend.py line" in c and "never ran" in c for c in g["could_not_check"]), g


def test_a_release_sized_file_list_reaches_every_child_through_a_file(tmp_path, monkeypatch):
    """Every changed SGLang file is traced now: thousands of paths in one variable would make every
    child's exec fail (E2BIG), so a long list travels as a file."""
    from vmfuzz.harness.engine.core import line_trace
    files = [tmp_path / f"python/sglang/srt/module_{i:05d}.py" for i in range(3000)]
    monkeypatch.delenv(line_trace.DIR_ENV, raising=False)
    monkeypatch.delenv(line_trace.FILES_ENV, raising=False)
    line_trace.start(tmp_path / "rec", files)
    try:
        value = os.environ[line_trace.FILES_ENV]
        assert value.startswith("@") and len(value) < 4096
        assert line_trace._listed(value) == [str(f) for f in files]
    finally:
        line_trace.stop()
    line_trace.start(tmp_path / "rec2", files[:2])
    try:
        assert line_trace._listed(os.environ[line_trace.FILES_ENV]) == [str(f) for f in files[:2]]
    finally:
        line_trace.stop()


def test_a_checker_starts_its_record_without_reading_its_stack_and_still_records(tmp_path):
    """coverage.py's collector keeps a text of the stack that started it, for its debug output only;
    built from ``inspect.stack()``, it was 3.8 s of a gate's CPU. The record is started without it, the
    library's function is put back, and the lines a check ran are still recorded under its property."""
    module = tmp_path / "under_review.py"
    module.write_text("def fits(bs, capacity):\n    footprint = bs * 4\n    return footprint <= capacity\n")
    script = tmp_path / "child.py"
    script.write_text(f"""
import inspect, os, sys
sys.path.insert(0, {str(tmp_path)!r})
from vmfuzz.harness.engine.core import line_trace
import coverage.debug, coverage.collector
from pathlib import Path
line_trace.start(Path({str(tmp_path / "rec")!r}), [{str(module)!r}])
stack_reads = []
real_stack = inspect.stack
inspect.stack = lambda *a, **k: (stack_reads.append(1), real_stack(*a, **k))[1]
import under_review
def deep(n):
    if n:
        return deep(n - 1)
    with line_trace.judging("capacity-soundness"):
        return under_review.fits(3, 16)
assert deep(40) is True
line_trace.stop()
assert stack_reads == [], "the recorder read the stack"
assert coverage.collector.short_stack is coverage.debug.short_stack
""")
    from vmfuzz.harness.engine.core import line_trace
    env = {k: v for k, v in os.environ.items() if k not in (line_trace.DIR_ENV, line_trace.FILES_ENV)}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = line_trace.merged(tmp_path / "rec")[os.path.realpath(module)]
    assert lines[2] == {"capacity-soundness"} and lines[3] == {"capacity-soundness"}, lines


def test_the_import_is_observed_only_in_the_traced_files_bodies_and_a_fork_records_its_own(tmp_path):
    """A traced module's top level and class body are recorded while it is imported, under the import's
    contexts (never a property's); an untraced module it imports runs untraced; a module another finder hands
    over first (the provoked rule's) is watched too; a fork that imports a traced module records it itself."""
    (tmp_path / "helper.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "under_review.py").write_text(
        "import helper\n\nMARGIN = helper.double(1)\n\n\nclass Runner:\n    slack = 0\n\n    def fits(self):\n"
        "        return self.slack\n")
    (tmp_path / "late.py").write_text("LATE = 1\n")
    (tmp_path / "forked.py").write_text("FORKED = 1\n")
    script = tmp_path / "child.py"
    script.write_text(f"""
import importlib.machinery, os, sys
sys.path.insert(0, {str(tmp_path)!r})
from pathlib import Path
from vmfuzz.harness.engine.core import import_trace, line_trace
traced = [os.path.join({str(tmp_path)!r}, n) for n in ("under_review.py", "late.py", "forked.py")]
line_trace.observe_imports(Path({str(tmp_path / "rec")!r}), traced)

class Ahead:  # a finder ahead of the watch's, as the provoked rule's is for a module not yet loaded
    def find_spec(self, name, path=None, target=None):
        if name != "late":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        import_trace.watched(spec)
        return spec
import under_review
sys.meta_path.insert(0, Ahead())
with line_trace.imports_for_checks():
    import late
pid = os.fork()
if pid == 0:
    import forked
    line_trace.flush()
    os._exit(0)
os.waitpid(pid, 0)
line_trace.flush()
""")
    from vmfuzz.harness.engine.core import line_trace
    env = {k: v for k, v in os.environ.items() if k not in (line_trace.DIR_ENV, line_trace.FILES_ENV)}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    ran = line_trace.merged(tmp_path / "rec")
    review = ran[os.path.realpath(tmp_path / "under_review.py")]
    assert {n: review.get(n) for n in (1, 3, 6, 7, 10)} == {
        1: {AT_IMPORT}, 3: {AT_IMPORT}, 6: {AT_IMPORT}, 7: {AT_IMPORT}, 10: None}, review
    assert os.path.realpath(tmp_path / "helper.py") not in ran  # not listed: never recorded
    assert ran[os.path.realpath(tmp_path / "late.py")] == {1: {line_trace.FOR_CHECKS}}
    assert ran[os.path.realpath(tmp_path / "forked.py")] == {1: {AT_IMPORT}}
