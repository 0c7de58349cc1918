"""What the target handed each check, recorded during the run itself: the mutation bench's ground truth.

A mutant the gate passes is a false green only if it changed something the
mask's path computes. Replaying a few fixed cases afterwards (the bench's old
way) judged 8 of reader-agreement's 38 examples; this records every example the
run checked, as it checks it: each call a property makes on the target, its
result and its arguments after the call (the buffers a kernel wrote in place),
one digest per leaf, nothing truncated. Two runs of the same code, seed and
property selection check the same cases, so their records compare key by key.

A key names the property (or shared group) that asked, the case by its digest
(the same case checked twice gives the same key wherever it ran), the call's
place in that check and the field: ``reader-agreement 3f09.. call4:read_replay ->.qo_indptr``.

It is switched on through the environment (``DIR_ENV``), like the line trace, so a
forked checker and a spawned worker record alike; each process writes its own
file, and ``merged`` joins them. Off, it costs one environment lookup per check.
"""

from __future__ import annotations

import atexit
import dataclasses
import enum
import hashlib
import inspect
import json
import os
import types
from pathlib import Path

#: The folder the records go to; set by whoever wants one (the mutation bench), inherited by workers.
DIR_ENV = "VMFUZZ_OUTPUT_RECORD_DIR"
#: how deep an object that is not plain data is walked (a backend's fields, not its whole world)
OBJECT_DEPTH = 3
#: The one list of fields the recorder does not see, (type name or "*" for any, field) -> why. Every
#: other field a reader hands on is recorded, private ones included: a reader keeping its buffer
#: under ``_buffer`` hands it on all the same. Each entry is vmfuzz's own bookkeeping, whose value
#: differs between two runs of the same code and is never an output of the code under test.
EXCLUDED = {
    ("ShadowHeap", "_by_address"): "the guarded buffers by data pointer: addresses differ every run",
    ("ShadowHeap", "_keys"): "the backing pool's keys, by whichever backing the pool handed out",
    ("ShadowHeap", "_live"): "the guarded backings: their payloads are recorded as the views handed on, "
                             "their redzones are the heap's check, reported as an overrun",
    ("ShadowHeap", "_verified"): "whether the heap was checked since its last write: a cache of that check",
    ("ShadowHeap", "_pool_key"): "where released backings go: the device and guard, recorded as such",
    ("*", "_consultation"): "a stand-in's ledger entry (what the code under test read of it): judged by "
                            "engine.core.failures, never an output",
}


#: Where SGLang itself keys by an object's ``id()`` (an address: another one in every run of the same code),
#: (type name, field) -> why. The field is recorded with each such address written ``<address>``; a dict of
#: them (a ``_write_ids`` keyed by that key) has its keys written so too, in their own order, so two runs
#: compare entry by entry, and the entries' values still are.
ADDRESSED = {
    ("IdSpace", "key"): "a KV id space's key: its kind and id() of the allocator it maps to",
    ("KVLocPlan", "_write_ids"): "the write slots per id space, keyed by that space's key (kind, id() of its "
                                 "allocator)",
}
#: an id() on a 64-bit CPython: an address far past any count, length or slot a case makes
_ADDRESS = 2 ** 40


