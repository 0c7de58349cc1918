"""The verify input's draft tokens (``draft_token``), from the drafted tree to the oracle's judgement.

Each draft candidate carries a token id distinct per (request, candidate), so
the oracle knows which token each node must carry from the tree alone; a
wrapper that returns them in the wrong order, one node off, is a
``reference-agreement`` finding whose origin names ``draft_token``.
"""

from __future__ import annotations

import json

import pytest
import torch

from vmfuzz.harness.engine.search.search import run_property
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.oracle import expected
from vmfuzz.harness.model.outputs import StepOutput
from vmfuzz.harness.model.trees import draft
from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
from vmfuzz.harness.properties.kit import fail, first_difference
from vmfuzz.harness.targets import resolve
from tests.sglang_copies import altered_copy, assert_caught_by, run_on_copy

TREE = Config(TreeMaskMode.FULL_MASK, 2, 8, 4, 2, 3, True, "eagle")
# Candidates 0, 2, 6 and 0, 2, 3 (of 10): not a prefix of the candidates, so a gather by position shows.
BATCH = Batch((3, 5), trees=(draft(2, 3, 4, [1, 50, 1, 9, 1, 1, 0, 1, 1, 1]), draft(2, 3, 4, [1, 50] + [1] * 8)))
SITES = [Config(TreeMaskMode.FULL_MASK, 2, 8, 4, 2, 3, True, site) for site in ("eagle", "pp", "frozen_kv_mtp")] + [
    Config(TreeMaskMode.QLEN_ONLY, 2, 6, 3, 1, 2, True, "chain"),
    Config(TreeMaskMode.FULL_MASK, 2, 8, 1, 1, 0, True, "eagle")]


def test_oracle_gives_each_node_its_candidates_token():
    # 1000 + b: request b's verified token; 2000 + 10 b + c: its candidate c (topk 2, 3 steps: 10 candidates).
    assert expected(TREE, BATCH).draft_token.tolist() == [1000, 2000, 2002, 2006, 1001, 2010, 2012, 2013]
    trivial = Config(TreeMaskMode.FULL_MASK, 2, 8, 1, 1, 0, True, "eagle")
    assert expected(trivial, Batch((3, 5, 0))).draft_token.tolist() == [1000, 1001, 1002]


@pytest.mark.parametrize("config", SITES, ids=lambda c: f"{c.call_site}-d{c.d}")
def test_reference_carries_the_oracles_tokens_at_every_call_site(config):
    batch = BATCH if config.d == 4 else Batch((3, 5))
    heap = ShadowHeap("cpu")
    out = resolve("reference").verify(resolve("reference").allocate(config, heap), config, batch, heap).as_cpu()
    assert torch.equal(out.draft_token, expected(config, batch).draft_token)


def test_as_cpu_keeps_the_tokens_and_a_target_without_them_is_not_judged_on_them():
    z = torch.zeros(2, dtype=torch.long)
    out = StepOutput(torch.ones(2, dtype=torch.bool), z, z, z, z, reused=False, draft_token=torch.tensor([7, 8]))
    copy = out.as_cpu()
    assert copy.draft_token.tolist() == [7, 8] and copy.draft_token.data_ptr() != out.draft_token.data_ptr()
    bare = StepOutput(torch.ones(2, dtype=torch.bool), z, z, z, z, reused=False)
    assert bare.as_cpu().draft_token is None
    assert first_difference("", bare, out, TREE, Batch((0,)), torch.ones(2, dtype=torch.bool)) is None


def test_tokens_one_node_off_are_a_typed_difference():
    want = expected(TREE, BATCH)
    out = StepOutput(want.tree_mask, want.positions, want.retrieve_index, want.retrieve_next_token,
                     want.retrieve_next_sibling, reused=False, draft_token=torch.roll(want.draft_token, -1))
    diff = first_difference("x", out, want, TREE, BATCH, want.compared)
    assert diff is not None and "node 0" in diff
    with pytest.raises(PropertyFailure) as caught:
        fail("reference-agreement", diff, writer="verify step")
    origin = caught.value.origin
    assert (origin.property, origin.buffer, origin.effect, origin.cell) == ("reference-agreement", "draft_token",
                                                                           "wrong", "value")


def test_the_off_by_one_variant_is_caught_by_reference_agreement(tmp_path):
    res = run_property(resolve("reference+draft-token-off-by-one"), PROPERTIES["reference-agreement"], seed=0,
                       max_examples=10, bounds=Bounds(), findings_dir=tmp_path)
    assert res.finding is not None
    origin = res.finding.origin
    assert (origin.property, origin.buffer, origin.effect) == ("reference-agreement", "draft_token", "wrong")


# -- SGLang's wrapper ---------------------------------------------------------------

def test_sglang_returns_the_wrappers_tokens_at_every_call_site(sglang_target):
    for config in SITES:
        batch = BATCH if config.d == 4 else Batch((3, 5))
        heap = ShadowHeap("cpu")
        out = sglang_target.verify(sglang_target.allocate(config, heap), config, batch, heap).as_cpu()
        assert torch.equal(out.draft_token, expected(config, batch).draft_token), config.call_site


EAGLE_UTILS = ["srt/speculative/eagle_utils.py"]
_CONCAT = r"draft_tokens = torch\.cat\(\(bonus_tokens\.unsqueeze\(1\), draft_tokens\), dim=1\)\.flatten\(\)"
#: name -> edits: the wrapper's verify tokens as a reviewer could miss them going wrong.
ALTERATIONS = {
    "tokens-root-last": [(EAGLE_UTILS, _CONCAT,
                          "draft_tokens = torch.cat((draft_tokens, bonus_tokens.unsqueeze(1)), dim=1).flatten()")],
    "tokens-one-node-off": [(EAGLE_UTILS, _CONCAT, "draft_tokens = torch.cat((bonus_tokens.unsqueeze(1), "
                             "draft_tokens), dim=1).flatten().roll(-1)")],
}


@pytest.mark.slow
@pytest.mark.parametrize("alteration", list(ALTERATIONS))
def test_wrapper_tokens_out_of_order_are_caught_by_reference_agreement(sglang_target, alteration, tmp_path):
    site = altered_copy(tmp_path, ALTERATIONS[alteration], alteration)
    proc, out = run_on_copy(site, tmp_path, "run", "--target", "sglang", "--seed", "1", "--max-examples", "4",
                            "--property", "reference-agreement", "--report-dir", str(tmp_path / "report"))
    assert proc.returncode == 1, out
    assert_caught_by(tmp_path / "report", "reference-agreement", out=out)
    findings = json.loads((tmp_path / "report" / "summary.json").read_text())["findings"]
    assert {(f["origin"]["buffer"], f["origin"]["effect"]) for f in findings} == {("draft_token", "wrong")}, out
