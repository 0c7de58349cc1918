"""packed-mask's other half: what FlashInfer's verify plan is handed, judged against the meaning.

The packed bits are only found where the plan's arrays say: request b's d
query rows at ``qo_indptr[b]``, its s_b + d KV tokens (the prefix and the draft
tokens) at ``kv_indptr[b]``, their slots in ``kv_indices``, each page one token
long. What each must hold comes from seq_lens, d and bs alone
(``vmfuzz.harness.model.readers.expected_plan``), never from the code under test, and
every hop is judged in order, upstream first, so a finding names the function
that first handed on a wrong array.
"""

from __future__ import annotations

import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.readers import ExpectedPlan, PlanRead, expected_plan
from vmfuzz.harness.properties.kit import Difference, fail, fail_overrun
from vmfuzz.harness.guard.shadow import describe_all


def _wanted(plan: ExpectedPlan, batch: Batch, quantity: str) -> list[int]:
    # a window on a server built without one would cut each request's prefix short
    counts = {"total_num_rows": [plan.qo_indptr[-1]], "batch_size": [batch.bs], "page_size": [1],
              "window_left": [-1]}
    return counts[quantity] if quantity in counts else getattr(plan, quantity)


def _read_mismatch(read: PlanRead, want: list[int], where: str) -> Difference | None:
    got = [int(v) for v in read.values.reshape(-1).cpu().tolist()]
    if len(got) != len(want):
        return Difference(f"{read.name} has {len(got)} entries, the batch needs {len(want)} ({where})",
                          buffer=read.name, cell="length")
    if got != want:
        i = next(k for k, (x, y) in enumerate(zip(got, want)) if x != y)
        shown = f"{got}, must be {want}" if len(want) <= 16 else f"entry {i} is {got[i]}, must be {want[i]}"
        return Difference(f"{read.name}: {shown} ({where})", buffer=read.name, cell="value")
    return None


def _mask_mismatch(read: PlanRead, oracle: torch.Tensor, where: str) -> Difference | None:
    """The mask handed on must hold the batch's whole region, cell for cell the oracle's."""
    n = oracle.numel()
    got = read.values.reshape(-1)
    if got.numel() < n:
        return Difference(f"{read.name} holds {got.numel()} cells, the batch's region needs {n}: the packing "
                          f"reads past it ({where})", buffer=read.name, effect="overrun", side="above",
                          cell="read past the mask")
    bad = torch.nonzero(got[:n].view(torch.uint8).cpu() != oracle.reshape(-1).view(torch.uint8).cpu()).flatten()
    if bad.numel():
        return Difference(f"{read.name}: {bad.numel()} of the batch's {n} cells differ from the oracle's, first "
                          f"cell {int(bad[0])} ({where})", buffer=read.name, cell="value")
    return None


def judge_plan(view, config: Config, batch: Batch, oracle: torch.Tensor) -> bool:
    """Fail packed-mask on the first array handed to FlashInfer's plan that is not what the batch means,
    or on a KV gather written past its buffer; False: this target does not drive the plan."""
    if view.plan is None:
        return False
    where = f"seq_lens {list(batch.seq_lens)}, d {config.d}, bs {batch.bs}"
    if view.plan_overruns:
        fail_overrun("packed-mask", f"the KV gather for FlashInfer's plan wrote outside its buffer ({where}): "
                     + describe_all(view.plan_overruns), view.plan_overruns, writer=view.plan_gatherer)
    if view.mask_regrown and view.mask_regrown[0] >= oracle.numel():
        cells_in, cells_on = view.mask_regrown
        # The same reuse-if-it-fits decision as fits(): growing is the fallback for a short mask only.
        fail("packed-mask", f"{view.plan_gatherer} handed FlashInfer's plan a new {cells_on}-cell mask although the "
                            f"{cells_in} cells handed in already cover the batch's {oracle.numel()}-cell region: "
                            f"a copy of the whole mask every verify step ({where})",
             effect="wrong", writer=view.plan_gatherer, buffer="custom_mask", cell="grew a mask that fits")
    want = expected_plan(config, batch)
    for read in view.plan:
        if read.quantity == "custom_mask":
            diff = _mask_mismatch(read, oracle, where)
        else:
            diff = _read_mismatch(read, _wanted(want, batch, read.quantity), where)
        if diff:
            fail("packed-mask", f"handed to FlashInfer's verify plan by {read.writer}: {diff}",
                 **diff.origin_fields(), writer=read.writer)
    return True
