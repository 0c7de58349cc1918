"""The KV-id gather on releases before ``pack_read_stream``: kv_indices judged there too.

0.5.20 and 0.5.21 call the translator's gather ``fill_packed_read_stream``;
releases before the translator launch the gather kernel over the backend's
request-to-token table themselves. Both are driven with the slots the stand-in
translator hands out (``readers.kv_slot``): the fast tests pin the stand-in
table and the launch's gather, the slow one alters a copy of an installed
release of the first kind and must see reader-agreement catch it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.model.readers import kv_slot, kv_slot_table
from vmfuzz.harness.targets.sglang.kv_ids import GathersFromTable, GathersKvSlots
from tests.sglang_copies import altered_copy, failed_check_origin, replay_on_copy


def _kernel(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr, kv_start_idx,
            kv_indices_ptr, req_to_token_ptr_stride, PAGED_SIZE=1):
    """The gather kernel's parameters as releases before the translator name them."""


def test_the_stand_in_table_holds_the_translator_s_slots():
    table = kv_slot_table(3, 40, "cpu")
    assert table.shape == (3, 40) and table.dtype == torch.int32
    assert all(int(table[p, t]) == kv_slot(p, t, 40) for p in range(3) for t in range(40))
    assert len(set(table.reshape(-1).tolist())) == table.numel()  # no two (request, token) share a slot


def _launch(table, *, stride=None, start=None, out=None, paged=1, handed=None):
    heap = ShadowHeap("cpu")
    translator = GathersKvSlots(heap, 40, table)
    gather = GathersFromTable(_kernel, translator)
    pool, lens = torch.tensor([2, 0]), torch.tensor([3, 2])
    indptr = torch.tensor([0, 3, 5])
    out = torch.empty(5, dtype=torch.int64) if out is None else out
    gather[(2,)](table if handed is None else handed, pool, lens, indptr, start, out, table.stride(0) if stride is None else stride,
                 PAGED_SIZE=paged)
    return out, translator


def test_a_launch_gathers_each_request_s_row_of_the_table_it_is_handed():
    table = kv_slot_table(3, 40, "cpu")
    out, translator = _launch(table)
    assert out.tolist() == [kv_slot(2, t, 40) for t in range(3)] + [kv_slot(0, t, 40) for t in range(2)]
    assert translator.gathered_into == {out.data_ptr()} and "create_flashinfer_kv_indices_triton" in translator.calls
    start = torch.tensor([4, 1])
    out, _ = _launch(table, start=start)
    assert out.tolist() == [kv_slot(2, t, 40) for t in range(4, 7)] + [kv_slot(0, t, 40) for t in range(1, 3)]


def test_a_wrong_row_pitch_reads_other_slots_and_past_the_table_none():
    table = kv_slot_table(3, 40, "cpu")
    out, _ = _launch(table, stride=41)
    assert out.tolist()[:3] == [kv_slot(2, t, 40) for t in range(2, 5)]  # row 2 read from its third token
    out, _ = _launch(table, stride=60)
    assert out.tolist()[:3] == [-1, -1, -1]  # row 2 at pitch 60 starts past the table's 120 cells


def test_a_foreign_table_is_left_unjudged_and_a_paged_launch_is_out_of_step():
    table = kv_slot_table(3, 40, "cpu")
    out, translator = _launch(table, handed=table.clone())
    assert translator.gathered_into == set()
    with pytest.raises(OutOfStep):
        _launch(table, paged=16)


def test_a_launch_over_the_no_kv_translator_s_view_is_left_unjudged_not_out_of_step():
    """0.5.19 hands the gather the fields of its per-batch index-table view; a backend vmfuzz gave the
    no-KV translator (an allocation site's) gets views with no fields, whose launch judges nothing."""
    from vmfuzz.harness.targets.sglang.seams import TranslatesNothing
    table = kv_slot_table(3, 40, "cpu")
    view = TranslatesNothing().index_table_for_batch(object())
    out, translator = _launch(table, handed=view.ids, stride=view.row_stride, paged=view.entry_page_size)
    assert translator.gathered_into == set()


def test_the_per_batch_view_is_sglang_s_own_method_over_the_stand_in_table(monkeypatch):
    """0.5.19's eager path asks ``index_table_for_batch`` (memoized by a weak reference to the batch),
    which calls ``build_index_table``: both run as SGLang's own methods over a plain pool whose table
    is the stand-in's, so the gather reads the stand-in's slots."""
    import weakref
    from types import SimpleNamespace
    from vmfuzz.harness.targets.sglang import kv_ids
    from vmfuzz.harness.targets.sglang.stand_in import StandIn

    class Translator:  # the two methods as 0.5.19 shapes them
        def build_index_table(self, *, req_pool_indices, seq_lens, max_pages=None, into=None):
            return SimpleNamespace(ids=self.req_to_token, row_ids=req_pool_indices, entry_page_size=1)

        def index_table_for_batch(self, forward_batch):
            view = self.build_index_table(req_pool_indices=forward_batch.req_pool_indices,
                                          seq_lens=forward_batch.seq_lens)
            self._index_table_memo = (weakref.ref(forward_batch), view)
            return view
    monkeypatch.setattr(kv_ids, "_real", lambda translator, method: getattr(Translator, method))
    table = kv_slot_table(3, 40, "cpu")
    fb = StandIn("ForwardBatch", req_pool_indices=torch.tensor([2, 0]), seq_lens=torch.tensor([3, 2]))
    view = GathersKvSlots(ShadowHeap("cpu"), 40, table).index_table_for_batch(fb)
    assert view.ids is table and view.row_ids.tolist() == [2, 0]


TRITON = Path("srt/layers/attention/triton_backend.py")
_FILL = r"(self\.kv_index_translator\.fill_packed_read_stream\(\n\s*)req_pool_indices=req_pool_indices\[:bs\],"
_CASE = {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 16, "num_draft_tokens": 4, "topk": 1, "spec_steps": 3}


@pytest.mark.slow
def test_a_fill_packed_read_stream_release_s_gather_order_is_caught(sglang_target, tmp_path):
    """On a release whose Triton backend fills kv_indices through ``fill_packed_read_stream`` (0.5.20,
    0.5.21: run with that release's venv), the gather taking each request's place in the batch for its
    pool slot is a reader-agreement catch on kv_indices; the same rows taken another way hold."""
    from importlib.util import find_spec
    source = (Path(find_spec("sglang").origin).parent / TRITON).read_text()
    if not re.search(_FILL, source):
        pytest.skip("the installed SGLang's Triton backend does not gather through fill_packed_read_stream")
    bad = altered_copy(tmp_path / "bad", [((str(TRITON),), _FILL,
                                           r"\1req_pool_indices=torch.arange(bs, device=seq_lens.device),")],
                       "fill-gather-batch-order")
    proc, out = replay_on_copy(bad, tmp_path / "bad", _CASE, [5, 9], "reader-agreement")
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "bad" / "report", out)
    assert (o["property"], o["buffer"]) == ("reader-agreement", "kv_indices"), o
    same = altered_copy(tmp_path / "same", [((str(TRITON),), _FILL,
                                             r"\1req_pool_indices=req_pool_indices[:bs].clone(),")],
                        "fill-gather-refactored")
    proc, out = replay_on_copy(same, tmp_path / "same", _CASE, [5, 9], "reader-agreement")
    assert proc.returncode == 0, out
