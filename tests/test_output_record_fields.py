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
