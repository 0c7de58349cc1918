"""reader-agreement and packed-mask: the mask as attention reads it (docs/properties.md).

Both take the usual case (config, batches) and reuse one verify step per batch:
the step writes the mask through the target's call site, then the target's
reader seams read it. Where each request's cells lie comes from the layout table of docs/architecture.md
layout (``layouts.request_extents``), never from the reader's own arithmetic;
a reader window must hold what the step wrote there, and the packed bytes must
be this module's own bit packing of the oracle's cells.

A QLEN_ONLY case runs as the same deployment with a FULL_MASK read mask: the
readers exist only there (``readers.reader_config``).
"""

from __future__ import annotations

import dataclasses

import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode, logical_size, request_extents
from vmfuzz.harness.model.oracle import expected
from vmfuzz.harness.model.origin import BEYOND_CAPACITY
from vmfuzz.harness.properties.kit import (VERIFY_STEP, Difference, Observation, capacity_of, fail, fail_overrun,
                                    first_difference, known_goes_on, locator, reused_mask, sub_check_done,
                                    sub_check_skipped)
from vmfuzz.harness.properties.fa3_reads import check_fa3
from vmfuzz.harness.properties.qsa_reads import check_qsa
from vmfuzz.harness.properties.flashinfer_plan import judge_plan
from vmfuzz.harness.properties.reader_metadata import metadata_mismatch
from vmfuzz.harness.model.readers import captured_bs, reader_config, sliding_window
from vmfuzz.harness.guard.shadow import ShadowHeap, describe_all

#: who reads the mask: the Triton backend's index arithmetic (eager metadata, graph replay)
READER = "triton reader"
#: who packs it for FlashInfer
PACKER = "pack kernel"
_STAGE = {"eager": "eager", "cuda-graph replay": "replay"}


def _observe(obs: Observation, case_config: Config, config: Config, batch: Batch, out, mask, path: str) -> None:
    obs.add_step(config, batch, out, capacity_of(mask))
    obs.classes.add(f"reader {path}")
    if case_config is not config:
        obs.classes.add("reader layout FULL_MASK (case was QLEN_ONLY)")


def _window_mismatch(view, config: Config, batch: Batch, written: torch.Tensor, path: str) -> Difference | None:
    """First request whose reader window is not exactly the block the writer wrote for it.

    Where the block lies is the layout table's (docs/architecture.md); what it holds is what the verify
    step left in ``written`` (whether that is right is reference-agreement's question).
    """
    indptr = [int(v) for v in view.indptr.reshape(-1).cpu().tolist()]
    if len(indptr) < batch.bs + 1:
        return Difference(f"{path} reader: mask_indptr has {len(indptr)} entries for {batch.bs} requests",
                          buffer="mask_indptr", cell="length")
    raw = view.mask.reshape(-1).view(torch.uint8).cpu()
    want = written.reshape(-1).view(torch.uint8).cpu()
    for ext in request_extents(TreeMaskMode.FULL_MASK, batch.seq_lens, config.d):
        b, lo, hi = ext.request, indptr[ext.request], indptr[ext.request + 1]
        where = (f"{path} reader, request {b} of {batch.bs} (seq_lens {list(batch.seq_lens)}, d {config.d}, "
                 f"max_bs {config.max_bs})")
        if (lo, hi) != (ext.start, ext.stop):
            return Difference(f"{where}: reads cells [{lo}, {hi}), but the writer wrote request {b}'s "
                              f"{config.d} x ({batch.seq_lens[b]} + {config.d}) cells at [{ext.start}, {ext.stop})",
                              buffer="mask_indptr", cell="request window")
        if hi > raw.numel():
            return Difference(f"{where}: reads cells [{lo}, {hi}) of a {raw.numel()}-cell mask",
                              buffer="tree_mask", effect="overrun", side="above", cell="read past the mask")
        if hi > want.numel():
            return Difference(f"{where}: the writer's {want.numel()}-cell mask ends inside the block [{lo}, {hi})",
                              buffer="tree_mask", effect="overrun", side="above", cell=BEYOND_CAPACITY)
        bad = torch.nonzero(raw[lo:hi] != want[lo:hi]).flatten()
        if bad.numel():
            cell = int(bad[0])
            row, col = divmod(cell, batch.seq_lens[b] + config.d)
            return Difference(f"{where}: {bad.numel()} of its cells differ from what the writer wrote there, "
                              f"first row {row} column {col}: reads {int(raw[lo + cell])}, wrote {int(want[lo + cell])}",
                              buffer="tree_mask", cell="read " + ("prefix column" if col < batch.seq_lens[b]
                                                                   else "tree cell"))
    return None


