"""What every property check shares, and the core checks that run alone.

A check takes a target, a config and the batches of one case and either returns
an ``Observation`` (which boundary classes the case hit, how close it came to
overflowing) or raises ``PropertyFailure``. The campaign, the pytest suite and
``vmfuzz replay`` all call the same checks.

Of DESIGN.md section 2's seven, the capacity arithmetic (soundness, liveness)
and the trivial path are here; the four that launch the kernel through the call
site (no-oob-write, fallback-equivalence, reference-agreement,
multi-step-reuse) are judged on one shared run of a case in ``shared``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.config import Batch, Config
from harness.layouts import logical_size, request_at, worst_case_size
from harness.oracle import expected
from harness.outputs import StepOutput
from harness.shadow import ShadowHeap, describe_all
from harness.trees import has_detached, trees_of


class PropertyFailure(AssertionError):
    def __init__(self, prop: str, detail: str):
        super().__init__(f"{prop}: {detail}")
        self.prop = prop
        self.detail = detail


@dataclass
class Observation:
    classes: set[str] = field(default_factory=set)
    margin: float = float("-inf")  # cells the case needs beyond the buffer it writes (>0: overflow)
    #: the same, per path its steps took: reuse / fallback / arithmetic (no verify step).
    #: A fallback step needing more than the preallocated buffer is the design working.
    path_margins: dict[str, float] = field(default_factory=dict)

    def add_step(self, config: Config, batch: Batch, out: StepOutput | None, capacity: int) -> None:
        bs, m = batch.bs, config.max_bs
        self.classes.add("bs " + ("< max_bs" if bs < m else "= max_bs" if bs == m else
                                  "= max_bs+1" if bs == m + 1 else "> max_bs+1"))
        self.classes.add(f"layout {config.mode.name}" + ("" if config.is_read else " (unread)"))
        self.classes.add(f"call site {config.call_site}")
        if out is not None:
            self.classes.add("path reuse" if out.reused else "path fallback")
        if 0 in batch.seq_lens:
            self.classes.add("seq_len 0")
        if config.max_context_len in batch.seq_lens:
            self.classes.add("seq_len = max_context_len")
        if not config.trivial and batch.trees is not None and any(
                has_detached(t, config.topk) for t in trees_of(config, batch)):
            self.classes.add("tree with unselected parent")
        need = logical_size(config.mode, batch.seq_lens, config.d)
        self.margin = max(self.margin, float(need - capacity))
        path = "arithmetic" if out is None else ("reuse" if out.reused else "fallback")
        self.path_margins[path] = max(self.path_margins.get(path, float("-inf")), float(need - capacity))


def _fail(prop: str, detail: str):
    raise PropertyFailure(prop, detail)


def _locator(config: Config, batch: Batch):
    def locate(buffer: str, offset: int):
        if buffer != "tree_mask":
            return offset // config.d if offset >= 0 else None
        return request_at(config.mode, batch.seq_lens, config.d, offset)
    return locate


def _stale(buffer: torch.Tensor) -> None:
    """Leave cells as a previous step would: a mix of True and False, never the canary."""
    n = buffer.numel()
    pattern = (torch.arange(n, device=buffer.device) * 7 % 5) < 2
    buffer.copy_(pattern.view(buffer.shape))


def _reused_mask(target, config: Config, device):
    """A fresh heap and a verify mask on it, holding what an earlier step left behind."""
    heap = ShadowHeap(device)
    mask = target.allocate(config, heap)
    _stale(mask.buffer)
    return heap, mask


def _step(prop: str, target, mask, config: Config, batch: Batch, heap: ShadowHeap) -> StepOutput:
    out = target.verify(mask, config, batch, heap)
    violations = heap.check(_locator(config, batch))
    if violations:
        path = "reused buffer" if out.reused else "fallback allocation"
        _fail(prop, f"out-of-bounds write on the {path} (bs {batch.bs}, max_bs {config.max_bs}): "
                    + describe_all(violations))
    return out.as_cpu()


def _diff(what: str, a: StepOutput, b, config: Config, batch: Batch, compared: torch.Tensor) -> str | None:
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


def _capacity(mask) -> int:
    return mask.buffer.numel() if mask is not None else 0


# -- the properties ------------------------------------------------------------




def capacity_soundness(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
    obs = Observation()
    mask = target.allocate(config, None)
    cap = _capacity(mask)
    for batch in batches:
        obs.add_step(config, Batch((config.max_context_len,) * batch.bs), None, cap)
        if target.fits(mask, batch.bs):
            worst = worst_case_size(mask.mode, batch.bs, config.d, config.max_context_len)
            if worst > cap:
                _fail("capacity-soundness",
                      f"fits({batch.bs}) is True for a {cap}-cell {mask.mode.name} buffer (max_bs {config.max_bs}), "
                      f"but {batch.bs} requests at max_context_len {config.max_context_len} need {worst} cells")
    return obs


def capacity_liveness(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
    obs = Observation()
    mask = target.allocate(config, None)
    for batch in batches:
        obs.add_step(config, batch, None, _capacity(mask))
        if batch.bs <= config.max_bs and not target.fits(mask, batch.bs):
            _fail("capacity-liveness", f"fits({batch.bs}) is False although bs <= max_bs {config.max_bs}: "
                                       "every such step would silently fall back and allocate")
    return obs



def trivial_path(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
    obs = Observation()
    for batch in batches:
        want = expected(config, batch)
        heap, mask = _reused_mask(target, config, device)
        reuse = _step("trivial-path", target, mask, config, batch, heap)
        fallback = _step("trivial-path", target, None, config, batch, heap)
        obs.add_step(config, batch, reuse, _capacity(mask))
        for diff in (_diff("reuse vs fallback", reuse, fallback, config, batch, want.compared),
                     _diff("reuse vs oracle", reuse, want, config, batch, want.compared)):
            if diff:
                _fail("trivial-path", diff)
    return obs
