"""Server state (reader-agreement through one backend) and nested routers (routing), proved on
altered copies of the installed SGLang: each bug shows only where the new runs reach.

- ``eager-indptr-accumulates``: the eager target-verify path adds the batch's
  offsets to what ``mask_indptr`` already holds instead of setting them. A
  backend built per batch starts zeroed, so only a backend that served an
  earlier batch (or captured its graphs) reads shifted windows.
- ``tbo-mask-from-overlap-child-when-nested``: TBO hands out its first overlap
  child's mask, but only when its primary is itself a router (has a
  ``_select_backend``): TBO over plain backends is right, TBO over hybrids not.
"""

from __future__ import annotations

import json

import pytest

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.routing import NESTINGS, leaves, nested_children, nested_verify_leaf, Child
from vmfuzz.harness.properties import PROPERTIES
from vmfuzz.harness.targets import resolve
from tests.sglang_copies import altered_copy, assert_caught_by, run_on_copy

_TRITON = ["srt/layers/attention/triton_backend.py"]
_TBO = ["srt/layers/attention/tbo_backend.py"]
ALTERATIONS = {
    "eager-indptr-accumulates": ("reader-agreement", [(
        _TRITON, r"mask_indptr\[1 : bs \+ 1\] = torch\.cumsum\(seq_mask_len\[:bs\], dim=0\)",
        "mask_indptr[1 : bs + 1] += torch.cumsum(seq_mask_len[:bs], dim=0)")]),
    "tbo-mask-from-overlap-child-when-nested": ("routing", [(
        _TBO, r"return self\.primary\.verify_mask",
        "return (self.children[0] if hasattr(self.primary, '_select_backend') else self.primary).verify_mask")]),
}


def test_nested_leaves_are_distinct_and_the_verify_leaf_is_one_of_them():
    for outer, inner in NESTINGS:
        children = nested_children(outer, inner, lambda role, slot: Child(role, slot, None))
        every = leaves(children)
        assert len({c.verify_mask for c in every.values()}) == len(every), (outer, inner)
        for mode in ("prefill", "decode"):
            assert nested_verify_leaf(outer, inner, mode) in every
    assert nested_verify_leaf("tbo", "hybrid", "decode") == "primary/decode"


def test_reference_drives_server_state_and_nested_routers():
    target = resolve("reference")
    config = Config(TreeMaskMode.FULL_MASK, 2, 8, 4, 2, 2)
    obs = PROPERTIES["reader-agreement"].check(target, config, [Batch((3,)), Batch((8, 0, 5)), Batch((0, 8))])
    assert {"server state: eager after an earlier batch", "server state: cuda-graph replay after an earlier batch"} \
        <= obs.classes
    obs = PROPERTIES["routing"].check(target, config, [Batch((8, 1))])
    assert "tbo router over hybrid routers (decode) -> primary/decode" in obs.classes
    assert "hybrid router over hybrid routers: dflash policy -> decode/decode" in obs.classes


def test_reader_agreement_takes_several_batches():
    assert PROPERTIES["reader-agreement"].steps


@pytest.mark.parametrize("alteration", [None, *ALTERATIONS])
@pytest.mark.slow
def test_gate_catches_server_state_and_nesting_bugs(sglang_target, tmp_path, alteration, monkeypatch):
    prop, edits = ALTERATIONS[alteration] if alteration else (None, [])
    site = altered_copy(tmp_path, edits, alteration)
    # The gate as a PR that edits the file would trigger it. The property is named too: on a loaded
    # machine the gate's time budget can run out before it (then it says "skipped"), and this test is
    # about what the property catches, not about the budget.
    changed = tmp_path / "changed.txt"
    files = [f for files, _, _ in edits for f in files] if edits else _TRITON + _TBO
    changed.write_text("".join(f"python/sglang/{f}\n" for f in files))
    # The pristine copy names every property that drives the two files: with a changed-files list (no
    # diff) each mask-path function of theirs must run, allocation-soundness's init_cuda_graph_state too.
    # the Triton draft backend's methods too: a draft graph property, judging every case's draft runner
    props = [a for p in ([prop] if prop else ["reader-agreement", "routing", "allocation-soundness",
                                              "graph-replay-equivalence"])
             for a in ("--property", p)]
    monkeypatch.setenv("VMFUZZ_DRAFT_SHARE", "1")
    proc, out = run_on_copy(site, tmp_path, "gate", "--target", "sglang", "--changed-files", str(changed), *props,
                            "--db", str(tmp_path / "db"), "--report-dir", str(tmp_path / "report"), timeout=400)
    if alteration is None:
        assert proc.returncode == 0, out
        summary = json.loads((tmp_path / "report" / "summary.json").read_text())
        assert not summary.get("findings"), out
        return
    assert proc.returncode == 1, out
    assert_caught_by(tmp_path / "report", prop, out=out)
    detail = " ".join(f["detail"] for f in json.loads((tmp_path / "report" / "summary.json").read_text())["findings"])
    want = "server state" if prop == "reader-agreement" else "router over"
    assert want in detail, detail