def _judge(view, config: Config, batch: Batch, written: torch.Tensor, context: str, **at) -> None:
    """Fail reader-agreement unless ``view`` reads each request's own cells, query rows and KV slots."""
    diff = _window_mismatch(view, config, batch, written, context)
    if diff is None:
        rows = captured_bs(batch.bs, config.max_bs) if at["stage"] == "replay" else None
        padded = f", padded to {rows}" if rows else ""
        diff = metadata_mismatch(view, config, batch, rows, f"{context} reader (seq_lens {list(batch.seq_lens)}, "
                                 f"d {config.d}, max_bs {config.max_bs}{padded})")
    if diff:
        fail("reader-agreement", diff, writer=READER, **at)


def _locate(config: Config, batch: Batch):
    """Names the request of a stray mask write; a stray KV-id write is the gather's, of no one request."""
    mask_request = locator(config, batch)
    return lambda buffer, offset: mask_request(buffer, offset) if buffer == "tree_mask" else None


def _stray(heap: ShadowHeap, config: Config, batch: Batch, what: str, **where) -> None:
    """Fail reader-agreement on a write outside the mask (the replay's copy of the step's mask)
    or outside the KV-index buffer (the metadata's KV gather), naming which."""
    violations = heap.check(_locate(config, batch))
    if violations:
        copy = violations[0].buffer == "tree_mask"
        doing = "copied the step's mask out of bounds" if copy else f"wrote outside {violations[0].buffer}"
        fail_overrun("reader-agreement", f"{what} {doing} (bs {batch.bs}, max_bs {config.max_bs}): "
                     + describe_all(violations), violations, writer="cuda-graph replay copy" if copy else READER,
                     capacity_bs=config.max_bs, **where)


