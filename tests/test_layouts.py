
from vmfuzz.harness.model.layouts import (TreeMaskMode, logical_size, request_at,
                             request_extents, worst_case_size)

FULL, QLEN, BITS = TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY, TreeMaskMode.QLEN_ONLY_BITPACKING


def test_full_mask_blocks_follow_the_design_table():
    # d = 3, seq_lens 2 and 5: request 1 starts after 3 rows of (2 + 3) cells.
    ext = request_extents(FULL, [2, 5], 3)
    assert [(e.start, e.stop) for e in ext] == [(0, 15), (15, 39)]
    assert logical_size(FULL, [2, 5], 3) == 3 * 7 + 9 * 2


def test_qlen_and_bitpacked_blocks_ignore_seq_lens():
    assert [(e.start, e.stop) for e in request_extents(QLEN, [100, 0], 4)] == [(0, 16), (16, 32)]
    assert [(e.start, e.stop) for e in request_extents(BITS, [7, 7, 7], 4)] == [(0, 4), (4, 8), (8, 12)]


def test_worst_case_is_every_request_at_the_context_limit():
    assert worst_case_size(FULL, 4, 8, 1000) == 4 * 8 * (1000 + 8)
    assert worst_case_size(QLEN, 4, 8, 1000) == 4 * 64
    # production scale stays pure arithmetic
    assert worst_case_size(FULL, 1024, 64, 1 << 20) == 1024 * 64 * ((1 << 20) + 64)


def test_request_at_attributes_offsets_past_the_buffer():
    # the buffer of max_bs 1 ends at 6 cells; cells 6..7 belong to request 1's block
    assert request_at(FULL, [0, 0], 2, 6) == 1
    assert request_at(FULL, [0, 0], 2, 8) is None

