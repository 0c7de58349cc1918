import torch

from vmfuzz.harness.guard.shadow import CANARY, ShadowHeap


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


def _pooled_alloc(n=5):
    heap = ShadowHeap()
    t = heap.alloc("positions", n, torch.long, fill=-1, redzone_cells=3)
    return heap, t


def test_a_released_backing_is_reused_with_intact_redzones_and_a_fresh_fill():
    heap, t = _pooled_alloc(7)
    heap.store(t, torch.arange(7), torch.full((7,), 9))
    assert heap.check() == []
    addr = t.data_ptr()
    del t
    heap.release()
    again, t2 = _pooled_alloc(7)
    assert t2.data_ptr() == addr  # the pool handed the same backing back
    assert (t2 == -1).all()  # filled as asked, not the previous step's cells
    again.store(t2, torch.tensor([7]), torch.tensor([1]))  # one past the end: still caught
    [v] = again.check()
    assert (v.side, v.start) == ("back", 7)


def test_a_backing_still_viewed_or_overrun_is_never_handed_out_again():
    heap, held = _pooled_alloc(6)
    heap.release()  # `held` is still in use: its backing must not be reused
    other, t = _pooled_alloc(6)
    assert t.data_ptr() != held.data_ptr()
    other.store(t, torch.tensor([6]), torch.tensor([5]))  # overrun
    assert other.check()
    addr = t.data_ptr()
    del t
    other.release()
    third, t3 = _pooled_alloc(6)
    assert t3.data_ptr() != addr  # the overrun backing was dropped, not pooled
    assert third.check() == []


def test_the_pool_stays_under_its_byte_cap(monkeypatch):
    from vmfuzz.harness.guard import shadow
    monkeypatch.setattr(shadow.BACKING_POOL, "MAX_BYTES", 4096)
    for n in range(1, 40):  # 39 shapes, ~1 KiB each: far past the cap if all were kept
        heap = ShadowHeap()
        heap.alloc("tree_mask", 900 + n, torch.bool)
        heap.release()
    assert shadow.BACKING_POOL.bytes <= 4096
    assert shadow.BACKING_POOL.bytes == sum(g.backing.numel() for st in shadow.BACKING_POOL.free.values() for g in st)