def without_addresses(value):
    """``value`` (an int, or a tuple of them and other keys) with each address written ``<address>``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= _ADDRESS:
        return "<address>"
    if isinstance(value, tuple):
        return tuple(without_addresses(v) for v in value)
    return value


class Leaves:
    """Digests of values' leaves, by path; ``root`` (a checkout's folder) is written as <checkout>."""

    def __init__(self, root: str = "\0"):
        self.root, self.out = root, {}

    def put(self, path: str, data: bytes) -> None:
        self.out[path] = hashlib.sha256(data).hexdigest()[:24]

    def walk(self, value, path: str, depth: int = 0, seen: frozenset = frozenset()) -> None:
        import msgspec
        import torch
        if value is None or isinstance(value, (bool, int, float, complex)):
            return self.put(path, repr(value).encode())
        if isinstance(value, (str, bytes)):
            text = value if isinstance(value, str) else value.decode("latin-1")
            return self.put(path, text.replace(self.root, "<checkout>").encode())
        if isinstance(value, enum.Enum):
            return self.put(path, f"{type(value).__name__}.{value.name}".encode())
        if isinstance(value, (torch.dtype, torch.device)):
            return self.put(path, str(value).encode())
        if isinstance(value, torch.Tensor):
            return self._tensor(value, path)
        if id(value) in seen or inspect.isroutine(value) or isinstance(value, (type, types.ModuleType)):
            return None
        seen = seen | {id(value)}
        if isinstance(value, (list, tuple)):
            self.put(path + "#len", str(len(value)).encode())
            for i, item in enumerate(value):
                self.walk(item, f"{path}[{i}]", depth, seen)
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                self.walk(value[key], f"{path}[{key}]", depth, seen)
        elif isinstance(value, msgspec.Struct):
            for name in value.__struct_fields__:
                self._field(type(value).__name__, name, getattr(value, name), path, depth, seen)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                self._field(type(value).__name__, f.name, getattr(value, f.name, None), path, depth, seen)
        elif depth < OBJECT_DEPTH and hasattr(value, "__dict__"):
            self.put(path + "#type", type(value).__name__.encode())
            kind = type(value).__name__
            for name in sorted(vars(value)):
                if (kind, name) not in EXCLUDED and ("*", name) not in EXCLUDED:
                    self._field(kind, name, vars(value)[name], f"{path}", depth + 1, seen)

    def _field(self, kind: str, name: str, value, path: str, depth: int, seen: frozenset) -> None:
        where = f"{path}.{name}"
        if (kind, name) not in ADDRESSED:
            return self.walk(value, where, depth, seen)
        if isinstance(value, dict):
            self.put(where + "#len", str(len(value)).encode())
            for i, (key, item) in enumerate(value.items()):
                self.walk(item, f"{where}[{without_addresses(key)} #{i}]", depth, seen)
            return None
        return self.walk(without_addresses(value), where, depth, seen)

    def _tensor(self, t, path: str) -> None:
        import torch
        head = f"{t.dtype} {tuple(t.shape)}".encode()
        if t.device.type == "meta":
            return self.put(path, head + b" meta")
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        self.put(path, head + b"|" + flat.view(torch.uint8).numpy().tobytes())


class Recorder:
    """A target whose every call (and every call on a session object it hands out) is recorded.

    The target's own composite steps still reach its seams through itself: what
    is recorded is what the property is handed, which is what it judges.
    """

    def __init__(self, target, leaves: Leaves, prefix: str, counter: list):
        self._target, self._leaves, self._prefix, self._counter = target, leaves, prefix, counter

    def __getattr__(self, name):
        value = getattr(self._target, name)
        if not callable(value) or isinstance(value, type):
            return value

        def recorded(*args, **kwargs):
            self._counter[0] += 1
            key = f"{self._prefix} call{self._counter[0]}:{name}"
            result = value(*args, **kwargs)
            if _is_session(result):
                self._leaves.put(key + "#session", type(result).__name__.encode())
                return Recorder(result, self._leaves, key, self._counter)
            self._leaves.walk(result, key + " ->")
            for i, arg in enumerate(args):
                self._leaves.walk(arg, f"{key} arg{i}")
            for k in sorted(kwargs):
                self._leaves.walk(kwargs[k], f"{key} {k}=")
            return result
        return recorded


def _is_session(value) -> bool:
    """A stateful object of the target's (a server's reader) whose own calls hand out outputs."""
    module = type(value).__module__ or ""
    return (module.startswith("vmfuzz.harness.targets.") and not dataclasses.is_dataclass(value)
            and any(callable(getattr(value, n, None)) for n in vars(type(value)) if not n.startswith("_")))


def case_digest(config, batches) -> str:
    """The case's identity: the same config and batches give the same digest in any process."""
    import msgspec
    return hashlib.sha256(msgspec.json.encode((config, batches))).hexdigest()[:16]