def reader_agreement(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
    """Each reader's index arithmetic gives request b exactly the cells the writer wrote for it,
    and the query rows and KV slots that are its own, read fresh per batch and through one
    backend that serves the case's batches in turn."""
    obs = Observation()
    rc = reader_config(config)
    fresh = [_fresh_reads(target, obs, config, rc, batch, device) for batch in batches]
    session = getattr(target, "reader_session", None)
    if session is None:
        obs.classes.add("server state: not driven by this target")
        sub_check_skipped(obs, "server state", "this target keeps no backend across batches")
        return obs
    _server_reads(target, obs, rc, batches, fresh, device)
    return obs


def _fresh_reads(target, obs: Observation, config: Config, rc: Config, batch: Batch, device) -> dict:
    """One batch through a reader built for it alone: the reference the server's reader must agree with."""
    heap, mask = reused_mask(target, rc, device, "reader-agreement")
    out = target.verify(mask, rc, batch, heap).as_cpu()
    violations = heap.check(locator(rc, batch))
    if violations:  # the writer's, not a reader's: say so before any reader runs
        fail_overrun("reader-agreement", "the verify step itself wrote out of bounds (see no-oob-write): "
                     + describe_all(violations), violations, writer=VERIFY_STEP,
                     capacity_bs=rc.max_bs if out.reused else batch.bs)
    want = out.tree_mask.clone()  # a reader must not be able to change what it is compared with
    _observe(obs, config, rc, batch, out, mask, "eager")
    view = target.read_eager(rc, batch, out, heap)
    _stray(heap, rc, batch, "the eager reader", stage="eager")
    _judge(view, rc, batch, want, "eager", stage="eager")
    _judged(obs, view)
    # the other readers of the same step are independent: a known defect of one ends only its own read
    with known_goes_on(target, obs, "overlap scheduler"):
        _overlapped(target, obs, rc, batch, out, want, heap)
    with known_goes_on(target, obs, "sliding-window read eager"):
        _windowed(target, obs, rc, batch, out, want, heap, None)
    with known_goes_on(target, obs, "fa3 reader"):
        check_fa3(target, obs, rc, batch, out, want)
    with known_goes_on(target, obs, "qsa reader"):
        check_qsa(target, obs, rc, batch, out)
    reads = {"eager": _indptr(view, batch), "step": out}
    if batch.bs > rc.max_bs:
        return reads  # past the captured max_bs the server runs eagerly: no graph to replay
    view = target.read_replay(mask, rc, batch, out, heap)
    _observe(obs, config, rc, batch, out, mask, "replay")
    if view.captured_bs is not None and view.captured_bs > batch.bs:
        obs.classes.add("replay padded to a captured bs")
    _stray(heap, rc, batch, "cuda-graph replay", stage="replay")
    _judge(view, rc, batch, want, "cuda-graph replay", stage="replay")
    with known_goes_on(target, obs, "sliding-window read replay"):
        _windowed(target, obs, rc, batch, out, want, heap, mask)
    reads["cuda-graph replay"] = _indptr(view, batch)
    return reads


def _overlapped(target, obs: Observation, rc: Config, batch: Batch, out, want, heap: ShadowHeap) -> None:
    """The eager read again, as the overlap scheduler hands the batch: it never copies the batch's total
    length to the host, so the reader sizes its KV gather without it. Request b's cells, rows and slots
    must not depend on which scheduler ran."""
    read = getattr(target, "read_eager_overlapped", None)
    if read is None:
        obs.classes.add("overlap scheduler: not driven by this target")
        return
    view = read(rc, batch, out, heap)
    _stray(heap, rc, batch, "the eager reader under the overlap scheduler", stage="eager")
    _judge(view, rc, batch, want, "eager, overlap scheduler (seq_lens_sum unknown)", stage="eager")
    obs.classes.add("overlap scheduler: seq_lens_sum unknown")


def _windowed(target, obs: Observation, rc: Config, batch: Batch, out, want, heap: ShadowHeap, mask) -> None:
    """The same read on a server whose model reads a sliding window (``readers.sliding_window``): every
    output judged as above, and beside them each request's window (its slots, and the mask column it
    starts at). ``mask``: the replay's, None: eager."""
    path, stage = ("cuda-graph replay", "replay") if mask is not None else ("eager", "eager")
    read = getattr(target, "read_window_replay" if mask is not None else "read_window_eager", None)
    if read is None:
        obs.classes.add("sliding-window read: not driven by this target")
        sub_check_skipped(obs, "sliding windows", "this target reads no sliding window")
        return
    size = sliding_window(batch)
    view = read(*(() if mask is None else (mask,)), rc, batch, out, heap, size)
    _stray(heap, rc, batch, f"the {path} reader of a sliding-window server", stage=stage)
    _judge(view, rc, batch, want, f"{path} (sliding window {size})", stage=stage)
    windows = "its windows' KV ids" if view.window is not None and view.window.kv_indices is not None else ""
    sub_check_done(obs, "sliding windows")
    obs.classes.add(f"sliding-window read {stage}" + (f", {windows}" if windows else "")
                    + (", some windows inside the prefix" if max(batch.seq_lens) > size else ""))


def _judged(obs: Observation, view) -> None:
    """The ledger after a read that ``_judge`` passed: what it judged, and the KV ids it could not."""
    for name in ("mask cells", "qo_indptr", "kv_indptr"):
        sub_check_done(obs, name)
    if view.kv_indices is None:
        obs.classes.add("kv_indices: gathered by a kernel vmfuzz does not drive on this SGLang")
        sub_check_skipped(obs, "kv_indices", "gathered by a kernel vmfuzz does not drive on this SGLang")
    else:
        sub_check_done(obs, "kv_indices")


def _indptr(view, batch: Batch) -> list[int]:
    return [int(v) for v in view.indptr.reshape(-1)[:batch.bs + 1].cpu().tolist()]


def _server_reads(target, obs: Observation, rc: Config, batches: list[Batch], fresh: list[dict], device) -> None:
    """The case's batches in a server's order: one mask, one backend, its graphs captured once at start-up.

    Batch i must read what it read through a reader built for it alone
    (``fresh[i]``): state a backend keeps from one batch to the next (an
    offset, an indptr, a captured buffer) must never leak into the next one.
    The writer is not run again: each batch's fresh step is laid into the one
    mask as that step would have written it (its logical region; cells past it
    keep what earlier batches left), since the writer's own state across steps
    is multi-step-reuse's question and this is the readers'.
    """
    heap, mask = reused_mask(target, rc, device, "reader-agreement")
    session = target.reader_session(mask, rc, max(b.bs for b in batches), heap)
    flat = mask.buffer.view(-1)
    for i, batch in enumerate(batches):
        out = fresh[i]["step"]
        if out.reused:
            n = logical_size(TreeMaskMode.FULL_MASK, batch.seq_lens, rc.d)
            flat[:n].copy_(out.tree_mask.reshape(-1)[:n].to(flat.device))
            out = dataclasses.replace(out, tree_mask=mask.buffer)
        want = out.tree_mask.detach().cpu().clone()
        paths = [("eager", session.eager)] + ([("cuda-graph replay", session.replay)] if batch.bs <= rc.max_bs
                                               else [])
        for path, read in paths:
            view = read(batch, out)
            where = f"server state, batch {i + 1} of {len(batches)} through one backend, {path}"
            at = dict(stage=_STAGE[path], step=i, steps=len(batches))
            _stray(heap, rc, batch, where + ":", **at)
            got = _indptr(view, batch)
            if got != fresh[i][path]:
                fail("reader-agreement", f"{where}: mask_indptr {got}, but a backend built for this batch "
                                          f"alone gives {fresh[i][path]} (seq_lens {list(batch.seq_lens)}, "
                                          f"d {rc.d}, max_bs {rc.max_bs}): state left by earlier batches",
                     effect="wrong", writer=READER, buffer="mask_indptr", cell="state left by earlier batches", **at)
            _judge(view, rc, batch, want, where, **at)
            obs.classes.add(f"server state: {path}" + (" after an earlier batch" if i else ""))
            sub_check_done(obs, "server state")


# -- packed-mask -----------------------------------------------------------------

def packed_bytes(cells: torch.Tensor) -> list[int]:
    """Bytes holding ``cells`` (0/1 each) as bits, the first cell in bit 0 of the first byte."""
    bits = cells.view(torch.uint8).tolist()
    out = [0] * ((len(bits) + 7) // 8)
    for i, bit in enumerate(bits):
        if bit:
            out[i // 8] |= 1 << (i % 8)
    return out


def _expected_packing(config: Config, batch: Batch, want: torch.Tensor) -> tuple[list[int], list[list[int]]]:
    """(byte offset of each request, its bytes): what the packed reader must find."""
    starts, rows = [0], []
    for ext in request_extents(TreeMaskMode.FULL_MASK, batch.seq_lens, config.d):
        rows.append(packed_bytes(want[ext.start:ext.stop]))
        starts.append(starts[-1] + len(rows[-1]))
    return starts, rows


def _packed_mismatch(view, config: Config, batch: Batch, starts, rows, writer_ok: bool) -> Difference | None:
    indptr = [int(v) for v in view.indptr.reshape(-1).cpu().tolist()]
    where = f"seq_lens {list(batch.seq_lens)}, d {config.d}"
    if indptr[:batch.bs + 1] != starts:
        return Difference(f"packed_indptr {indptr[:batch.bs + 1]} != {starts}: request b's "
                          f"ceil((s_b + d) * d / 8) bytes must follow one another ({where})",
                          buffer="packed_indptr", cell="value")
    got = view.buffer.reshape(-1).cpu()
    for b, row in enumerate(rows):
        have = got[starts[b]:starts[b] + len(row)].tolist()
        if have != row:
            i = next(k for k, (x, y) in enumerate(zip(have, row)) if x != y)
            hint = "" if writer_ok else " (the mask it packed already differs from the oracle: see reference-agreement)"
            return Difference(f"request {b}'s packed byte {i} (cells {8 * i}..{8 * i + 7} of its block) is "
                              f"{have[i]:#010b}, the mask's bits LSB first are {row[i]:#010b} ({where}){hint}",
                              buffer="packed_mask", cell="byte")
    return None


def _stale_bytes(buffer: torch.Tensor) -> None:
    """What an earlier replay left in the packed buffer: neither zeros nor the canary."""
    n = buffer.numel()
    buffer.copy_(((torch.arange(n, device=buffer.device) * 37 + 11) % 251).to(torch.uint8))


def packed_mask(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
    """Packing writes only inside its buffer and yields the bit-packed mask where the reader looks."""
    obs = Observation()
    rc = reader_config(config)
    for batch in batches:
        oracle = expected(rc, batch).tree_mask
        heap, mask = reused_mask(target, rc, device, "packed-mask")
        out = target.verify(mask, rc, batch, heap)
        _observe(obs, config, rc, batch, out, mask, "packed")
        starts, rows = _expected_packing(rc, batch, oracle)
        n = oracle.numel()
        # The writer's faults, not the packer's: say so before packing reads past a short mask.
        violations = heap.check(locator(rc, batch))
        if violations:
            fail_overrun("packed-mask", "the verify step itself wrote out of bounds (see no-oob-write): "
                         + describe_all(violations), violations, writer=VERIFY_STEP,
                         capacity_bs=rc.max_bs if out.reused else batch.bs)
        if out.tree_mask.numel() < n:
            fail("packed-mask", f"the verify step's mask holds {out.tree_mask.numel()} cells, the batch's "
                                 f"logical region needs {n} (see fallback-equivalence): nothing valid to pack",
                 effect="overrun", writer=VERIFY_STEP, buffer="tree_mask", side="above", cell=BEYOND_CAPACITY)
        written = out.tree_mask.reshape(-1)[:n].view(torch.uint8).cpu()
        writer_ok = torch.equal(written, oracle.view(torch.uint8))
        if not writer_ok:  # the mask to pack is already wrong: the writer's cause, not the packer's
            want = expected(rc, batch)
            diff = first_difference("the verify step's mask, before packing, vs oracle", out.as_cpu(), want, rc,
                                    batch, want.compared)
            if diff:
                fail("packed-mask", diff, writer=VERIFY_STEP)
        total = starts[-1]
        for capacity in (total, total - 1):
            pheap = ShadowHeap(device)
            # A wrong offset lands anywhere up to a whole unpacked block away.
            buffer = pheap.alloc("packed_mask", capacity, torch.uint8, redzone_cells=n + 64)
            _stale_bytes(buffer)
            try:
                view = target.pack_mask(rc, batch, out.tree_mask, buffer)
            except AssertionError as exc:  # SGLang refuses with an assert; the model with PackRefused
                if capacity == total:
                    # A refusal of a batch that fits is SGLang's own assert raising: a raise finding
                    # (its type and innermost frame), never credited to this property's check.
                    exc.add_note(f"packed-mask: refused a batch whose packed mask ({total} bytes) fits its "
                                 f"{capacity}-byte buffer")
                    raise
                view = None
            if view is not None and view.raised is not None:
                judge_plan(view, rc, batch, oracle)  # what was handed on before the raise, upstream first
                raise view.raised  # every array handed on was right: the raise is the finding
            violations = pheap.check()
            if violations:
                why = "" if capacity == total else f" (needs {total}: the host-side check did not refuse)"
                text = (f"packing wrote outside its {capacity}-byte buffer{why} "
                        f"(seq_lens {list(batch.seq_lens)}, d {rc.d}): " + describe_all(violations))
                if capacity == total:
                    fail_overrun("packed-mask", text, violations, writer=PACKER)
                fail("packed-mask", text, effect="unsound", writer="host-side check", buffer="packed_mask",
                     cell="admitted an overflow")
            if capacity < total:
                if view is not None:
                    fail("packed-mask", f"the host-side check let a {total}-byte packed mask into a "
                                         f"{capacity}-byte buffer without refusing",
                         effect="unsound", writer="host-side check", buffer="packed_mask",
                         cell="admitted an overflow")
                continue
            # The plan's arrays first: a wrong kv_indptr also misplaces the packing, and is the cause.
            judged = judge_plan(view, rc, batch, oracle)
            obs.classes.add("flashinfer plan: " + ("judged" if judged else "not driven by this target"))
            if judged:
                sub_check_done(obs, "flashinfer plan")
            else:
                sub_check_skipped(obs, "flashinfer plan", "this target builds no FlashInfer plan")
            diff = _packed_mismatch(view, rc, batch, starts, rows, writer_ok)
            if diff:
                fail("packed-mask", diff, writer=PACKER)
            sub_check_done(obs, "packing")
    return obs
