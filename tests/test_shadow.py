import torch

from harness.shadow import CANARY, ShadowHeap


def test_in_bounds_writes_leave_the_redzones_alone():
    heap = ShadowHeap()
    t = heap.alloc("tree_mask", 10, torch.bool, fill=True)
    heap.store(t, torch.arange(10), torch.zeros(10, dtype=torch.bool))
    assert heap.check() == []
    assert not t.any()


def test_write_past_the_end_is_reported_with_offsets_and_count():
    heap = ShadowHeap()
    t = heap.alloc("tree_mask", 6, torch.bool)
    heap.store(t, torch.tensor([6, 7]), torch.tensor([False, True]))
    [v] = heap.check(lambda name, off: 1)
    assert (v.buffer, v.side, v.start, v.stop, v.cells, v.numel, v.request) == ("tree_mask", "back", 6, 8, 2, 6, 1)


def test_a_false_written_into_the_redzone_is_still_caught():
    # Through a bool view the canary reads True; only a raw byte compare sees a 0 land there.
    heap = ShadowHeap()
    t = heap.alloc("tree_mask", 4, torch.bool)
    heap.store(t, torch.tensor([-1]), torch.tensor([False]))
    [v] = heap.check()
    assert v.side == "front" and v.start == -1


def test_wide_dtypes_report_cells_not_bytes():
    heap = ShadowHeap()
    t = heap.alloc("positions", 3, torch.long)
    heap.store(t, torch.tensor([3, 4]), torch.tensor([7, 7]))
    [v] = heap.check()
    assert (v.start, v.stop, v.cells) == (3, 5, 2)


def test_writes_past_the_redzone_are_dropped_and_recorded():
    heap = ShadowHeap()
    t = heap.alloc("tree_mask", 2, torch.bool)
    heap.store(t, torch.tensor([10_000]), torch.tensor([True]))
    [v] = heap.check()
    assert v.side == "beyond" and v.start == 10_000


def test_kernel_entry_guards_a_foreign_tensor_and_copies_back():
    heap = ShadowHeap()
    foreign = torch.zeros(4, dtype=torch.bool)  # allocated outside the heap, like SGLang's fallback

    def kernel(bufs):
        raw = bufs["m"]
        heap.store(raw, torch.arange(5), torch.ones(5, dtype=torch.bool))

    heap.run_kernel(kernel, {"m": foreign}, {"m": 8})
    assert foreign.all()
    [v] = heap.check()
    assert (v.buffer, v.start, v.cells) == ("m", 4, 1)


def test_unguarded_heap_hands_out_plain_tensors():
    heap = ShadowHeap(guard=False)
    t = heap.alloc("tree_mask", 3, torch.bool, fill=True)
    assert t.untyped_storage().nbytes() == 3 and heap.check() == []
    assert CANARY not in t.view(torch.uint8).tolist()
