"""Judged means provoked: a changed condition that ran is judged only when an example told it from the base's.

The plan (``campaign.provoked``) finds the changed expressions of a function from
the base's and the head's text; the probes (``core.provoke``) evaluate the base's
expression beside the head's in the very frame, here and in forked workers; the
verdict moves a line no example provoked to could-not-check, names the
expression and what would provoke it, and says which rule judged every other line.
Each planted change below ran on every example and changed nothing the examples
could see, which the older "reached" rule called judged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from vmfuzz.harness.engine.campaign.diff_coverage import measure
from vmfuzz.harness.engine.campaign.provoked import plan
from vmfuzz.harness.engine.campaign.provoked_verdict import judge, provoker

ROOT = Path(__file__).resolve().parent.parent

BASE = '''\
def chain_ready(seq_lens, topk, steps, tokens):
    if (
        seq_lens.is_cuda
        and topk == 1
        and tokens == steps + 1
    ):
        return "chain"
    return "tree"


class VerifyArgs:
    def __init__(self, mask):
        self.mask = mask

    def padded(self, needed):
        if len(self.mask) < needed:
            self.mask = self.mask + [True] * (needed - len(self.mask))
        return len(self.mask)


def positions_from_layout(mm_inputs):
    if all(mm is None for mm in mm_inputs):
        return "layout"
    return "per request"


def reuse(buf, mode):
    if buf is not None or mode == "qlen":
        return 0
    return 1


def fallback(buf, mode):
    if not (buf is None) and mode == "full":
        return 1
    return 0


def capacity(bs, log):
    if log.pop() > bs:
        return 4
    return bs


def mask_for(mask, needed):
    out = mask
    if len(out) < needed:
        out = out + [True] * (needed - len(out))
    return out


def draft_fast(on_device, topk, mode):
    if on_device and topk == 1 and mode == "qlen":
        return "fast"
    return "general"
'''

HEAD = '''\
def chain_ready(seq_lens, topk, steps, tokens):
    if (
        seq_lens.is_cuda
        and topk == 1
    ):
        return "chain"
    return "tree"


class VerifyArgs:
    def __init__(self, mask):
        self.mask = mask

    def padded(self, needed):
        self.mask = self.mask + [True] * (needed - len(self.mask))
        return len(self.mask)


def positions_from_layout(mm_inputs):
    if any(mm is None for mm in mm_inputs):
        return "layout"
    return "per request"


def reuse(buf, mode):
    if mode == "qlen" or buf is not None:
        return 0
    return 1


def fallback(buf, mode):
    if buf is not None and mode == "full":
        return 1
    return 0


def capacity(bs, log):
    if log.pop() >= bs:
        return 4
    return bs


def mask_for(mask, needed):
    out = mask
    return out


def draft_fast(on_device, topk, mode):
    if on_device and topk < 1 and mode == "qlen":
        return "fast"
    return "general"
'''

#: an operand changed behind a short-circuit: when reached it differs from the base's, the test never does
FAST = HEAD.splitlines().index('    if on_device and topk < 1 and mode == "qlen":') + 1
#: The head's changed lines, as ``git diff -U0`` gives them.
CHANGED = frozenset({4, 5, 15, 20, 26, 32, 38, 44, 45, FAST})


def by_function(probes):
    return {p.function: p for p in probes}


def test_the_plan_finds_each_changed_condition_a_deleted_operand_and_guard_and_skips_an_exact_rewrite():
    probes = by_function(plan(BASE, HEAD, CHANGED))
    chain = probes["chain_ready"]
    assert chain.kind == "test" and chain.lines == [2] and "tokens == steps + 1" in chain.base, chain
    guard = probes["VerifyArgs.padded"]
    assert guard.kind == "guard" and guard.base == "len(self.mask) < needed" and guard.lines == [15], guard
    assert guard.patch == "VerifyArgs.padded"
    mm = probes["positions_from_layout"]
    assert mm.head.startswith("any(") and mm.base.startswith("all(") and not mm.unsafe
    assert probes["reuse"].kind == "test"  # operands swapped: one condition, set beside the base's
    fast = probes["draft_fast"]  # a changed operand is judged by the whole test's truth, which the code uses
    assert (fast.kind, fast.base, fast.head) == ("test", "on_device and topk == 1 and (mode == 'qlen')",
                                                 "on_device and topk < 1 and (mode == 'qlen')"), fast
    assert "fallback" not in probes  # `not (a is None)` is `a is not None` exactly: no change to provoke
    assert "log.pop" in probes["capacity"].unsafe  # the base's expression has effects: never evaluated twice
    block = probes["mask_for"]  # deleted with its body: the head's "test" is False where the base's held
    assert block.kind == "guard" and block.head.startswith("False") and block.lines == [44, 45], block
    assert provoker(mm) == "a batch mixing requests with and without multimodal inputs"
    assert provoker(chain) == "CUDA `seq_lens` (a GPU run)"
    assert provoker(guard) == "an example on which `len(self.mask) < needed` is false"  # the body must not run
    assert provoker(block) == "an example on which `len(out) < needed` is true"  # the deleted block must


DRIVE = '''
import json, os, sys
from pathlib import Path
from vmfuzz.harness.engine.campaign.provoked import plan
from vmfuzz.harness.engine.core import line_trace, provoke
here = Path(sys.argv[1])
sys.path.insert(0, str(here))
probes = plan((here / "base.py").read_text(), (here / "mod.py").read_text(), frozenset(json.loads(sys.argv[2])))
line_trace.start(here / "rec", [here / "mod.py"])
provoke.start(here / "rec", [p.as_plan(str((here / "mod.py").resolve()), "mod") for p in probes if not p.unsafe])
import mod


class CpuLens:
    is_cuda = False


def examples():
    assert mod.chain_ready(CpuLens(), 1, 3, 4) == "tree"
    assert mod.VerifyArgs([True]).padded(3) == 3
    assert mod.positions_from_layout([None, None]) == "layout"
    assert mod.reuse(None, "full") == 1 and mod.reuse([], "qlen") == 0
    assert mod.fallback([], "full") == 1
    assert mod.capacity(2, [1]) == 2
    assert mod.mask_for([True, True], 2) == [True, True]
    assert mod.draft_fast(True, 1, "full") == "general"  # reaches `topk < 1`, which is not `topk == 1`
    if len(sys.argv) > 3:  # the inputs that tell each change from the base
        assert mod.VerifyArgs([True] * 5).padded(3) == 5
        assert mod.positions_from_layout([None, object()]) == "layout"
        assert mod.mask_for([True], 3) == [True]
        assert mod.draft_fast(True, 1, "qlen") == "general"  # the base's test held here: the branch differs


with line_trace.judging("no-oob-write"):
    examples()
if os.fork() == 0:  # a forked worker's evaluations count too
    with line_trace.judging("capacity-soundness"):
        examples()
    line_trace.flush()
    os._exit(0)
os.wait()
line_trace.stop()
provoke.stop()
ran = {n: sorted(c) for f, lines in line_trace.merged(here / "rec").items() for n, c in lines.items()}
print(json.dumps({"ran": ran, "counts": provoke.merged(here / "rec"),
                  "probes": [p.__dict__ for p in probes]}))
'''


def drive(tmp_path, provoke_them: bool):
    (tmp_path / "base.py").write_text(BASE)
    (tmp_path / "mod.py").write_text(HEAD)
    (tmp_path / "drive.py").write_text(DRIVE)
    args = [sys.executable, str(tmp_path / "drive.py"), str(tmp_path), json.dumps(sorted(CHANGED))]
    r = subprocess.run(args + (["provoke"] if provoke_them else []), capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    from vmfuzz.harness.engine.campaign.provoked import Probe
    probes = [Probe(**p) for p in out["probes"]]
    ran = {int(n): set(c) for n, c in out["ran"].items()}
    functions = {"chain_ready": "p", "VerifyArgs.padded": "p", "positions_from_layout": "p", "reuse": "p",
                 "fallback": "p", "capacity": "p", "mask_for": "p", "draft_fast": "p"}
    measured = measure("mod.py", HEAD, str(tmp_path / "mod.py"), CHANGED, functions, ran)
    judge(measured, probes, out["counts"])
    return measured, out["counts"], probes


def test_changes_no_example_told_from_the_base_ran_but_are_not_judged(tmp_path):
    measured, counts, probes = drive(tmp_path, provoke_them=False)
    # chain (the CPU short-circuits first), padding guard, all->any, swapped operands: all ran, none provoked
    assert measured.unprovoked == [2, 15, 20, 26, 44, 45, FAST], measured.as_dict()
    assert not measured.exercised
    why = measured.why_unprovoked
    assert "its operand `topk == 1` made `topk < 1`" in why[FAST] and "equal to the base's each time" in why[FAST]
    assert "CUDA `seq_lens`" in why[2] and "its operand `tokens == steps + 1` deleted" in why[2], why
    assert "len(self.mask) < needed" in why[15] and "equal to the base's each time" in why[15], why
    assert "mixing requests with and without multimodal inputs" in why[20], why
    # the exact rewrite and the effectful base are judged by the older rule, and the summary says so
    assert measured.rules[32].startswith("reached, and its outputs compared by a property"), measured.rules
    assert "log.pop" in measured.rules[38], measured.rules
    guard = next(p for p in probes if p.kind == "guard")
    by = counts[guard.ident]["by"]
    assert set(by) == {"no-oob-write", "capacity-soundness"} and all(c[0] == 1 for c in by.values()), by


def test_an_example_that_tells_a_change_from_the_base_makes_it_judged(tmp_path):
    measured, counts, _ = drive(tmp_path, provoke_them=True)
    assert measured.unprovoked == [2, 26], measured.as_dict()  # still no CUDA lens, still no reuse split
    assert measured.rules[44].startswith("provoked:") and "`if len(out) < needed:` with the block it guarded deleted" in measured.rules[44]
    assert measured.rules[15].startswith("provoked:") and "capacity-soundness" in measured.rules[15]
    assert measured.rules[20].startswith("provoked:"), measured.rules
    assert 15 in measured.judged and 20 in measured.judged
    assert measured.rules[FAST].startswith("provoked:") and "differed on 2 of 4" in measured.rules[FAST], measured.rules


def test_a_probe_hands_the_head_its_own_value_and_counts_a_base_that_raises_apart(tmp_path, monkeypatch):
    import torch
    from vmfuzz.harness.engine.core import provoke
    monkeypatch.setattr(provoke, "_counts", {})
    monkeypatch.setattr(provoke, "_pid", os.getpid())
    monkeypatch.setattr(provoke, "_kinds", {"t": "value", "g": "guard"})
    monkeypatch.setattr(provoke, "current", "packed-mask")
    head = torch.tensor([1, 2])
    assert provoke.probe("t", head, lambda: torch.tensor([1, 2])) is head
    assert provoke.probe("t", head, lambda: torch.tensor([1, 3])) is head
    assert provoke.probe("t", head, lambda: head[5]) is head  # the base's own error is never the head's
    assert provoke.probe("g", True, lambda: torch.tensor(True)) is True  # a test compares truth, not type
    provoke.save(str(tmp_path))
    counts = provoke.merged(tmp_path)
    assert counts["t"]["by"] == {"packed-mask": [3, 1, 1]}, counts
    assert counts["g"]["by"] == {"packed-mask": [1, 0, 0]}, counts
    assert counts["t"]["sample"].startswith("head gave a tensor of shape (2,)"), counts
