"""Is a surviving mutant equivalent? Its outputs against the pristine copy's, byte for byte.

The gate's fixed cases (the boundary seeds and the deep corpus of production
shapes, ``harness.engine.cases`` / ``deep_corpus``) are run through the same
properties' checks on one SGLang copy, and everything the target hands back
is recorded: each call's result (StepOutput tensors, reader and packed views,
routing results, allocation calls) and its arguments after the call (the
buffers a kernel wrote in place), as one digest per leaf, keyed by the
property, the case, the call and the field. Two pristine recordings mark
what differs run to run (never compared); a mutant whose recording matches
the pristine one everywhere else is suspected-equivalent, and one that
differs names where.

    python bench/mutation_equiv.py record OUT.json --checkout DIR --properties p,q [--target sglang] \
        [--watch FILE:LINE,LINE]   # prints whether a mutated line ran at all

``--checkout`` is a folder laid out like an SGLang checkout (``python/sglang``);
the target is loaded from it, as the gate loads the code under review.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import hashlib
import inspect
import json
import random
import sys
import types
from pathlib import Path

HARNESS_ROOT = Path(__file__).resolve().parent.parent
#: how deep an object that is not plain data is walked (a backend's fields, not its whole world)
OBJECT_DEPTH = 3
#: the name the shared properties are recorded under: always all of them, judged on one run of
#: each case, so a mutant's recording and the pristine one have the same keys whatever file drives it
SHARED = "shared"


class _Leaves:
    """Digests of one value's leaves, by path; the checkout's own folder written as <checkout>."""

    def __init__(self, root: str):
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
                self.walk(getattr(value, name), f"{path}.{name}", depth, seen)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                self.walk(getattr(value, f.name, None), f"{path}.{f.name}", depth, seen)
        elif depth < OBJECT_DEPTH and hasattr(value, "__dict__"):
            self.put(path + "#type", type(value).__name__.encode())
            for name in sorted(vars(value)):
                if not name.startswith("_"):  # private state: a heap's address book, caches
                    self.walk(vars(value)[name], f"{path}.{name}", depth + 1, seen)

    def _tensor(self, t, path: str) -> None:
        head = f"{t.dtype} {tuple(t.shape)}".encode()
        if t.device.type == "meta":
            return self.put(path, head + b" meta")
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        self.put(path, head + b"|" + flat.view(__import__("torch").uint8).numpy().tobytes())


class Recorder:
    """A target whose every call (and every call on a session object it hands out) is recorded.

    The target's own composite steps still reach its seams through itself: what
    is recorded is what the property is handed, which is what it judges.
    """

    def __init__(self, target, leaves: _Leaves, prefix: str, counter: list):
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
    return (module.startswith("harness.targets.") and not dataclasses.is_dataclass(value)
            and any(callable(getattr(value, n, None)) for n in vars(type(value)) if not n.startswith("_")))


def units(properties: list[str]) -> list[str]:
    """What is run for ``properties``: the shared group (all of it) once, then each other property."""
    from harness.properties import PROPERTIES
    out = [SHARED] if any(PROPERTIES[p].shared for p in properties) else []
    return out + [p for p in properties if not PROPERTIES[p].shared]


def _unit_property(unit: str):
    from harness.properties import PROPERTIES, shared_group
    if unit == SHARED:
        return shared_group([n for n, p in PROPERTIES.items() if p.shared])
    return PROPERTIES[unit]


def fixed_cases(target, prop) -> list:
    """The gate's cases run before its search: the boundary seeds, then the deep corpus, at
    each of the pr profile's bounds; each case once."""
    from harness.engine.cases import boundary_cases
    from harness.engine.deep_corpus import case_key, constants_of, deep_cases
    from harness.model.bounds import Bounds
    steps = tuple(getattr(target, "bounds_ladder", {}).get("pr", ())) or (getattr(target, "bounds", None) or Bounds(),)
    out, keys = [], set()
    for bounds in steps:
        for config, batches in boundary_cases(prop, bounds) + [(c, s) for _, c, s in
                                                               deep_cases(prop, bounds, constants_of(target))]:
            key = case_key(config, batches)
            if key not in keys:
                keys.add(key)
                out.append((config, batches))
    return out


