"""The multi-layer draft-extend prepare kernel's padded rows: three mutants of a fresh sample, judged.

The seed-20261207 mutation sample (bench/mutation-0.5.23/survivors-seed20261207.md) left three mutants
of ``fill_draft_extend_prepare_buffers_kernel``'s row roles green:

- ``is_real = i is not raw_bs`` (every row real): padded rows, and rows past bs, load the live batch's
  per-request sources past their raw_bs rows. A real bug: padded requests take whatever lies past the
  batch's tensors as their length and pool row. The gate saw it only by chance (what followed the live
  tensors in memory); the live batch's tensors are now cut from longer ones whose rest is poison
  (``draft_extend_runner.past_end``), so padding-inert catches it every time, as a padded request reading
  a live request's KV.
- ``is_pad = (i >= raw_bs) >> (i < bs)`` (no row padded) and ``in_bs = i <= bs`` (one row more in bs):
  equivalent for everything a server reads. Over every shape up to max_bs 6 (``tests/prepare_scope.py``)
  the first changes only the padded rows' ``select_index`` (row 0 of each padded row's window for its
  stale count), the second only row bs of ``num_accept_tokens``, ``select_index`` and ``temperatures``.
  The runner reads those buffers as ``[:bs]`` after a prepare at that bs, which writes every row below
  it, and cuts what a replay returns to the raw rows; a padded row's ``select_index`` only picks which
  of its own window's logits feed its discarded top-k.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import sglang_or_skip
from tests.sglang_copies import altered_copy, assert_altered_replay_caught, replay_on_copy, script_on_copy
from tests.surface_ran import assert_texts_ran, checked_under_coverage
from tests.test_draft_extend_graph import _CHAIN, ML_KERNEL
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode

LENS = (5, 7, 3)  # graphs at bs 1, 2, 4: a batch of 3 replays padded to 4
PROP = "padding-inert"
_REAL = r"is_real = i < raw_bs"
#: name -> the kernel's line as the mutant wrote it
EVERY_ROW_REAL = [(ML_KERNEL, _REAL, "is_real = i is not raw_bs")]
NO_ROW_PADDED = [(ML_KERNEL, r"is_pad = \(i >= raw_bs\) & \(i < bs\)", "is_pad = (i >= raw_bs) >> (i < bs)")]
ONE_MORE_IN_BS = [(ML_KERNEL, r"in_bs = i < bs", "in_bs = i <= bs")]
#: the same line rewritten without changing what it computes
REAL_REWRITTEN = [(ML_KERNEL, _REAL, "is_real = raw_bs > i")]
NATIVE_KNOWN = "multi-layer-native-prepare-stale-padded-slots: multi-layer draft extend, native prepare"


def test_a_live_batch_tensor_is_followed_by_poison():
    from vmfuzz.harness.targets.sglang.draft_extend_runner import past_end
    config = Config(TreeMaskMode.FULL_MASK, 4, 32, 3, 1, 2)
    got = past_end(torch.tensor([5, 6], dtype=torch.int32), 35, config)
    assert got.tolist() == [5, 6] and got.dtype == torch.int32
    whole = torch.as_strided(got, (2 + 4 * 3,), (1,))
    assert whole[2:].tolist() == [35] * 12
    slots = past_end(torch.tensor([7, 8, 9]), torch.tensor([7, 8, 9]), config)
    assert torch.as_strided(slots, (15,), (1,))[3:].tolist() == [7, 8, 9] * 4


@pytest.mark.slow
def test_padded_rows_reading_the_source_are_caught_by_padding_inert(tmp_path):
    sglang_or_skip()
    assert_altered_replay_caught(tmp_path, EVERY_ROW_REAL, "every-row-real", _CHAIN, LENS, PROP,
                                 {"writer": "multi-layer draft extend replay", "buffer": "req_pool_indices",
                                  "cell": "padded row"})


@pytest.mark.slow
@pytest.mark.parametrize("edits", [[], REAL_REWRITTEN], ids=["pristine", "real-rows-rewritten"])
def test_pristine_and_a_rewrite_hold_on_the_triton_prepare(tmp_path, edits):
    """Exit 0, the one thing met being the native prepare's known entry: the runners are judged in turn
    (``draft_extend_replay.RUNNERS``), the Triton prepare's before the native one (a torch function this
    kernel is no part of), and a failure of the Triton one would end the check there, naming it."""
    sglang_or_skip()
    proc, out = replay_on_copy(altered_copy(tmp_path, edits, "rewrite" if edits else None), tmp_path, _CHAIN,
                               LENS, PROP)
    assert proc.returncode == 0 and "FAILED" not in out, out
    [check] = json.loads((tmp_path / "report" / "summary.json").read_text())["checks"]
    assert check["status"] == "known" and check["detail"].startswith(f"known finding {NATIVE_KNOWN}"), check
    assert check["origin"]["writer"] == "multi-layer draft extend, native prepare replay", check


@pytest.mark.slow
def test_the_prepare_ran_under_padding_inert_on_a_padded_replay(sglang_target):
    """coverage.py, as the gate measures: the wrapper launched the kernel under the property (the kernel's
    own lines run in the interpreter, which coverage does not see), on a padded replay."""
    config = Config(TreeMaskMode.FULL_MASK, 4, 32, 3, 1, 2)
    root, obs, data = checked_under_coverage(sglang_target, PROP, config, [Batch(LENS)], ML_KERNEL)
    assert "multi-layer draft extend: padded replay" in obs.classes, sorted(obs.classes)
    assert_texts_ran(root, [(ML_KERNEL[0], "fill_draft_extend_prepare_buffers_kernel[grid](")], data)


def _scope(tmp_path: Path, edits, name) -> dict:
    """tests/prepare_scope.py on a copy: shape -> buffers."""
    return {tuple(r["shape"]): r["buffers"]
            for r in map(json.loads, script_on_copy(tmp_path, edits, name, "prepare_scope.py"))}


def _differing(base: dict, got: dict) -> set:
    """(buffer, where) of every cell that differs: where is real / padded / row bs / past row bs."""
    out = set()
    for (max_bs, bs, raw, _), buffers in base.items():
        for name, values in buffers.items():
            per = len(values) // max_bs
            for i, (a, b) in enumerate(zip(values, got[(max_bs, bs, raw, _)][name])):
                row = i // per
                if a != b:
                    out.add((name, "real" if row < raw else "padded" if row < bs else
                             "row bs" if row == bs else "past row bs"))
    return out


@pytest.mark.slow
def test_every_small_shape_two_mutants_change_only_unread_rows(tmp_path):
    """All 56 (max_bs, bs, raw_bs) shapes up to max_bs 6, windows 2 and 3, stale buffers and poisoned
    sources: where each mutant's buffers differ from the pristine kernel's."""
    sglang_or_skip()
    base = _scope(tmp_path, [], "pristine")
    assert len(base) == 112
    assert _differing(base, _scope(tmp_path, NO_ROW_PADDED, "no-row-padded")) == {("select_index", "padded")}
    assert _differing(base, _scope(tmp_path, ONE_MORE_IN_BS, "one-more-in-bs")) == {
        ("num_accept_tokens", "row bs"), ("select_index", "row bs"), ("temperatures", "row bs")}
    every = _differing(base, _scope(tmp_path, EVERY_ROW_REAL, "every-row-real"))
    assert {("seq_lens", "padded"), ("req_pool_indices", "padded"), ("seq_lens", "past row bs")} <= every
    assert not {w for _, w in every} & {"real"}
