"""Stand-ins that record being consulted by SGLang's code.

A stand-in object (a batch, a model runner, an attention backend, server
args ...) is a ``StandIn``: a namespace that records each field SGLang's code
reads, and each field it asks for and does not find. A patch the harness binds
into SGLang's modules is ``recorded``: it notes being called. Both register
in the running check's ledger (``vmfuzz.harness.model.consultation``), and
``engine.core.failures.consulted_check`` judges from it: a failure met while a
load-bearing stand-in was never read, or after SGLang's code asked a stand-in
for what it does not provide, is out of step naming the seam, never SGLang's.

A stand-in is load-bearing where the check means something only if SGLang read
it: the attention backend's ``verify_mask`` at a call site that decides reuse
is one; a field a release may or may not read (``max_context_len``) is not.
"""

from __future__ import annotations

import functools
import os
import sys
import types

from vmfuzz.harness.model import consultation


class StandIn(types.SimpleNamespace):
    """A namespace standing in for a server object, recording what SGLang's code reads of it.

    ``StandIn(seam, file, load_bearing=(...), **fields)``: ``seam`` names what it
    stands in for, ``file`` the SGLang file that reads it, ``load_bearing`` the
    fields that must be read for a failure to be SGLang's.
    """

    __slots__ = ("_consultation", "__weakref__")  # a real ForwardBatch can be held weakly (0.5.19 memoizes by it)

    def __init__(self, seam: str, file: str = "", /, *, load_bearing=(), **fields):
        super().__init__(**fields)
        unknown = set(load_bearing) - set(fields)
        if unknown:  # a typo here would make the stand-in unconsultable: every check out of step
            raise ValueError(f"{seam}: load-bearing {sorted(unknown)} are not among its fields")
        object.__setattr__(self, "_consultation", consultation.register(seam, file, load_bearing, self))

    def __getattribute__(self, name: str):
        fields = object.__getattribute__(self, "__dict__")
        if name in fields:
            entry = object.__getattribute__(self, "_consultation")
            # vmfuzz reading its own stand-in (to build the next one) is no consultation by SGLang
            if name not in entry.load_bearing or not _read_by_harness():
                entry.reads.add(name)
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str):  # only a field it lacks: noted, then missed as ever
        if not name.startswith("__"):
            object.__getattribute__(self, "_consultation").lacking.add(name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}", name=name, obj=self)

    def __repr__(self) -> str:
        return f"StandIn[{object.__getattribute__(self, '_consultation').seam}]"


#: vmfuzz's own package folder: a read from code there is vmfuzz's, not SGLang's
HARNESS_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))) + os.sep


@functools.lru_cache(maxsize=None)
def is_harness_file(filename: str) -> bool:
    """Whether code in ``filename`` is vmfuzz's own. Resolved, because a checkout imports the
    package through the link vmfuzz/harness (cached: it runs on every read of a stand-in)."""
    return os.path.realpath(filename).startswith(HARNESS_DIR)


def _read_by_harness() -> bool:
    caller = sys._getframe(2).f_code.co_filename
    return is_harness_file(caller) and not caller.endswith("stand_in.py")


def consultation_of(stand_in: StandIn) -> consultation.Consultation:
    """What SGLang's code read of ``stand_in`` so far."""
    return object.__getattribute__(stand_in, "_consultation")


def recorded(patch, seam: str, file: str, *, load_bearing: bool = False):
    """``patch`` (a function bound over SGLang's) noting each call in the running check's ledger.

    A load-bearing patch never called while the check failed makes the failure out
    of step. Anything but a plain function (a class, an instance) records itself
    if it can, and is handed back as it is.
    """
    if not isinstance(patch, types.FunctionType):
        return patch
    entry = consultation.register(seam, file, ("call",) if load_bearing else ())

    @functools.wraps(patch)
    def consulted(*args, **kwargs):
        entry.reads.add("call")
        return patch(*args, **kwargs)
    consulted.consultation = entry
    return consulted


def never_consulted() -> list[consultation.Consultation]:
    """The running check's stand-ins and patches nothing read so far (empty outside a check)."""
    ledger = consultation.current()
    return ledger.unconsulted() if ledger is not None else []


def watch_unset(obj, seam: str, file: str, set_up: str, built: tuple[str, ...]):
    """``obj`` (one of SGLang's own objects) watched for reads of what its method ``set_up`` sets and
    vmfuzz, which built that set-up's values in its place (``built``), left as ``__init__`` left them.

    SGLang's code reading one of those (directly, or through a helper of its own) computes from a
    value no set-up made, so a raise met after it is vmfuzz's gap (out of step), never a finding.
    The names come from the set-up's own source, so a set-up that starts keeping its buffer under
    another name is watched under that name. Returns ``obj`` (its class now a watching subclass);
    an object whose layout refuses the swap, or a set-up with no source, is handed back unwatched.
    """
    import re

    from vmfuzz.harness.targets.sglang import source_text
    owner = next((k for k in type(obj).__mro__ if set_up in vars(k)), None)
    try:
        source = source_text.of(vars(owner)[set_up]) if owner is not None else ""
    except (OSError, TypeError):
        source = ""
    names = sorted(set(re.findall(r"\bself\.(\w+)\s*(?::[^=\n]*)?=(?!=)", source)) - set(built))
    store = getattr(obj, "__dict__", None)
    if not names or store is None:
        return obj
    try:
        object.__setattr__(obj, "__class__", _watching(type(obj), tuple(names)))
    except TypeError:
        return obj
    store["_consultation"] = consultation.register(seam, file, (), obj)
    return obj


@functools.lru_cache(maxsize=None)
def _watching(cls: type, names: tuple[str, ...]) -> type:
    body = {name: _Watched(cls, name) for name in names}
    body.update(__slots__=(), __module__=cls.__module__, __qualname__=cls.__qualname__)
    return type(cls.__name__, (cls,), body)


class _Watched:
    """A data descriptor that notes SGLang reading ``name``, then reads it as the class would."""

    def __init__(self, cls: type, name: str):
        self.name = name
        found = next((vars(k)[name] for k in cls.__mro__ if name in vars(k)), None)
        # a slot or property of the class itself keeps storing the value; else the instance's dict
        self.inner = found if hasattr(type(found), "__set__") else None
        self.plain = found

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        entry = object.__getattribute__(obj, "__dict__").get("_consultation")
        if entry is not None and not is_harness_file(sys._getframe(1).f_code.co_filename):
            entry.unset.add(self.name)
        if self.inner is not None:
            return self.inner.__get__(obj, owner)
        store = getattr(obj, "__dict__", {})
        if self.name in store:
            return store[self.name]
        if self.plain is not None:
            return self.plain.__get__(obj, owner) if hasattr(type(self.plain), "__get__") else self.plain
        raise AttributeError(f"{type(obj).__name__!r} object has no attribute {self.name!r}", name=self.name,
                             obj=obj)

    def __set__(self, obj, value):
        if self.inner is not None:
            self.inner.__set__(obj, value)
        else:
            obj.__dict__[self.name] = value
