"""The ``sglang`` target: SGLang's real code under the properties.

Skipped, with the reason, where SGLang cannot be imported; with
``VMFUZZ_REQUIRE_SGLANG=1`` (CI) an unavailable SGLang fails instead.

The altered-copy tests build a copy of the installed ``sglang`` package in
tmp_path with one function's text edited -- the package tree is mirrored by
symlinks, and only the directories down to the edited file are real -- and run
the gate's properties in a subprocess whose PYTHONPATH puts the copy first.
"""

from __future__ import annotations

import json
import os
import sys
import subprocess
from pathlib import Path

import pytest
import torch

from vmfuzz.harness.engine.search.search import run_campaign, run_property
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES
from vmfuzz.harness.targets import CATALOGUE, resolve
from tests import zygote
from tests.helpers import sglang_or_skip
from tests.sglang_copies import altered_copy, assert_caught_by, run_on_copy

ROOT = Path(__file__).resolve().parent.parent



def _seams(target):
    sg = target.sglang
    return (sg.VerifyMask.__dict__.get("fits"), sg.wrapper_owner.__dict__.get("build_tree_kernel_efficient"),
            sg.eagle_utils.__dict__.get(sg.entry, "<absent>"), sg.verify_mask.__dict__.get("tree_mask_numel"))


# -- the target on the installed SGLang ------------------------------------------

@pytest.mark.slow
def test_properties_hold_on_sglang(sglang_target, tmp_path):
    results = run_campaign(sglang_target, seed=7, max_examples=5, bounds=sglang_target.bounds,
                           findings_dir=tmp_path)
    found = [f"{r.prop}: {r.finding.detail}" for r in results if r.finding]
    assert not found, found
    reached = set().union(*(r.classes for r in results))
    assert {"path reuse", "path fallback", "layout FULL_MASK"} <= reached


def test_pr33127_reproduces_minimal_full_mask_repro(sglang_target, tmp_path):
    from vmfuzz.harness.cli import main

    rc = main(["run", "--target", "sglang+pr33127", "--seed", "1", "--property", "no-oob-write",
               "--report-dir", str(tmp_path)])
    assert rc == 1
    repro = json.loads((tmp_path / "findings" / "no-oob-write.json").read_text())
    assert repro["target"] == "sglang+pr33127"
    # the overrun itself, seen by the redzone: not a raise of the target
    assert (repro["origin"]["property"], repro["origin"]["effect"]) == ("no-oob-write", "overrun"), repro["origin"]
    assert repro["config"]["mode"] == "FULL_MASK"
    assert repro["config"]["max_bs"] == 1
    assert [len(b["seq_lens"]) for b in repro["batches"]] == [2]
    # Replaying on the fixed SGLang holds: the finding is the variant's, not SGLang's.
    assert main(["replay", str(tmp_path / "findings" / "no-oob-write.json"), "--target", "sglang"]) == 0


#: Arithmetic-only checks first: a variant they catch costs no kernel launch.
CHEAPEST_FIRST = ("capacity-soundness", "capacity-liveness", "allocation-soundness", "trivial-path",
                  "no-oob-write", "fallback-equivalence", "reference-agreement", "multi-step-reuse", "routing",
                  "reader-agreement", "packed-mask", "chain-writer")


#: The property built for a bug in each of these seams: a variant there must be caught by it, which is
#: also cheaper than running every kernel-launching property ahead of it.
MEANT_FOR_SEAM = {"route": "routing", "read_eager": "reader-agreement", "read_replay": "reader-agreement",
                  "pack_mask": "packed-mask", "allocation_call": "allocation-soundness"}


@pytest.mark.parametrize("variant", sorted(CATALOGUE))
@pytest.mark.slow
def test_every_variant_is_caught_over_sglang(sglang_target, variant, tmp_path):
    target = resolve(f"sglang+{variant}")
    meant = MEANT_FOR_SEAM.get(CATALOGUE[variant].seam)
    if meant:
        res = run_property(target, PROPERTIES[meant], seed=3, max_examples=6, bounds=sglang_target.bounds,
                           findings_dir=tmp_path)
        assert res.finding, f"{meant} did not catch sglang+{variant}"
        assert res.finding.origin.property == meant, res.finding.origin
        assert res.finding.origin.effect not in ("raise", "crash", "hang"), res.finding.origin
        return
    for name in CHEAPEST_FIRST:
        res = run_property(target, PROPERTIES[name], seed=3, max_examples=6, bounds=sglang_target.bounds,
                           findings_dir=tmp_path)
        if res.finding:
            return
    pytest.fail(f"no property caught sglang+{variant}")