class _ProcessRecord:
    """This process's leaves, written to a file of its own (one per pid: a forked child starts anew)."""

    def __init__(self, folder: str):
        self.pid, self.folder, self.leaves = os.getpid(), folder, {}

    def save(self) -> None:
        path = Path(self.folder, f"outputs.{self.pid}.json")
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.leaves, sort_keys=True))
        os.replace(tmp, path)


_record: _ProcessRecord | None = None


def _active() -> _ProcessRecord | None:
    global _record
    folder = os.environ.get(DIR_ENV)
    if not folder:
        return None
    if _record is None or _record.pid != os.getpid():
        _record = _ProcessRecord(folder)
        atexit.register(flush)  # the main process's own checks; a worker flushes before os._exit
    return _record


def check_recorded(check, target, prop_name: str, config, batches, device):
    """``check(target, config, batches, device)``, its target recorded when a record is switched on;
    how the check ended (held, or the exception's type) is one more leaf."""
    from vmfuzz.harness.engine.core.failures import consulted_check
    with consulted_check():
        return _check_recorded(check, target, prop_name, config, batches, device)


def _check_recorded(check, target, prop_name: str, config, batches, device):
    record = _active()
    if record is None:
        return check(target, config, batches, device)
    prefix = f"{prop_name} {case_digest(config, batches)}"
    leaves = Leaves(_package_folder())
    ending = "raised"
    try:
        result = check(Recorder(target, leaves, prefix, [0]), config, batches, device)
        ending = "held"
        return result
    except BaseException as exc:
        ending = type(exc).__name__
        raise
    finally:
        leaves.put(f"{prefix} ending", ending.encode())
        for key, digest in leaves.out.items():
            # the same case checked again in this process: keep each distinct answer (noise shows)
            known = record.leaves.setdefault(key, [])
            if digest not in known:
                known.append(digest)


def _package_folder() -> str:
    """The loaded SGLang's folder, written as <checkout> in a leaf: a mutant's copy and the
    installed package are the same code at two paths."""
    import sys
    module = sys.modules.get("sglang")
    where = getattr(module, "__file__", None)
    return os.path.dirname(where) if where else "\0"


def flush() -> None:
    """Writes this process's record; a worker calls it before it ends."""
    record = _record
    if record is not None and record.pid == os.getpid() and os.environ.get(DIR_ENV):
        try:
            record.save()
        except OSError:
            pass  # the bench reads a missing record as "not compared", never as equal


def merged(folder: Path) -> dict[str, list[str]]:
    """Every process's record under ``folder`` joined: key -> the distinct digests seen for it."""
    out: dict[str, list[str]] = {}
    for part in sorted(Path(folder).glob("outputs.*.json")):
        for key, digests in json.loads(part.read_text()).items():
            known = out.setdefault(key, [])
            known.extend(d for d in digests if d not in known)
    return out


def differences(pristine: list[dict[str, list[str]]], mutant: dict[str, list[str]]) -> tuple[list[str], int]:
    """The keys where ``mutant`` differs from the pristine records, and how many keys were compared.

    Compared: keys every record holds (a case one run checked and another did not is
    not compared), whose pristine answers agree with each other and are single
    (what differs run to run is noise, never a difference)."""
    if not pristine:
        return [], 0
    first = pristine[0]
    steady = {k for k, v in first.items() if len(v) == 1 and all(p.get(k) == v for p in pristine[1:])}
    compared = steady & set(mutant)
    # within a case both checked, a call only one of them made is a difference too
    both = {_case(k) for k in compared}
    uneven = {k for k in (set(mutant) - set(first)) | (steady - set(mutant)) if _case(k) in both}
    diffs = sorted({k for k in compared if mutant[k] != first[k]} | uneven)
    return diffs, len(compared)


def _case(key: str) -> str:
    """``PROPERTY CASE``: the check a key was recorded in."""
    return " ".join(key.split(" ", 2)[:2])
