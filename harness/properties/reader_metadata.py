"""reader-agreement's judgement of the Triton backend's target-verify metadata, against the meaning.

What the backend computed (``ReaderView``: qo_indptr, kv_indptr, kv_indices,
max_extend_len, mask_indptr) is compared with ``readers.expected_reads``, which
the harness works out from seq_lens, d and bs alone: request b reads its d
query rows, the KV slots of its s_b prefix tokens, and d x (s_b + d) mask cells,
one request after another. A replay's padding rows may be empty or at their
fill length, never reaching into a real request's cells or past a buffer. A
sliding-window server's backend also holds each request's window (``WindowView``):
its last min(s_b, W) prefix tokens' slots, and the mask column they start at.
"""

from __future__ import annotations

from bisect import bisect_right

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.readers import (ExpectedReads, ReaderView, WindowView, expected_reads,
                                   expected_window, kv_slot_stride, pool_slots)
from vmfuzz.harness.properties.kit import Difference

#: what one entry of each pointer array counts
_UNITS = {"qo_indptr": "query rows", "kv_indptr": "KV tokens", "mask_indptr": "mask cells",
          "window_kv_indptr": "windowed KV tokens"}


def metadata_mismatch(view: ReaderView, config: Config, batch: Batch, rows: int | None,
                      where: str) -> Difference | None:
    """The first output of ``view`` that is not what ``batch`` (padded to ``rows``) must read."""
    want = expected_reads(config, batch, rows)
    if view.max_extend_len != want.max_extend_len:
        return Difference(f"{where}: max_extend_len is {view.max_extend_len!r}, but each request extends by its "
                          f"d = {want.d} draft tokens", buffer="max_extend_len", cell="query rows")
    kv_cells = None if view.kv_indices is None else view.kv_indices.numel()
    for name, capacity in (("qo_indptr", want.qo_indptr[-1]), ("kv_indptr", kv_cells),
                           ("mask_indptr", view.mask.numel())):
        diff = _pointer_mismatch(name, getattr(view, "indptr" if name == "mask_indptr" else name), want,
                                 capacity, where)
        if diff:
            return diff
    diff = _slot_mismatch(view.kv_indices, "kv_indices", want.kv_indices, want.kv_indptr, want.rows,
                          config.max_context_len, where)
    if diff is None and view.window is not None:
        diff = _sliding_window_mismatch(view.window, want, config, where)
    return diff


def _sliding_window_mismatch(window: WindowView, full: ExpectedReads, config: Config,
                             where: str) -> Difference | None:
    """The window's pointers, each real request's first windowed mask column, and its windowed KV slots."""
    want = expected_window(full, window.size, config.max_context_len)
    cells = None if window.kv_indices is None else window.kv_indices.numel()
    diff = _pointer_mismatch("window_kv_indptr", window.kv_indptr, want, cells, where)
    if diff:
        return diff
    got = [] if window.kv_offsets is None else window.kv_offsets.reshape(-1)[:want.real].cpu().tolist()
    for b in range(want.real):
        have, first = (int(got[b]) if b < len(got) else None), want.window_kv_offsets[b]
        if have != first:
            return Difference(f"{where}: window_kv_offsets gives request {b} (s_b {want.seq_lens[b]}) the first "
                              f"windowed mask column {have}, but its window starts at prefix token {first}",
                              buffer="window_kv_offsets", cell="request window")
    return _slot_mismatch(window.kv_indices, "window_kv_indices", want.window_kv_indices, want.window_kv_indptr,
                          want.rows, config.max_context_len, where)


def _pointer_mismatch(name: str, tensor, want: ExpectedReads, capacity: int | None, where: str) -> Difference | None:
    exp, own, unit = getattr(want, name), want.row_lengths(name), _UNITS[name]
    got = [] if tensor is None else [int(v) for v in tensor.reshape(-1)[:want.rows + 1].cpu().tolist()]
    if len(got) < want.rows + 1:
        return Difference(f"{where}: {name} holds {len(got)} entries; {want.rows} requests need "
                          f"{want.rows + 1}", buffer=name, cell="length")
    if got[0] != 0:
        return Difference(f"{where}: {name}[0] is {got[0]}: request 0's {unit} start at 0", buffer=name,
                          cell="request window")
    for r in range(want.rows):
        lo, hi = got[r], got[r + 1]
        if r < want.real and (lo, hi) != (exp[r], exp[r + 1]):
            return Difference(f"{where}: {name} gives request {r} the {unit} [{lo}, {hi}), but its {own[r]} "
                              f"{unit} lie at [{exp[r]}, {exp[r + 1]})", buffer=name, cell="request window")
        if r >= want.real and hi - lo not in (0, own[r]):
            return Difference(f"{where}: {name} gives padding row {r} (a request at the fill length "
                              f"{want.seq_lens[r]}) the {unit} [{lo}, {hi}): {hi - lo}, neither none nor its "
                              f"{own[r]}", buffer=name, cell="padding row")
    if capacity is not None and got[-1] > capacity:
        return Difference(f"{where}: {name} runs the padding rows to {got[-1]}, past the {capacity} {unit} "
                          "they index", buffer=name, cell="padding row")
    return None


def _slot_words(slot: int, max_context_len: int) -> str:
    if slot < 0:
        return "no KV slot: the gather left it as it was"
    stride = kv_slot_stride(max_context_len)
    return f"token {slot % stride} of the request in pool slot {slot // stride - 1}"


def _slot_mismatch(indices, name: str, want: list[int], indptr: list[int], rows: int, max_context_len: int,
                   where: str) -> Difference | None:
    """Each real request's KV window in ``indices`` holds its own tokens' slots (``want``), in order."""
    if indices is None:
        return None
    n = len(want)
    got = indices.reshape(-1)
    if got.numel() < n:
        return Difference(f"{where}: {name} holds {got.numel()} ids, the batch's tokens read are {n}",
                          buffer=name, effect="overrun", side="above", cell="slot")
    have = [int(v) for v in got[:n].cpu().tolist()]
    for i, (h, w) in enumerate(zip(have, want)):
        if h != w:
            b = bisect_right(indptr, i) - 1
            return Difference(f"{where}: {name}[{i}] (request {b}'s entry {i - indptr[b]}) is {h}, "
                              f"{_slot_words(h, max_context_len)}; request {b} sits in pool slot "
                              f"{pool_slots(rows)[b]}, whose token is in KV slot {w}",
                              buffer=name, cell="slot")
    return None
