"""Bounds-checked shadow buffers: redzoned allocations with canary bytes.

Every tensor a kernel writes is a view into a larger uint8 allocation whose
front and back redzones hold ``CANARY``. After the kernel ran, any redzone byte
that changed is a write outside the buffer. Bytes are compared raw: a canary
read through a bool view would read True, indistinguishable from a real cell.

A real kernel writes through a pointer, so an out-of-range write lands in
whatever memory follows the buffer. The redzones make that memory ours and
observable; ``run_kernel`` sizes them per call from the cells the call is
expected to write, so an overflow of any plausible reach is caught in the zone
rather than corrupting the process.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from vmfuzz.harness.model.outputs import Violation

CANARY = 0xA5
MIN_REDZONE_BYTES = 64


@dataclass
class _Guarded:
    name: str
    backing: torch.Tensor  # uint8, front redzone + payload + back redzone
    view: torch.Tensor
    front: int  # bytes
    payload: int  # bytes
    #: both redzones as one (2, zone) strided view, and the canary bytes they must equal:
    #: the fast check is one comparison per buffer
    zones: torch.Tensor | None = None
    expect: torch.Tensor | None = None
    raw: torch.Tensor | None = None  # the backing viewed as the payload's dtype (pointer arithmetic)
    addr: tuple[int, int] = (0, 0)  # (view's address, cells): its key in a heap's lookup
    users: int | None = None  # tensors on the backing's storage that this record itself holds

    @property
    def itemsize(self) -> int:
        return self.view.element_size()


def _storage_users(t: torch.Tensor) -> int | None:
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return None
    return use_count(t.untyped_storage()._cdata) - 1  # minus the temporary storage object itself


class BackingPool:
    """Redzoned backings handed back by released heaps, reused by later allocations.

    Every verify step allocates the same handful of shapes, and building a
    backing (allocate, fill with the canary, cut four views) costs as much as
    the small kernel it guards. A backing is pooled only when its redzones are
    intact (checked on release) and nothing outside the pool still views it,
    so a reused one starts exactly as a fresh one: canary in both zones.
    """

    MAX_PER_KEY = 16
    #: pooled bytes at most: shapes vary case by case over a long run, so the
    #: least recently used shapes are dropped past this
    MAX_BYTES = 256 << 20

    def __init__(self):
        self.free: OrderedDict[tuple, list[_Guarded]] = OrderedDict()
        self.bytes = 0
        self.canaries: dict[torch.device, torch.Tensor] = {}

    def canary(self, device: torch.device, n: int) -> torch.Tensor:
        c = self.canaries.get(device)
        if c is None or c.numel() < n:
            c = torch.full((max(n, 4096),), CANARY, dtype=torch.uint8, device=device)
            self.canaries[device] = c
        return c[:n]

    def take(self, key: tuple) -> _Guarded | None:
        stack = self.free.get(key)
        if not stack:
            return None
        g = stack.pop()
        self.bytes -= g.backing.numel()
        return g

    def give(self, key: tuple, g: _Guarded, verified: bool) -> None:
        stack = self.free.setdefault(key, [])
        if len(stack) >= self.MAX_PER_KEY:
            return
        # Only this record's own tensors on the storage, and the handed-out view
        # itself referenced only by the record (and getrefcount's argument).
        users = _storage_users(g.backing)
        if users is None or users != g.users or sys.getrefcount(g.view) > 2:
            return  # someone still holds a view of it: never hand it out again
        # ``verified``: the heap's last check found every zone intact and nothing wrote since.
        if not verified and not torch.equal(g.zones, g.expect):
            return  # an overrun buffer is not reused
        stack.append(g)
        self.free.move_to_end(key)
        self.bytes += g.backing.numel()
        while self.bytes > self.MAX_BYTES and self.free:
            _, dropped = self.free.popitem(last=False)
            self.bytes -= sum(d.backing.numel() for d in dropped)


#: one pool per process: a pooled backing starts exactly as a fresh one, so a second run
#: in the same process sees no trace of the first
BACKING_POOL = BackingPool()


class ShadowHeap:
    """Allocator and checker for the buffers of one verify step.

    With ``guard=False`` it hands out plain tensors: the same code path, minus the
    redzones, so the guard's overhead can be measured against it. ``release()``
    hands the heap's backings to a process-wide pool for the next heap; call it
    only when no view of them (a mask, an output) is used any more.
    """

    def __init__(self, device: str | torch.device = "cpu", guard: bool = True):
        self.device = torch.device(device)
        self.guard = guard
        self._live: list[_Guarded] = []
        self._keys: list[tuple] = []
        self._by_address: dict[tuple[int, int], _Guarded] = {}
        self.beyond: list[Violation] = []
        self._verified = True  # no write since the last clean check (allocation never writes a zone)
        self._pool_key = (str(self.device), guard)

    # -- allocation ---------------------------------------------------------
    def alloc(self, name: str, shape: int | tuple[int, ...], dtype: torch.dtype,
              fill: bool | int | None = None, redzone_cells: int = 0) -> torch.Tensor:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        numel = 1
        for n in shape:
            numel *= n
        if not self.guard:
            t = torch.empty(shape, dtype=dtype, device=self.device)
        else:
            itemsize = dtype.itemsize
            zone = max(MIN_REDZONE_BYTES, redzone_cells * itemsize)
            zone += (-zone) % itemsize
            payload = numel * itemsize
            key = (self._pool_key, dtype, shape, zone)
            g = BACKING_POOL.take(key)
            if g is None:
                backing = torch.full((zone + payload + zone,), CANARY, dtype=torch.uint8, device=self.device)
                t = backing[zone:zone + payload].view(dtype).view(shape)
                g = _Guarded(name, backing, t, zone, payload,
                             backing.as_strided((2, zone), (zone + payload, 1)),
                             BACKING_POOL.canary(self.device, 2 * zone).view(2, zone), backing.view(dtype),
                             (t.data_ptr(), numel))
                g.users = _storage_users(backing)
            else:
                g.name, t = name, g.view
            self._live.append(g)
            self._keys.append(key)
            # Live backings keep their addresses, so (address, cells) names one view.
            self._by_address[g.addr] = g
        if fill is None:
            t.zero_()
        else:
            t.fill_(fill)
        return t

    def adopt(self, name: str, tensor: torch.Tensor, redzone_cells: int) -> torch.Tensor:
        """A guarded copy of ``tensor`` (same shape, dtype and content)."""
        copy = self.alloc(name, tuple(tensor.shape), tensor.dtype, redzone_cells=redzone_cells)
        copy.copy_(tensor)
        return copy

    def _find(self, tensor: torch.Tensor) -> _Guarded | None:
        return self._by_address.get((tensor.data_ptr(), tensor.numel()))

    def backing_of(self, tensor: torch.Tensor) -> tuple[torch.Tensor, int, str] | None:
        """The raw allocation under a guarded view, the view's first cell in it, its name."""
        g = self._find(tensor)
        if g is None:
            return None
        raw = g.raw if g.raw.dtype == tensor.dtype else g.backing.view(tensor.dtype)
        return raw, g.front // g.itemsize, g.name

    # -- checking ------------------------------------------------------------
    def check(self, locate: Callable[[str, int], int | None] | None = None) -> list[Violation]:
        found = list(self.beyond)
        clean = not found
        for g in self._live:
            # Fast path: both redzones still equal the canary (one op); the
            # byte-level scan below runs only for a buffer that was overrun.
            if torch.equal(g.zones, g.expect):
                continue
            clean = False
            b = g.backing
            bad = torch.nonzero(b != CANARY).flatten()
            if bad.numel() == 0:
                continue
            inside = (bad >= g.front) & (bad < g.front + g.payload)
            bad = bad[~inside]
            if bad.numel() == 0:
                continue
            cells = torch.div(bad - g.front, g.itemsize, rounding_mode="floor")
            for side, sel in (("front", cells < 0), ("back", cells >= 0)):
                part = torch.unique(cells[sel])
                if part.numel() == 0:
                    continue
                lo, hi = int(part.min()), int(part.max()) + 1
                request = locate(g.name, lo) if locate else None
                last = locate(g.name, hi - 1) if locate and hi - 1 != lo else request
                found.append(Violation(g.name, side, lo, hi, int(part.numel()), g.view.numel(), request, last))
        self._verified = clean
        return found

    def release(self, keep: int = 0) -> None:
        """Drop every allocation after the first ``keep`` (all by default), pooling their backings."""
        for g, key in zip(self._live[keep:], self._keys[keep:]):
            self._by_address.pop(g.addr, None)
            BACKING_POOL.give(key, g, self._verified)
        del self._live[keep:], self._keys[keep:]
        if keep == 0:
            self._by_address.clear()
            self.beyond.clear()

    # -- the kernel entry ---------------------------------------------------
    def store(self, tensor: torch.Tensor, index: torch.Tensor, values: torch.Tensor | bool | int) -> None:
        """Write ``values`` at flat cell ``index`` relative to ``tensor``'s first cell.

        This is a pointer write: indices past the view land in its redzones, as
        they would in the memory after a real buffer. Past the redzones too, the
        write is dropped and recorded as a ``beyond`` violation.
        """
        self._verified = False
        located = self.backing_of(tensor) if self.guard else None
        if located is None:
            tensor.view(-1)[index] = values
            return
        raw, first, name = located
        pos = index + first
        # One reduction for the common in-range case; the mask only when it is not.
        lo, hi = (int(v) for v in torch.aminmax(pos)) if pos.numel() else (0, 0)
        if lo < 0 or hi >= raw.numel():
            ok = (pos >= 0) & (pos < raw.numel())
            out = index[~ok]
            self.beyond.append(Violation(name, "beyond",
                                         int(out.min()), int(out.max()) + 1, int(out.numel()), tensor.numel()))
            pos = pos[ok]
            if isinstance(values, torch.Tensor) and values.dim() > 0:
                values = values[ok]
        raw[pos] = values

    def run_kernel(self, kernel: Callable, tensors: dict[str, torch.Tensor],
                   reach: dict[str, int]) -> dict[str, torch.Tensor]:
        """Give ``kernel`` guarded stand-ins for ``tensors`` and copy results back.

        ``reach[name]`` is how many cells past the view's end (and before its
        start) a write may plausibly land; each stand-in gets redzones that wide.
        A tensor that already is a guarded view with enough redzone is used in
        place, so a reused buffer keeps its identity.
        """
        if not self.guard:
            kernel(tensors)
            return tensors
        self._verified = False  # a foreign kernel writes through pointers, not store()
        standins = {}
        for name, t in tensors.items():
            g = self._find(t)
            if g is not None and g.front >= reach[name] * g.itemsize:
                standins[name] = t
            else:
                standins[name] = self.adopt(name, t, reach[name])
        kernel(standins)
        for name, t in tensors.items():
            if standins[name] is not t:
                t.copy_(standins[name])
        return standins


def describe_all(violations: Iterable[Violation]) -> str:
    return "; ".join(v.describe() for v in violations)