def record(target, properties: list[str], root: str = "\0") -> dict[str, str]:
    """{leaf key: digest} of everything ``target`` hands ``properties``' checks on the gate's fixed cases."""
    import torch
    leaves = _Leaves(root)
    for unit in units(properties):
        prop = _unit_property(unit)
        if prop.missing(target):
            leaves.put(f"{unit} not driven", ",".join(prop.missing(target)).encode())
            continue
        for n, (config, batches) in enumerate(fixed_cases(target, prop)):
            torch.manual_seed(0)
            random.seed(0)
            prefix = f"{unit} case{n}"
            try:
                prop.check(Recorder(target, leaves, prefix, [0]), config, batches)
                ending = "held"
            except Exception as exc:  # noqa: BLE001 - how a check ended is one more output
                ending = f"{type(exc).__name__}: {str(exc)[:300]}"
            leaves.put(f"{prefix} ending", ending.replace(root, "<checkout>").encode())
    return leaves.out


def differences(pristine: list[dict[str, str]], mutant: dict[str, str], properties: list[str]) -> list[str]:
    """The keys of ``properties``' units where ``mutant`` differs from the pristine recordings,
    leaving out what differs between the pristine recordings themselves (run-to-run noise)."""
    mine = tuple(f"{u} " for u in units(properties))
    first = {k: v for k, v in pristine[0].items() if k.startswith(mine)}
    noisy = {k for k in first if any(p.get(k) != first[k] for p in pristine[1:])}
    keys = (set(first) | {k for k in mutant if k.startswith(mine)}) - noisy
    return sorted((k for k in keys if first.get(k) != mutant.get(k)), key=_natural)


def _natural(key: str) -> tuple:
    """Case and call order, not string order: ``case10`` after ``case9``."""
    import re
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key))


def buffer_of(key: str) -> str:
    """Which output a key is, without its case and call numbers: ``verify ->.tree_mask``."""
    import re
    what = key.split(":", 1)[1] if ":" in key else key.split(" ", 1)[-1]
    return re.sub(r"\[\d+\]|#len|#type", "", what)


def verdict(diffs: list[str], compared: int) -> str:
    """One line for the score: what ``mutation_table`` reads as suspected-equivalent or survived."""
    if not diffs:
        return f"identical ({compared} outputs compared)"
    buffers = list(dict.fromkeys(buffer_of(k) for k in diffs))
    return (f"differs: {', '.join(buffers[:3])}{' ...' if len(buffers) > 3 else ''} "
            f"({len(diffs)} outputs; first {diffs[0]})")


def watch(lines: dict[str, set[int]]) -> dict:
    """Notes whether any of ``lines`` ({file path: line numbers}) runs from now on: an identical
    output from a mutated line that never ran says nothing about equivalence. Only calls into
    those files are traced line by line, and none once a line has run."""
    import threading
    hit = {"ran": False}

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno in lines[frame.f_code.co_filename]:
            hit["ran"] = True
        return None if hit["ran"] else local

    def calls(frame, event, arg):
        return None if hit["ran"] or frame.f_code.co_filename not in lines else local
    sys.settrace(calls)
    threading.settrace(calls)
    return hit


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mutation_equiv.py")
    ap.add_argument("step", choices=["record"])
    ap.add_argument("out", type=Path)
    ap.add_argument("--checkout", type=Path, help="a folder holding python/sglang (default: the installed one)")
    ap.add_argument("--properties", required=True, help="comma-separated property names")
    ap.add_argument("--target", default="sglang")
    ap.add_argument("--watch", action="append", default=[], metavar="FILE:LINE,LINE",
                    help="print whether any of these lines (the mutated ones) ran")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HARNESS_ROOT))
    from harness.targets import resolve
    root = "\0"
    if args.checkout is not None:
        from harness.targets.sglang.loader import import_from_checkout
        root = str(args.checkout.resolve())
        import_from_checkout(args.checkout / "python")
    target = resolve(args.target)
    watched = {str(Path(f).resolve()): {int(n) for n in lines.split(",")}
               for f, _, lines in (w.rpartition(":") for w in args.watch)}
    hit = watch(watched) if watched else None
    outputs = record(target, args.properties.split(","), root)
    sys.settrace(None)
    if hit is not None:
        print("mutated line ran: " + ("yes" if hit["ran"] else "no"))
    args.out.write_text(json.dumps(outputs, indent=0, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
