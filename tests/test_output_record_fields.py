"""The output recorder sees every field a reader hands on, private ones included; what it leaves out
is one reviewed list, each entry with its reason."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from vmfuzz.harness.engine.core.output_record import EXCLUDED, Leaves
from vmfuzz.harness.guard.shadow import ShadowHeap


def _record(value) -> dict:
    leaves = Leaves()
    leaves.walk(value, "out")
    return leaves.out


def test_a_private_field_a_reader_hands_on_is_recorded():
    a = _record(SimpleNamespace(indptr=torch.arange(3), _buffer=torch.zeros(4)))
    b = _record(SimpleNamespace(indptr=torch.arange(3), _buffer=torch.ones(4)))
    assert "out._buffer" in a and a["out._buffer"] != b["out._buffer"] and a["out.indptr"] == b["out.indptr"]


def test_only_the_listed_fields_are_left_out_and_each_says_why():
    assert all(isinstance(why, str) and len(why) > 20 for why in EXCLUDED.values())
    heap = ShadowHeap()
    heap.alloc("tree_mask", 8, torch.bool)
    got = _record(SimpleNamespace(heap=heap, _consultation=object()))
    fields = {k.split(".")[-1].split("#")[0].split("[")[0] for k in got}
    assert not {name for _, name in EXCLUDED} & fields, fields
    assert {"device", "guard", "beyond"} <= fields, fields
    # every field of the heap is either recorded or on the list: nothing is dropped unlisted
    assert set(vars(heap)) <= fields | {name for kind, name in EXCLUDED if kind == "ShadowHeap"}


def _plan(pool: object, slots: torch.Tensor):
    """A KV-location plan shaped as SGLang's: its id space keyed by (kind, id() of the allocator)."""
    import msgspec

    class IdSpace(msgspec.Struct, frozen=True):
        key: tuple

    class KVLocPlan:
        def __init__(self, space, ids):
            self.space, self._write_ids = space, {space.key: ids}

    key = ("SLIDING_WINDOW", id(pool))
    return KVLocPlan(IdSpace(key), slots)


def test_an_address_sglang_keys_by_is_not_an_output_but_what_it_keys_is():
    """0.5.23's KV-location plan keys its write slots by id() of the pool: two runs of the same code
    recorded different keys, so every survivor of the seed-20261207 mutation sample 'differed' on them."""
    from vmfuzz.harness.engine.core.output_record import ADDRESSED
    assert all(len(why) > 20 for why in ADDRESSED.values())
    one, other = object(), object()
    a, b = _record(_plan(one, torch.arange(4))), _record(_plan(other, torch.arange(4)))
    assert a == b and any("<address>" in k for k in a), sorted(a)
    c = _record(_plan(other, torch.arange(1, 5)))
    assert [k for k in a if a[k] != c[k]] == [k for k in a if "_write_ids" in k and "#len" not in k]


def test_the_addressed_fields_are_sglangs_own():
    from tests.helpers import sglang_or_skip
    sglang_or_skip()
    from sglang.srt.mem_cache import kv_loc_plan
    assert "key" in kv_loc_plan.IdSpace.__struct_fields__
    import inspect
    source = inspect.getsource(kv_loc_plan.KVLocPlan)
    assert "self._write_ids" in source
