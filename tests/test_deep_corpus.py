"""The deep boundary corpus: production shapes, sized from the code under test, run before the search.

The deep classes (d past a packed word, bs*d past the lanes, depth 4, max_bs past
a byte, a row past the pack block and 255 bytes, a long row before a short one)
are asserted on the cases themselves, for the model's constants and for other
widths (the sizes follow the constants, not a list). On altered copies of the
installed SGLang the gate (narrowed to packed-mask, whose deep cases run before
its search) catches a last-not-longest sizing bug and a long-row packing bug
through packed-mask, neither of which its search reached before; the pristine
copy's whole gate passes and its summary lists the deep cases it ran.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vmfuzz.harness.engine.search.deep_corpus import deep_cases
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.model.shapes import BITS_PER_BYTE, ShapeConstants, model_constants
from vmfuzz.harness.model.oracle import tree_facts
from vmfuzz.harness.properties import PROPERTIES, shared_group
from tests.sglang_copies import altered_copy, assert_caught_by, run_on_copy

FLASHINFER = "srt/layers/attention/flashinfer_backend.py"
PACK = "kernels/ops/speculative/pack_verify_mask.py"

#: name -> (edits, the property meant to catch it)
ALTERATIONS = {
    # The pack grid sized by the last request's KV length instead of the longest: a long row
    # before a short one keeps only the bytes the short row needs programs for.
    "pack-grid-from-last-row": ([([FLASHINFER], r"max_kv_len=int\(seq_lens_cpu_i32\.max\(\)\)",
                                  "max_kv_len=int(seq_lens_cpu_i32[-1])")], "packed-mask"),
    # The packing block halved (for occupancy) while the grid still counts 256-byte programs:
    # every packed row longer than 1024 bits loses the tail of each block.
    "pack-block-halved": ([([PACK], r"BLOCK=256,", "BLOCK=128,")], "packed-mask"),
}


def _core():
    return shared_group(["no-oob-write", "fallback-equivalence", "reference-agreement", "capacity-soundness",
                         "capacity-liveness", "multi-step-reuse"])


@pytest.mark.parametrize("k", [model_constants(),
                               ShapeConstants((16, 32), pack_block_bytes=512, lanes=256, source="wider"),
                               ShapeConstants((8, 16), pack_block_bytes=128, lanes=64, source="narrower")],
                         ids=lambda k: k.source.split(":")[0][:12])
def test_the_corpus_reaches_every_deep_class(k):
    cases = deep_cases(_core(), Bounds(), k)
    configs = [c for _, c, _ in cases]
    batches = [b for _, _, steps in cases for b in steps]
    ds = {c.d for c in configs}
    assert k.packed_widths[0] + 1 in ds and k.packed_widths[1] + 1 in ds, ds  # d just past 8 and 16
    assert any(b.bs * c.d > k.lanes for _, c, steps in cases for b in steps)
    assert any(c.spec_steps >= 4 and b.trees is not None for _, c, steps in cases for b in steps)
    assert any(c.max_bs >= 9 and any(b.bs == c.max_bs for b in steps) for _, c, steps in cases)
    rows = [(c.d * (s + c.d), b) for _, c, steps in cases for b in steps for s in b.seq_lens]
    assert max(r for r, _ in rows) > max(1024, k.pack_block_bits) or k.pack_block_bits < 1024
    assert any(sum(-(-c.d * (s + c.d) // BITS_PER_BYTE) for s in b.seq_lens) > 255
               for _, c, steps in cases for b in steps)
    assert any(b.seq_lens[0] > b.seq_lens[-1] for b in batches)  # a long row before a short one
    # the sizes follow the constants: the long row is just past the block, whatever its size
    longest = max(r for r, _ in rows)
    assert k.long_row_bits < longest <= k.long_row_bits + 2 * max(ds)
    assert k.long_row_bits >= k.pack_block_bits


def test_nodes_reach_depth_four():
    """spec_steps >= 4 with a node at depth >= 4: the deepest tree's chain is selected first."""
    for _, config, steps in deep_cases(PROPERTIES["packed-mask"], Bounds(), model_constants()):
        _, depth, _, _ = tree_facts(steps[0].trees[0], config.topk, config.d)  # the oracle's own walk
        assert config.spec_steps >= 4 and max(depth) >= 4, (config, depth)


@pytest.mark.parametrize("name", list(PROPERTIES))
def test_every_property_gets_deep_cases_it_takes(name):
    prop = PROPERTIES[name]
    cases = deep_cases(prop, Bounds(), model_constants())
    assert cases, name
    for _, config, steps in cases:
        assert prop.applies(config)
        config.validate()
        for b in steps:
            b.validate(config)


@pytest.mark.slow
def test_sglang_sizes_come_from_its_source(sglang_target):
    k = sglang_target.shape_constants()
    assert k.pack_block_bytes == 256 and k.packed_widths[:2] == (8, 16), k
    assert "BLOCK= in" in k.source and "packed_dtypes in" in k.source, k.source


def _gate(tmp_path, site, *args: str):
    report = tmp_path / "report"
    proc, out = run_on_copy(site, tmp_path, "gate", "--target", "sglang", "--report-dir", str(report), *args)
    return proc, out, report


@pytest.mark.slow
@pytest.mark.parametrize("name", [None, *ALTERATIONS], ids=lambda n: n or "pristine")
def test_the_gate_catches_deep_bugs_through_their_property(sglang_target, name, tmp_path, request):
    if name is None:
        # The pristine copy's gate for every gate-on-a-copy test (test_gate_catches_parts' too): run as
        # on a PR that changed verify_mask.py (and the FA3 backend: the gate no-silent-downgrade's pristine
        # case shares), it must pass.
        gate = request.getfixturevalue("pristine_gate")
        out, report = gate["out"], Path(gate["report"])
        summary = json.loads((report / "summary.json").read_text())
        assert gate["returncode"] == 0, out
        assert "python/sglang/srt/layers/attention/verify_mask.py" in summary["gate"]["exercised"], summary["gate"]
        deep = summary["deep_boundary_corpus"]
        assert deep["runs"] > 0 and any("long row before short" in c for c in deep["cases"]), deep
        assert "Deep boundary corpus" in (report / "summary.md").read_text()
        return
    edits, caught_by = ALTERATIONS[name]
    site = altered_copy(tmp_path, edits, name)
    # narrowed to the property meant to catch it: the deep cases run before its search all the same
    proc, out, report = _gate(tmp_path, site, "--property", caught_by)
    assert proc.returncode == 1, out
    assert_caught_by(report, caught_by, out=out)
    summary = json.loads((report / "summary.json").read_text())
    assert summary["deep_boundary_corpus"]["runs"] > 0, summary["deep_boundary_corpus"]
