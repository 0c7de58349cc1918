"""The gate on an SGLang checkout: a changed condition that ran but no example provoked is not judged.

The PR below plants, in the stand-in checkout (tests/sglang_repo.py), three
changes, each of whose lines runs on every example the gate draws and whose
outputs the examples cannot tell from the base's: an operand deleted from the CUDA-only
chain branch's multi-line test (a CPU short-circuits on ``is_cuda`` first),
``all`` turned ``any`` over the batch's multimodal inputs on the chain's M-RoPE
argument (no strategy makes a mixed batch), and the custom-mask padding guard
deleted with the block it guarded from ``generate_attn_arg_prefill`` (its
neighbour ran and stood in for it). Reached, each used to read as
judged and end in exit 0; now each is exit 3, naming the expression and what
would provoke it. Skipped unless SGLang imports (``VMFUZZ_REQUIRE_SGLANG=1``: must run).
"""

from __future__ import annotations

import json

import pytest

from tests.test_gate_checkout import branch, gate

CHAIN = "python/sglang/srt/speculative/eagle_worker_common.py"
PREFILL = "python/sglang/srt/speculative/eagle_info.py"

#: branch -> (its change, the file, words the could-not-check line must hold)
UNPROVOKED = {
    "chain-operand-deleted": ((CHAIN, r"\n        and num_draft_tokens == num_steps \+ 1\n", "\n"),
                              CHAIN, "its operand `num_draft_tokens == num_steps + 1` deleted"),
    "mrope-all-to-any": ((CHAIN, r"(with_mrope=target_worker\.model_runner\.model_config\.model_is_mrope\n\s+and )all\(",
                          r"\1any("),
                         CHAIN, "mixing requests with and without multimodal inputs"),
    "padding-guard-deleted": ((PREFILL, r"\n        if self\.custom_mask\.numel\(\) < mask_numel:\n(?:            .*\n)+?"
                                        r"(\n        return kv_indices)", r"\n\1"),
                              PREFILL, "`self.custom_mask.numel() < mask_numel` is true"),
}


@pytest.mark.slow
def test_changes_that_ran_but_no_example_provoked_could_not_be_checked(stand_in_checkout, tmp_path):
    """All three on one PR, one gate: each is named on its own, none hides another (a PR seldom
    changes one thing), and the suite pays for one gate instead of three."""
    repo = stand_in_checkout
    branch(repo, "unprovoked", "three unprovoked changes", *(change for change, _, _ in UNPROVOKED.values()))
    proc, out = gate(repo, tmp_path / "report")
    assert proc.returncode == 3, out
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    missed = {}
    for name, (_, path, words) in UNPROVOKED.items():
        stuck = [line for line in summary["gate"]["could_not_check"] if line.startswith(path)]
        if not any("ran, but no example made it differ from the base" in line and words in line for line in stuck):
            missed[name] = stuck
    assert not missed, (missed, out)
    for path in {path for _, path, _ in UNPROVOKED.values()}:
        measured = next(f for f in summary["gate"]["lines"] if f["path"] == path)
        assert measured["unprovoked"] and not measured["exercised"], measured
        # one unprovoked expression a change: the chain file holds two of them
        assert len(measured["unprovoked"]) >= sum(p == path for _, p, _ in UNPROVOKED.values()), measured
