"""The public kit every property check is written with.

A check takes a target, a config and the batches of one case and either returns
an ``Observation`` (which boundary classes the case hit, how close it came to
overflowing) or raises ``PropertyFailure``. The search, the pytest suite and
``vmfuzz replay`` all call the same checks.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from vmfuzz.harness.guard.shadow import ShadowHeap, describe_all
from vmfuzz.harness.model.allocation import AllocatorChose
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode, block_start, logical_size, request_at, row_stride
from vmfuzz.harness.model.origin import ALLOCATOR, BEYOND_CAPACITY, WITHIN_CAPACITY, Origin, Part
from vmfuzz.harness.model.outputs import StepOutput
from vmfuzz.harness.model.trees import has_detached, trees_of


class PropertyFailure(AssertionError):
    """The target misbehaved: ``origin`` says which failure it is (typed), ``detail`` what it saw (words)."""

    def __init__(self, origin: Origin, detail: str):
        super().__init__(f"{origin.property}: {detail}")
        self.origin = origin
        self.detail = detail

    @property
    def prop(self) -> str:
        return self.origin.property

    def __reduce__(self):  # crosses a worker's pipe with its origin
        return (PropertyFailure, (self.origin, self.detail))


class Difference(str):
    """A first difference between two outputs: the sentence, and the typed facts of it.

    ``buffer``: which output; ``effect``: ``wrong`` (a cell differs) or ``overrun``
    (the output is too small for the batch's region); ``cell``: the cell class;
    ``also``: the other outputs that differ too (the origin's other causes).
    """

    def __new__(cls, text: str, *, buffer: str, effect: str = "wrong", cell: str = "", side: str = "",
                also: tuple[Part, ...] = ()):
        self = super().__new__(cls, text)
        self.buffer, self.effect, self.cell, self.side, self.also = buffer, effect, cell, side, also
        return self

    def __reduce__(self):
        return (_difference, (str(self), self.buffer, self.effect, self.cell, self.side, self.also))

    def origin_fields(self) -> dict:
        also = {"also": self.also} if self.also else {}
        return {"effect": self.effect, "buffer": self.buffer, "cell": self.cell, "side": self.side, **also}


def _difference(text, buffer, effect, cell, side, also=()):
    return Difference(text, buffer=buffer, effect=effect, cell=cell, side=side, also=also)


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


def fail(prop: str, detail: str, **origin):
    """Raise the finding ``prop`` failed with: ``detail`` is one line a person reads, ``origin``
    the typed fields of ``vmfuzz.harness.model.origin.Origin`` that say which failure it is.

    A ``Difference`` (from ``first_difference``) brings its own buffer, effect and cell.
    """
    fields = detail.origin_fields() if isinstance(detail, Difference) else {}
    fields.update(origin)
    if "effect" not in fields:
        raise TypeError(f"fail({prop!r}, ...) needs the failure's effect (vmfuzz.harness.model.origin.EFFECTS)")
    raise PropertyFailure(Origin(prop, **fields), str(detail))


def fail_overrun(prop: str, detail: str, violations, *, writer: str, capacity_bs: int | None = None,
                 **where):
    """Raise an out-of-bounds write, naming every cause it shows: each violated buffer and side,
    and for each the requests its stray cells belong to, which say whether the buffer was too small
    for the batch (a request past ``capacity_bs``) or the writer misplaced a request it was sized
    for. The first escaped cell's is the origin's first cause; the others are its ``also``."""
    causes = {}
    for v in violations:
        side = "below" if v.side == "front" else "above"
        requests = [r for r in (v.request, v.last_request) if r is not None] if capacity_bs is not None else []
        for cell in [BEYOND_CAPACITY if r >= capacity_bs else WITHIN_CAPACITY for r in requests] or [""]:
            causes.setdefault((v.buffer, side, cell), None)
    # a write past the redzone names no request: it adds no cause where its buffer's side has one
    named = {(b, s) for b, s, c in causes if c}
    (buffer, side, cell), *more = [k for k in causes if k[2] or k[:2] not in named]
    fail(prop, detail, effect="overrun", writer=writer, buffer=buffer, side=side, cell=cell,
         also=tuple(Part("overrun", b, s, c) for b, s, c in more), **where)


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


def allocated(prop: str, target, config: Config, heap: ShadowHeap | None):
    """The target's verify mask for ``config``; SGLang's allocator choosing no mask, or
    another layout than the server's, fails ``prop`` (the harness builds none in its place)."""
    try:
        return target.allocate(config, heap)
    except AllocatorChose as chose:
        fail(prop, f"{chose}: the call site would verify against a layout the reader does not expect"
                   if chose.got else f"{chose}: every verify step falls back and allocates",
             effect="unsound", writer=ALLOCATOR, buffer="tree_mask",
             cell="another layout" if chose.got else "no mask")


def reused_mask(target, config: Config, device, prop: str):
    """A fresh heap and a verify mask on it, holding what an earlier step left behind."""
    heap = ShadowHeap(device)
    mask = allocated(prop, target, config, heap)
    fill_stale(mask.buffer)
    return heap, mask


def guarded_step(prop: str, target, mask, config: Config, batch: Batch, heap: ShadowHeap) -> StepOutput:
    """One verify step through the target's call site; a redzone touched fails ``prop``."""
    out = target.verify(mask, config, batch, heap)
    violations = heap.check(locator(config, batch))
    if violations:
        path = "reused buffer" if out.reused else "fallback allocation"
        fail_overrun(prop, f"out-of-bounds write on the {path} (bs {batch.bs}, max_bs {config.max_bs}): "
                     + describe_all(violations), violations, writer=VERIFY_STEP,
                     capacity_bs=config.max_bs if out.reused else batch.bs)
    return out.as_cpu()


#: the writer of a verify step's outputs: the call site with the kernel it launches
VERIFY_STEP = "verify step"
OUTPUT_FIELDS = ("positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling")


def mask_cell_class(config: Config, batch: Batch, cell: int, want: int) -> str:
    """What kind of cell ``cell`` of the batch's tree mask is, in the layout's meaning."""
    if cell >= logical_size(config.mode, batch.seq_lens, config.d):
        return "padding past the batch's region"
    prefix = 0
    for b, s in enumerate(batch.seq_lens):
        start = block_start(config.mode, prefix, b, config.d)
        stride = row_stride(config.mode, s, config.d)
        if start <= cell < start + config.d * stride:
            if config.mode == TreeMaskMode.FULL_MASK and (cell - start) % stride < s:
                return "prefix column"
            return "tree cell that should be " + ("visible" if want else "hidden")
        prefix += s
    return "padding past the batch's region"


def first_difference(what: str, a: StepOutput, b, config: Config, batch: Batch,
                     compared: torch.Tensor) -> Difference | None:
    """The differences between two step outputs over the batch's logical region: the first one,
    carrying every other differing output as its ``also``; both sides' lengths are checked, so an
    output too short on either side is an overrun, never a raise."""
    first, *rest = list(_differences(what, a, b, config, batch, compared)) or [None]
    if not rest:
        return first
    more = "; ".join(str(d).removeprefix(f"{what}: ") for d in rest)
    return Difference(f"{first}; also {more}", buffer=first.buffer, effect=first.effect, cell=first.cell,
                      side=first.side, also=tuple(Part(d.effect, d.buffer, d.side, d.cell) for d in rest))


def _differences(what: str, a: StepOutput, b, config: Config, batch: Batch, compared: torch.Tensor):
    """Each differing output, the tree mask first, each once (at its first differing cell)."""
    n = compared.numel()
    short = [(side, m) for side, m in (("first", a.tree_mask.reshape(-1).numel()),
                                        ("second", b.tree_mask.reshape(-1).numel())) if m < n]
    if short:
        side, m = short[0]
        yield Difference(f"{what}: tree_mask ({side} side) holds {m} cells, the batch's logical region needs "
                         f"{n} ({config.mode.name}, bs {batch.bs}, seq_lens {list(batch.seq_lens)})",
                         buffer="tree_mask", effect="overrun", side="above", cell=BEYOND_CAPACITY)
    else:
        raw_a = a.tree_mask.reshape(-1)[:n].view(torch.uint8)
        raw_b = b.tree_mask.reshape(-1)[:n].view(torch.uint8)
        bad = torch.nonzero((raw_a != raw_b) & compared).flatten()
        if bad.numel():
            cell = int(bad[0])
            req = request_at(config.mode, batch.seq_lens, config.d, cell)
            yield Difference(f"{what}: tree_mask differs at {bad.numel()} cell(s), first at cell {cell} "
                             f"(request {req}): {int(raw_a[cell])} vs {int(raw_b[cell])}", buffer="tree_mask",
                             cell=mask_cell_class(config, batch, cell, int(raw_b[cell])))
    for name in OUTPUT_FIELDS:
        x, y = getattr(a, name).reshape(-1).cpu(), getattr(b, name).reshape(-1).cpu()
        if x.shape != y.shape:
            yield Difference(f"{what}: {name} differs in shape: {tuple(x.shape)} vs {tuple(y.shape)}",
                             buffer=name, cell="length")
        elif not torch.equal(x, y):
            idx = int(torch.nonzero(x != y).flatten()[0])
            yield Difference(f"{what}: {name} differs at {idx}: {int(x[idx])} vs {int(y[idx])}", buffer=name,
                             cell="value")
    token = _draft_token_difference(what, a, b)
    if token is not None:
        yield token


def _draft_token_difference(what: str, a, b) -> Difference | None:
    """The verify input's tokens, node by node; judged only where both sides report them
    (a plug-in target, or the chain writer's own output, may not)."""
    x, y = getattr(a, "draft_token", None), getattr(b, "draft_token", None)
    if x is None or y is None:
        return None
    x, y = x.reshape(-1).cpu().long(), y.reshape(-1).cpu().long()
    if x.shape != y.shape:
        return Difference(f"{what}: draft_token differs in shape: {tuple(x.shape)} vs {tuple(y.shape)}",
                          buffer="draft_token", cell="length")
    if not torch.equal(x, y):
        idx = int(torch.nonzero(x != y).flatten()[0])
        return Difference(f"{what}: draft_token differs at node {idx}: token {int(x[idx])} vs {int(y[idx])}",
                          buffer="draft_token", cell="value")
    return None


def capacity_of(mask) -> int:
    """Cells of a preallocated mask's buffer (0: no mask, every step falls back)."""
    return mask.buffer.numel() if mask is not None else 0


def known_as(target, origin: Origin) -> str | None:
    """The known finding (``known/``) this failure is, if the run attached one to the target.

    A property calls it where a known defect can show, instead of ``fail``:
    the defect is recorded as a class and the property goes on checking the
    rest of the case, so a new defect of the same kind is still a finding.
    Matched on the origin's fields, never on the message.
    """
    for known in getattr(target, "known_findings", ()) or ():
        if known.matches(origin):
            return known.name
    return None


@contextlib.contextmanager
def known_goes_on(target, obs: Observation, label: str):
    """One part of a case (a router, a sub-check) judged so that a failure a known entry names ends
    only that part: it is recorded as the class ``LABEL: known finding NAME`` and the check goes on
    with the rest of the case, so a new defect elsewhere in it is still a finding (a raise there would
    pass the whole case over)."""
    met = KnownMet()
    try:
        yield met
    except PropertyFailure as exc:
        known = known_as(target, exc.origin)
        if known is None:
            raise
        obs.classes.add(f"{label}: known finding {known}")
        met.name = known


@dataclass
class KnownMet:
    """What ``known_goes_on`` yields: after the block, the known entry it ended on, or None; a later
    part that depends on this one's result reads it and is not judged on a known defect's output."""

    name: str | None = None


# -- the ledger of promised sub-checks ----------------------------------------------

#: A sub-check's entry among an observation's classes. Classes already travel from every
#: worker, shard and saved run to the reports, so the ledger rides on them.
SUB_CHECK = "sub-check "
DONE = "done"


def sub_check_done(obs: Observation, name: str) -> None:
    """``name`` was judged on this case."""
    obs.classes.add(f"{SUB_CHECK}{name}: {DONE}")


def sub_check_skipped(obs: Observation, name: str, why: str) -> None:
    """``name`` could not be judged on this case, and why (a reader that produced nothing to judge)."""
    obs.classes.add(f"{SUB_CHECK}{name}: not driven ({why})")


#: A sub-check whose SGLang code the release under test does not hold at all: nothing there for it to
#: judge, so it is no promise on that release (``sub_check_absent``), said in the ledger, never a gap.
ABSENT = "absent from this SGLang"


def sub_check_absent(obs: Observation, name: str, why: str) -> None:
    """``name`` judges code this SGLang does not have (none of it: a release that has part of it has a
    sub-check vmfuzz could not make, ``sub_check_skipped``), and why: not a promise here."""
    obs.classes.add(f"{SUB_CHECK}{name}: {ABSENT} ({why})")


def ledger(promises: tuple[str, ...], classes) -> dict[str, str]:
    """Each promised sub-check -> "done" if any case judged it, else why none did.

    A promise no case mentions is "never reached": the property ran no case that gets that far.
    """
    out = {}
    for name in promises:
        head = f"{SUB_CHECK}{name}: "
        said = sorted(c[len(head):] for c in classes if c.startswith(head))
        out[name] = DONE if DONE in said else ("; ".join(said) if said else "not driven (never reached)")
    return out


def gaps(entries: dict[str, str]) -> dict[str, str]:
    """The entries of a ledger that leave a promise unkept: every one not done, except a sub-check some
    case found absent from the code under test (absence is the release's, read from its code, so a case
    the property passed over whole, which says "not driven" for every sub-check, does not bring it back),
    and only while some other sub-check was done (a property that judged nothing never held, whatever is
    absent)."""
    judged_some = DONE in entries.values()
    return {k: v for k, v in entries.items()
            if v != DONE and not (judged_some and (v.startswith(ABSENT) or f"; {ABSENT}" in v))}
