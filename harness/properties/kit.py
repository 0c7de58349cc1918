"""The public kit every property check is written with.

A check takes a target, a config and the batches of one case and either returns
an ``Observation`` (which boundary classes the case hit, how close it came to
overflowing) or raises ``PropertyFailure``. The search, the pytest suite and
``vmfuzz replay`` all call the same checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.guard.shadow import ShadowHeap, describe_all
from harness.model.config import Batch, Config
from harness.model.layouts import logical_size, request_at
from harness.model.outputs import StepOutput
from harness.model.trees import has_detached, trees_of


class PropertyFailure(AssertionError):
    """The target misbehaved: ``prop`` names the property, ``detail`` what it saw."""

    def __init__(self, prop: str, detail: str):
        super().__init__(f"{prop}: {detail}")
        self.prop = prop
        self.detail = detail


@dataclass
class Observation:
    """What a case that held showed: the boundary classes it reached, how close it came to overflowing."""

    classes: set[str] = field(default_factory=set)
    margin: float = float("-inf")  # cells the case needs beyond the buffer it writes (>0: overflow)
    #: the same, per path its steps took: reuse / fallback / arithmetic (no verify step).
    #: A fallback step needing more than the preallocated buffer is the design working.
    path_margins: dict[str, float] = field(default_factory=dict)
    #: judged on a shared run: the classes of the batches each member itself judged
    #: (``classes`` is their union), so no member is credited with another's batches
    by_property: dict[str, set[str]] = field(default_factory=dict)

    def add_step(self, config: Config, batch: Batch, out: StepOutput | None, capacity: int,
                 synthetic: str | None = None) -> None:
        """Record one judged batch. ``synthetic``: the batch was made up by the check
        (its sequence lengths say so), so only its size and the config are real."""
        bs, m = batch.bs, config.max_bs
        self.classes.add("bs " + ("< max_bs" if bs < m else "= max_bs" if bs == m else
                                  "= max_bs+1" if bs == m + 1 else "> max_bs+1"))
        self.classes.add(f"layout {config.mode.name}" + ("" if config.is_read else " (unread)"))
        self.classes.add(f"call site {config.call_site}")
        if out is not None:
            self.classes.add("path reuse" if out.reused else "path fallback")
        if synthetic is not None:
            self.classes.add(f"synthetic: {synthetic}")
        elif 0 in batch.seq_lens:
            self.classes.add("seq_len 0")
        if synthetic is None and config.max_context_len in batch.seq_lens:
            self.classes.add("seq_len = max_context_len")
        if synthetic is None and not config.trivial and batch.trees is not None and any(
                has_detached(t, config.topk) for t in trees_of(config, batch)):
            self.classes.add("tree with unselected parent")
        need = logical_size(config.mode, batch.seq_lens, config.d)
        self.margin = max(self.margin, float(need - capacity))
        path = "arithmetic" if out is None else ("reuse" if out.reused else "fallback")
        self.path_margins[path] = max(self.path_margins.get(path, float("-inf")), float(need - capacity))


def fail(prop: str, detail: str):
    """Raise the finding ``prop`` failed with ``detail`` (one line a person reads)."""
    raise PropertyFailure(prop, detail)


def locator(config: Config, batch: Batch):
    """``locate(buffer, offset) -> request``: names the request a stray write belongs to."""
    def locate(buffer: str, offset: int):
        if buffer != "tree_mask":
            return offset // config.d if offset >= 0 else None
        return request_at(config.mode, batch.seq_lens, config.d, offset)
    return locate


def fill_stale(buffer: torch.Tensor, salt: int = 0) -> None:
    """Leave cells as a previous step would: a mix of True and False, never the canary.

    A reused buffer pre-loaded with the canary would hide a kernel that skips
    cells; stale content shows it. ``salt`` makes buffers that must not be
    confused with each other (one per router child) hold different leftovers.
    """
    n = buffer.numel()
    pattern = ((torch.arange(n, device=buffer.device) + 3 * salt) * 7 % 5) < 2
    buffer.copy_(pattern.view(buffer.shape))


def reused_mask(target, config: Config, device):
    """A fresh heap and a verify mask on it, holding what an earlier step left behind."""
    heap = ShadowHeap(device)
    mask = target.allocate(config, heap)
    fill_stale(mask.buffer)
    return heap, mask


def guarded_step(prop: str, target, mask, config: Config, batch: Batch, heap: ShadowHeap) -> StepOutput:
    """One verify step through the target's call site; a redzone touched fails ``prop``."""
    out = target.verify(mask, config, batch, heap)
    violations = heap.check(locator(config, batch))
    if violations:
        path = "reused buffer" if out.reused else "fallback allocation"
        fail(prop, f"out-of-bounds write on the {path} (bs {batch.bs}, max_bs {config.max_bs}): "
                    + describe_all(violations))
    return out.as_cpu()


def first_difference(what: str, a: StepOutput, b, config: Config, batch: Batch, compared: torch.Tensor) -> str | None:
    """First difference between two step outputs over the batch's logical region."""
    n = compared.numel()
    ma = a.tree_mask.reshape(-1)
    if ma.numel() < n:
        return (f"{what}: tree_mask holds {ma.numel()} cells, the batch's logical region needs {n} "
                f"({config.mode.name}, bs {batch.bs}, seq_lens {list(batch.seq_lens)})")
    raw_a = ma[:n].view(torch.uint8)
    raw_b = b.tree_mask.reshape(-1)[:n].view(torch.uint8)
    bad = torch.nonzero((raw_a != raw_b) & compared).flatten()
    if bad.numel():
        cell = int(bad[0])
        req = request_at(config.mode, batch.seq_lens, config.d, cell)
        return (f"{what}: tree_mask differs at {bad.numel()} cell(s), first at cell {cell} "
                f"(request {req}): {int(raw_a[cell])} vs {int(raw_b[cell])}")
    for name in ("positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling"):
        x, y = getattr(a, name).reshape(-1).cpu(), getattr(b, name).reshape(-1).cpu()
        if x.shape != y.shape or not torch.equal(x, y):
            idx = int(torch.nonzero(x != y).flatten()[0]) if x.shape == y.shape else -1
            return f"{what}: {name} differs" + (f" at {idx}: {int(x[idx])} vs {int(y[idx])}" if idx >= 0 else
                                                f" in shape: {tuple(x.shape)} vs {tuple(y.shape)}")
    return None


def capacity_of(mask) -> int:
    """Cells of a preallocated mask's buffer (0: no mask, every step falls back)."""
    return mask.buffer.numel() if mask is not None else 0


def known_as(target, prop: str, detail: str) -> str | None:
    """The known finding (``known/``) this failure is, if the run attached one to the target.

    A property calls it where a known defect can show, instead of ``fail``:
    the defect is recorded as a class and the property goes on checking the
    rest of the case, so a new defect of the same kind is still a finding.
    """
    for known in getattr(target, "known_findings", ()) or ():
        if known.matches(prop, detail):
            return known.name
    return None