def test_sglang_modules_are_left_as_found(sglang_target):
    before = _seams(sglang_target)
    cfg = Config(TreeMaskMode.FULL_MASK, 2, 8, 4, 2, 2)
    PROPERTIES["no-oob-write"].check(sglang_target, cfg, [Batch((3, 5, 8))])
    assert _seams(sglang_target) == before

    broken = resolve("sglang")
    def kernel_raises(call):
        raise RuntimeError("kernel died")
    broken.kernel = kernel_raises
    with pytest.raises(RuntimeError, match="kernel died"):
        PROPERTIES["no-oob-write"].check(broken, cfg, [Batch((3, 5))])
    assert _seams(sglang_target) == before


def test_reuse_decision_is_the_call_sites(sglang_target):
    """``reused`` reports what SGLang's call site chose, not a re-derivation."""
    from vmfuzz.harness.guard.shadow import ShadowHeap

    cfg = Config(TreeMaskMode.FULL_MASK, 2, 8, 4, 2, 2)
    for seq_lens, want in (((1, 2), True), ((1, 2, 3), False)):
        heap = ShadowHeap("cpu")
        mask = sglang_target.allocate(cfg, heap)
        assert type(mask).__module__.startswith("sglang.")
        assert sglang_target.verify(mask, cfg, Batch(seq_lens), heap).reused is want
    trivial = Config(TreeMaskMode.QLEN_ONLY, 1, 4, 1, 1, 0)
    heap = ShadowHeap("cpu")
    mask = sglang_target.allocate(trivial, heap)
    assert sglang_target.verify(mask, trivial, Batch((2,)), heap).reused
    assert not sglang_target.verify(mask, trivial, Batch((2, 3)), heap).reused


# -- unavailable SGLang ----------------------------------------------------------

def test_unavailable_sglang_exits_2_with_one_line(tmp_path):
    broken = tmp_path / "sglang"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('this sglang is broken on purpose')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    proc = zygote.run([sys.executable, "-m", "vmfuzz.harness.cli", "run", "--target", "sglang", "--seed", "1"],
                      env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    # the hint names the command an installed wheel ships, not a repository script
    assert "broken on purpose" in lines[0] and "vmfuzz install-sglang" in lines[0]


def test_triton_imported_before_the_interpreter_switch_is_one_line_exit_2(tmp_path):
    """Triton's own library, decorated without the interpreter, would make SGLang's first kernel
    launch raise mid-run: the target says so up front instead."""
    sglang_or_skip()
    if torch.cuda.is_available():
        pytest.skip("a CUDA device runs the kernels compiled")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    program = "import sys, triton; from vmfuzz.harness.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", program, "run", "--target", "sglang", "--seed", "1",
                           "--max-examples", "1"], env=env, cwd=tmp_path, timeout=300, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "TRITON_INTERPRET=1" in lines[0] and "triton was imported" in lines[0], proc.stderr


# -- altered copies of the installed SGLang --------------------------------------

