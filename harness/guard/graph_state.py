"""What a captured graph keeps of the host state its body reads, and what a replay read of it.

A CUDA graph bakes every host decision of its capture run. The stand-in
(``graph``) re-runs the body instead, so it must put that host state back:
``snapshot`` takes, after the capture run, every value the body can reach
through its closure (free variables; a plain object's fields, ``DEPTH`` deep),
numbers by value and tensors by identity (address, shape, strides, dtype);
``described`` is that record, structural for plain objects so a new object
holding the same tensors and numbers is no change. ``ReadLog`` notes which
fields of a watched object a replay read, by swapping the object's class for a
recording subclass for the replay's duration (an object whose class cannot be
swapped is noted as untracked: its changes are kept, its reads unknown).
``reachable_contents`` / ``put_back`` copy and restore the contents of every
tensor a body reaches the same way, for a capture that must leave memory as it
found it (a device's capture runs nothing).
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

#: host values recorded by value; anything else is recorded by identity
_SCALARS = (bool, int, float, str, bytes, type(None), torch.dtype, torch.device)
#: objects never looked into: code, modules, classes, the stand-in's own, and tensors (by identity)
_OPAQUE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           torch.Tensor, contextlib.AbstractContextManager)
#: how far into an object graph a snapshot goes (closure -> field -> field)
DEPTH = 2


def described(value, depth: int = DEPTH, memo: dict | None = None) -> Any:
    """What a graph keeps of a host value: a number by value, a tensor by identity (address, shape,
    strides, dtype), a plain object by what it holds (``depth`` deep: a new object holding the same
    tensors and numbers is the same to a graph), anything else by its id.

    ``memo``: descriptions already made in one pass over state nothing changes during it (a
    snapshot describes each object once per depth, not once per path that reaches it)."""
    if isinstance(value, _SCALARS):
        return value
    if memo is not None:
        key = (id(value), depth)
        got = memo.get(key)
        if got is None:
            got = memo[key] = _described(value, depth, memo)
        return got
    return _described(value, depth, None)


def _described(value, depth: int, memo: dict | None) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", value.data_ptr(), tuple(value.shape), tuple(value.stride()), value.dtype)
    if isinstance(value, (tuple, list)) and len(value) <= 64:
        return (type(value).__name__, tuple(described(v, depth - 1, memo) if depth > 0 else id(v) for v in value))
    fields = _fields(value)
    if fields is not None and depth > 0:
        return ("object", type(value).__name__,
                tuple((k, described(v, depth - 1, memo)) for k, v in fields.items() if not k.startswith("__")))
    return ("object", id(value))


def _fields(obj) -> dict[str, Any] | None:
    """A plain object's own fields (None for what is not looked into)."""
    if isinstance(obj, _OPAQUE) or isinstance(obj, _SCALARS) or isinstance(obj, (tuple, list, dict, set)):
        return None
    d = getattr(obj, "__dict__", None)
    return d if isinstance(d, dict) else None


@dataclass
class Watched:
    path: str
    owner: Any  # an object (attribute ``name``) or a closure cell (``name`` None)
    name: str | None
    value: Any  # the object itself, kept alive so it can be put back
    described: Any


def snapshot(fn: Callable, watch: Iterable[tuple[str, Any]]) -> list[Watched]:
    """Every host value ``fn`` can reach through its closure (and the named ``watch`` objects), DEPTH deep."""
    out: list[Watched] = []
    seen: set[int] = set()
    memo: dict = {}  # nothing changes while the snapshot is taken

    def visit(path: str, obj, depth: int):
        fields = _fields(obj)
        if fields is None or depth > DEPTH or id(obj) in seen:
            return
        seen.add(id(obj))
        for name, value in list(fields.items()):
            if name.startswith("__"):
                continue
            out.append(Watched(f"{path}.{name}", obj, name, value, described(value, memo=memo)))
            visit(f"{path}.{name}", value, depth + 1)

    code = getattr(fn, "__code__", None)
    for name, cell in zip(code.co_freevars if code else (), getattr(fn, "__closure__", None) or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell: nothing to keep
            continue
        out.append(Watched(name, cell, None, value, described(value, memo=memo)))
        visit(name, value, 1)
    for name, obj in watch:
        visit(name, obj, 1)
    return out


class ReadLog:
    """Attribute reads of watched objects during one replay (their class swapped for a recording one)."""

    _classes: dict[type, type] = {}

    def __init__(self):
        self.reads: set[tuple[int, str]] = set()
        self.swapped: list[tuple[Any, type]] = []
        self.untracked: set[int] = set()

    def track(self, obj) -> None:
        cls = type(obj)
        if id(obj) in {id(o) for o, _ in self.swapped} or id(obj) in self.untracked:
            return
        sub = self._classes.get(cls)
        if sub is None:
            def __getattribute__(self_, name, _cls=cls):
                log = ACTIVE[-1] if ACTIVE else None
                if log is not None and not name.startswith("__"):
                    log.reads.add((id(self_), name))
                return _cls.__getattribute__(self_, name)
            try:
                sub = type(cls.__name__, (cls,), {"__getattribute__": __getattribute__, "__slots__": ()})
            except TypeError:
                sub = None
            self._classes[cls] = sub
        try:
            if sub is None:
                raise TypeError
            obj.__class__ = sub
        except TypeError:  # a class whose instances cannot change class: changes are kept, reads unknown
            self.untracked.add(id(obj))
            return
        self.swapped.append((obj, cls))

    def restore(self) -> None:
        for obj, cls in reversed(self.swapped):
            obj.__class__ = cls
        self.swapped.clear()


ACTIVE: list[_ReadLog] = []


GONE = object()


def shown(value):
    d = described(value)
    return d if not (isinstance(d, tuple) and d and d[0] == "tensor") else f"tensor@{d[1]:#x}{list(d[2])}"


def reachable_contents(fn: Callable, watch: Iterable[tuple[str, Any]] = ()) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(tensor, a copy of its contents) for every tensor ``fn`` reaches through its closure and ``watch``
    (tensors held directly, in a plain object's fields ``DEPTH`` deep, or in a short tuple or list
    there): what a capture that runs nothing leaves as it found (``put_back``)."""
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    seen: set[int] = set()

    def visit(value, depth: int):
        if isinstance(value, torch.Tensor):
            if id(value) not in seen:
                seen.add(id(value))
                out.append((value, value.detach().clone()))
            return
        if isinstance(value, (tuple, list)) and len(value) <= 64:
            for v in value:
                visit(v, depth)
            return
        fields = _fields(value)
        if fields is None or depth > DEPTH or id(value) in seen:
            return
        seen.add(id(value))
        for name, v in list(fields.items()):
            if not name.startswith("__"):
                visit(v, depth + 1)

    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        visit(value, 1)
    for _, obj in watch:
        visit(obj, 1)
    return out


def put_back(saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Each tensor's contents as ``reachable_contents`` copied them (views of one storage restored from
    copies made before any write, so their order does not matter)."""
    with torch.no_grad():
        for tensor, contents in reversed(saved):
            tensor.copy_(contents)