#: name -> edits, each (file candidates under the package, pattern, replacement).
#: Each alteration is a bug a reviewer could plausibly miss; none is a harness variant.
ALTERATIONS = {
    "fits-admits-one-more": [(["srt/layers/attention/verify_mask.py"],
                              r"(def fits\(self[^)]*\)[^:]*:(?:.|\n)*?return bs <= self\.max_bs)", r"\1 + 1")],
    "fallback-short-by-a-row": [(["srt/speculative/eagle_utils.py"],
                                 r"seq_lens_sum \* num_verify_tokens\n", "seq_lens_sum * (num_verify_tokens - 1)\n")],
    "kernel-row-stride": [(["kernels/ops/speculative/spec_tree.py", "srt/speculative/eagle_utils.py"],
                           r"\(seq_len \+ draft_token_num\) \* draft_tokenx",
                           "(seq_len + draft_token_num + 1) * draft_tokenx")],
    "call-site-fits-one-more": [(["srt/speculative/eagle_worker_common.py"],
                                 r"verify_mask\.fits\(bs", "verify_mask.fits(bs - 1")],
    # The API shape before PR #33127, with its policy: the struct keeps
    # max_context_len instead of max_bs and fits(bs, num_draft_tokens) checks
    # only QLEN_ONLY. The adapter must load this shape, and the properties must
    # find the regression in it with no variant layered on.
    "pre-fix-api-shape": [
        (["srt/layers/attention/verify_mask.py"], r"\n    max_bs: int\n", "\n    max_context_len: int\n"),
        (["srt/layers/attention/verify_mask.py"], r"\n        max_bs=max_bs,\n",
         "\n        max_context_len=max_context_len,\n"),
        (["srt/layers/attention/verify_mask.py"],
         r"def fits\(self, bs: int\) -> bool:(?:.|\n)*?return bs <= self\.max_bs\n",
         "def fits(self, bs: int, num_draft_tokens: int) -> bool:\n"
         "        if self.mode != TreeMaskMode.QLEN_ONLY:\n"
         "            return True\n"
         "        need = tree_mask_numel(self.mode, bs, num_draft_tokens, self.max_context_len)\n"
         "        return need <= self.buffer.numel()\n"),
        (["srt/speculative/eagle_worker_common.py"], r"verify_mask\.fits\(bs\)",
         "verify_mask.fits(bs, num_draft_tokens)"),
        (["srt/speculative/eagle_worker_v2.py"], r"verify_mask\.fits\(bs\)", "verify_mask.fits(bs, 1)"),
    ],
    # Not a bug: the wrapper's kernel call as SGLang 0.5.17-0.5.22 spell it, a
    # module global in eagle_utils that only a CUDA host defines. The adapter
    # must find this entry, and the properties must hold.
    "older-kernel-entry": [
        (["srt/speculative/eagle_utils.py"], r"\n    build_tree_kernel_efficient_func,\n", "\n"),
        (["srt/speculative/eagle_utils.py"], r"\n    build_tree_kernel_efficient_func\(\n",
         "\n    sgl_build_tree_kernel_efficient(\n"),
    ],
}
#: Alterations that keep SGLang correct: the properties must hold on them.
SOUND = {"older-kernel-entry"}

#: The properties meant to catch each bug (a raise never counts).
CAUGHT_BY = {
    "fits-admits-one-more": ("capacity-soundness", "no-oob-write", "reference-agreement"),
    "fallback-short-by-a-row": ("no-oob-write", "reference-agreement"),
    "kernel-row-stride": ("no-oob-write", "reference-agreement"),
    "call-site-fits-one-more": ("no-oob-write", "reference-agreement"),
    "pre-fix-api-shape": ("capacity-soundness", "no-oob-write", "reference-agreement"),
}


#: Each altered copy costs a fresh SGLang import (~30 s) and the Triton
#: interpreter is slow, so the copies run the capacity arithmetic, the write
#: guard and the oracle comparison rather than the whole gate.
ALTERED_COPY_PROPERTIES = ("--property", "capacity-soundness", "--property", "no-oob-write",
                           "--property", "reference-agreement")



@pytest.mark.parametrize("alteration", [None, *ALTERATIONS], ids=lambda a: a or "unaltered")
@pytest.mark.slow
def test_altered_sglang_copy_is_caught(sglang_target, alteration, tmp_path):
    site = altered_copy(tmp_path, ALTERATIONS[alteration] if alteration else [], alteration)
    proc, out = run_on_copy(site, tmp_path, "run", "--target", "sglang", "--seed", "1", "--max-examples", "25",
                            *ALTERED_COPY_PROPERTIES,
                            "--report-dir", str(tmp_path / "report"))
    if alteration is None or alteration in SOUND:
        assert proc.returncode == 0, out
    else:
        assert proc.returncode == 1, out
        assert "FAILED" in proc.stdout
        assert_caught_by(tmp_path / "report", *CAUGHT_BY[alteration], out=out)
