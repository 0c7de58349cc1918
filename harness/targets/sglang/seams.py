"""Binding to SGLang by capability: through the signatures the imported code has.

A seam never guesses an API by counting parameters, never names a call's
arguments with the harness's own names, and never drops a keyword it does not
know: it binds with ``inspect.signature(...).bind`` and reads each argument by
the parameter names SGLang itself uses (``SYNONYMS`` lists the names SGLang's
releases have used for one quantity). What it cannot bind raises ``OutOfStep``
naming the seam and its file -- before the call, so it is never mistaken for
the target misbehaving.
"""

from __future__ import annotations

import inspect
import types
from pathlib import Path

from vmfuzz.harness.model.errors import OutOfStep

#: a tree-kernel quantity -> the parameter names SGLang's kernel entries give it
SYNONYMS: dict[str, tuple[str, ...]] = {
    "parent_list": ("parent_list",),
    "top_scores_index": ("top_scores_index", "selected_index"),
    "seq_lens": ("seq_lens", "verified_seq_len"),
    "tree_mask": ("tree_mask",),
    "positions": ("positions",),
    "retrieve_index": ("retrieve_index",),
    "retrieve_next_token": ("retrieve_next_token",),
    "retrieve_next_sibling": ("retrieve_next_sibling",),
    "topk": ("topk",),
    "spec_steps": ("spec_steps", "depth"),
    "d": ("num_verify_tokens", "draft_token_num", "num_draft_tokens"),
    "mode": ("tree_mask_mode", "mode"),
}
_QUANTITY = {name: q for q, names in SYNONYMS.items() for name in names}

#: an allocator quantity -> the parameter names ``maybe_create_verify_mask`` gives it
ALLOCATOR_SYNONYMS: dict[str, tuple[str, ...]] = {
    "is_draft_runner": ("is_draft_runner",),
    "skip_prefill": ("skip_prefill",),
    "max_bs": ("max_bs", "max_batch_size"),
    "max_context_len": ("max_context_len", "context_len"),
    "d": SYNONYMS["d"],
    "device": ("device",),
    "is_read": ("is_read",),
    "dtype": ("dtype",),
}


def _names(synonyms: dict[str, tuple[str, ...]]) -> dict[str, str]:
    return {name: q for q, names in synonyms.items() for name in names}


def where(obj) -> str:
    """``obj``'s file under the sglang package (``srt/...``), for a message naming it."""
    try:
        path = Path(inspect.getsourcefile(inspect.unwrap(obj)) or "")
    except (TypeError, ValueError):
        return getattr(obj, "__module__", None) or repr(obj)
    parts = path.parts
    return "/".join(parts[len(parts) - parts[::-1].index("sglang"):]) if "sglang" in parts else str(path)


#: plain functions' signatures by the function and what could change its signature: a search reads the
#: same few thousand times, and inspect rebuilds one on each call (about a tenth of a gate's own time)
_SIGNATURES: dict = {}


def _signature_key(fn):
    """A key that changes whenever ``inspect.signature(fn)`` could; None for what is not a plain
    function (classes, bound methods, partials: read afresh each time)."""
    if type(fn) is not types.FunctionType:
        return None
    # keyword-only defaults live in a dict: keyed by its items now (the dict itself never hashes)
    kwdefaults = None if fn.__kwdefaults__ is None else tuple(fn.__kwdefaults__.items())
    key = (fn, fn.__code__, fn.__defaults__, kwdefaults, id(fn.__annotations__),
           fn.__dict__.get("__signature__"), fn.__dict__.get("__wrapped__"))
    try:
        hash(key)
    except TypeError:  # an unhashable default: read afresh
        return None
    return key


def signature(fn, seam: str, file: str) -> inspect.Signature:
    key = _signature_key(fn)
    if type(fn) is types.MethodType:
        # a bound method's signature is its function's less the first parameter, whoever it is bound to
        inner = _signature_key(fn.__func__)
        key = None if inner is None else ("bound", inner)
    if key is not None and key in _SIGNATURES:
        return _SIGNATURES[key]
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise OutOfStep(seam, file, f"its signature cannot be read ({exc})") from None
    if key is not None:
        if len(_SIGNATURES) > 4096:  # functions made per case (stand-ins, closures) must not pile up
            _SIGNATURES.clear()
        _SIGNATURES[key] = sig
    return sig


def bind(fn, seam: str, file: str, *args, **kwargs) -> inspect.BoundArguments:
    """``fn``'s signature bound to a call as it was made: a call that does not bind is out of step."""
    try:
        return signature(fn, seam, file).bind(*args, **kwargs)
    except TypeError as exc:
        raise OutOfStep(seam, file, f"the call does not bind to {getattr(fn, '__qualname__', fn)}{_sig(fn)}: "
                        f"{exc}") from None


def _sig(fn) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def by_quantity(fn, seam: str, file: str, args: tuple, kwargs: dict) -> dict:
    """The tree kernel's quantities, read from a call of ``fn`` by SGLang's own parameter names.

    A parameter the harness cannot name and that the call set away from its
    default would be dropped: that is out of step, never silently ignored.
    """
    bound = bind(fn, seam, file, *args, **kwargs)
    out = {}
    for name, value in bound.arguments.items():
        q = _QUANTITY.get(name)
        if q is not None:
            out[q] = value
            continue
        param = bound.signature.parameters[name]
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) and not value:
            continue
        if param.default is param.empty or value is not param.default:
            raise OutOfStep(seam, file, f"the call passes {name}={value!r}, which vmfuzz cannot hand to its "
                            "guarded kernel")
    missing = [q for q in SYNONYMS if q not in out and q != "mode"]
    if missing:
        raise OutOfStep(seam, file, f"{getattr(fn, '__qualname__', fn)}{_sig(fn)} names no parameter for "
                        f"{', '.join(missing)}")
    return out


def default_of(fn, quantity: str, seam: str, file: str, otherwise):
    """The default ``fn``'s signature gives ``quantity`` (``otherwise`` when it names no such parameter):
    what the callee itself takes for a call that leaves the argument out."""
    for name, param in signature(fn, seam, file).parameters.items():
        if _QUANTITY.get(name) == quantity and param.default is not param.empty:
            return param.default
    return otherwise


def call_by_quantity(fn, seam: str, file: str, values: dict, synonyms: dict = SYNONYMS):
    """Call ``fn`` with ``values`` (quantity -> value), each under the name ``fn``'s signature gives it."""
    quantity_of = _names(synonyms)
    named = {name: values[quantity_of[name]] for name in signature(fn, seam, file).parameters
             if quantity_of.get(name) in values}
    return call_with(fn, seam, file, **named)


def quantities_of_call(fn, seam: str, file: str, args: tuple, kwargs: dict, synonyms: dict):
    """(quantity -> value, the bound call): a call of ``fn`` read by ``fn``'s own parameter names,
    its defaults filled in, so a renamed keyword reads as the quantity it always was."""
    bound = bind(fn, seam, file, *args, **kwargs)
    bound.apply_defaults()
    quantity_of = _names(synonyms)
    return {quantity_of[n]: v for n, v in bound.arguments.items() if n in quantity_of}, bound


def with_quantity(bound: inspect.BoundArguments, quantity: str, value, synonyms: dict):
    """``bound`` (a ``quantities_of_call`` call) with ``quantity`` set to ``value`` under its parameter's name."""
    for name in synonyms[quantity]:
        if name in bound.arguments:
            bound.arguments[name] = value
    return bound


#: what the harness hands SGLang's constructors -> the parameter names its classes give it
CONSTRUCTOR_SYNONYMS: dict[str, tuple[str, ...]] = {
    "model_runner": ("model_runner", "runner"),
}


def _aliases() -> dict[str, set[str]]:
    """Each parameter name SGLang has used -> every name it has used for that same quantity."""
    out: dict[str, set[str]] = {}
    for table in (SYNONYMS, ALLOCATOR_SYNONYMS, CONSTRUCTOR_SYNONYMS):
        for names in table.values():
            for name in names:
                out.setdefault(name, {name}).update(names)
    return out


_ALIASES = _aliases()


def _given_as(param: str, given: dict) -> str | None:
    if param in given:
        return param
    for name in _ALIASES.get(param, ()):
        if name in given:
            return name
    return None


def call_with(fn, seam: str, file: str, /, *receiver, **named):
    """Call ``fn`` (a function or a class) handing each of ``named`` to the parameter its own
    signature names for it (a release's other name for the same quantity counts too).

    Values go in as keywords whatever SGLang's parameter kind, so a ``*`` added to
    a signature changes nothing; only a positional-only parameter is filled by
    position. ``receiver`` is for ``self`` of a function read off a class, the one
    argument a method is always handed first. Values ``fn`` takes no parameter for
    are left out, unless it takes ``**kwargs``. A required parameter vmfuzz has no
    value for is out of step, named with its file, found before the call: a
    harness call that does not bind is never the target's raise.
    """
    sig = signature(fn, seam, file)
    given = dict(named)
    args, kwargs = list(receiver), {}
    positional_open = True
    for i, param in enumerate(sig.parameters.values()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if i < len(receiver):
            if param.kind is param.KEYWORD_ONLY:
                raise OutOfStep(seam, file, f"{_name(fn)}{sig} takes {param.name} by keyword only, where vmfuzz "
                                "hands it the receiver")
            continue
        key = _given_as(param.name, given)
        if key is None:
            if param.default is param.empty:
                raise OutOfStep(seam, file, f"{_name(fn)}{sig} requires {param.name}, which vmfuzz cannot "
                                "supply")
            positional_open = positional_open and param.kind is not param.POSITIONAL_ONLY
            continue
        value = given.pop(key)
        if param.kind is param.POSITIONAL_ONLY:
            if not positional_open:
                raise OutOfStep(seam, file, f"{_name(fn)}{sig} takes {param.name} by position after a "
                                "positional-only parameter vmfuzz leaves at its default")
            args.append(value)
        else:
            kwargs[param.name] = value
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        kwargs.update(given)
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise OutOfStep(seam, file, f"{_name(fn)}{sig} does not take what vmfuzz passes: {exc}") from None
    return fn(*args, **kwargs)


def call_method(obj, method: str, /, **named):
    """``obj.method`` called by its parameters' names (``call_with``), the seam named after it."""
    return call_with(getattr(obj, method), f"{type(obj).__name__}.{method}", where(type(obj)), **named)


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


class Sentinel:
    """A patch that records being gone through: a patch not taken proves nothing was checked."""

    def __init__(self, fn, seam: str, file: str):
        from vmfuzz.harness.model import consultation
        self.fn, self.seam, self.file, self.calls = fn, seam, file, 0
        self.consultation = consultation.register(seam, file)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        self.consultation.reads.add("call")
        return self.fn(*args, **kwargs)

    def __getitem__(self, grid):  # a Triton launch, ``kernel[grid](...)``
        self.calls += 1
        self.consultation.reads.add("call")
        return self.fn[grid]

    def require(self, why: str) -> None:
        if not self.calls:
            raise OutOfStep(self.seam, self.file, why)


class TranslatesNothing:
    """Stands in for SGLang's KV-index translator, whatever its release calls its parts.

    The KV ids are not what the mask readers or allocators get wrong: every
    flag it is asked for is false, and every method called on it zeroes the
    ``out`` buffer it is handed (packing nothing) and records the call.
    """

    reads_are_translated = False

    def __init__(self):
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Nothing(self.calls, name)


class _Nothing:
    def __init__(self, calls: list, name: str):
        self._calls, self._name = calls, name

    def __bool__(self) -> bool:
        return False

    def __call__(self, *args, out=None, **kwargs):
        self._calls.append(self._name)
        if out is not None:
            out.zero_()
            return None
        # A release that asks for a view of the KV ids (0.5.19's index table)
        # hands its fields to the KV gather, which vmfuzz stands in for too.
        return _NoKvView()


class _NoKvView:
    """A KV-id view with no fields: each one read is ``_NoKvField``."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _NoKvField()


class _NoKvField:
    """A field of the KV-id view, or a method of it: false as a flag, and, called (0.5.19's
    ``sliding_window_read_ids()`` before a window's gather), an empty table of ids, a tensor to hand
    the KV gather vmfuzz stands in for, which reads none of it."""

    def __bool__(self) -> bool:
        return False

    def __call__(self, *args, **kwargs):
        import torch
        return torch.empty((0, 0), dtype=torch.int32)


def unset_by_harness(exc: AttributeError, standin, cls, seam: str, file: str) -> None:
    """Out of step when SGLang read an attribute of ``standin`` (made with ``cls.__new__``) that
    SGLang's own code sets but the harness did not; any other AttributeError is the target's.

    Set by the class's own methods or by a helper of its module (or of a base
    class's) that sets it on the instance it is handed: either way ``__init__``
    would have given it, and the stand-in lacks it.
    """
    import re
    attr = getattr(exc, "name", None)
    if getattr(exc, "obj", None) is not standin or not attr:
        return
    name = re.escape(attr)
    sets = re.compile(rf"\b\w+\.{name}\s*(:[^=\n]*)?=(?!=)|setattr\(\s*\w+\s*,\s*[\"']{name}[\"']")
    for owner in _homes(cls):
        try:
            text = inspect.getsource(owner)
        except (OSError, TypeError):
            continue
        if sets.search(text):
            raise OutOfStep(seam, file, f"{cls.__name__} sets {attr} in its own code, which the code under test "
                            "reads and vmfuzz's stand-in does not provide") from None


def _homes(cls) -> list:
    """The modules whose code may set an instance attribute of ``cls``: its own and its bases'."""
    import sys
    homes = []
    for klass in cls.__mro__[:-1]:
        module = sys.modules.get(klass.__module__)
        if module is not None and module not in homes:
            homes.append(module)
    return homes


def require_taken(taken: dict, site: str) -> None:
    """Out of step unless the verify step went through the patches that guard its writes.

    The mask is written either by the wrapper handing over to the tree kernel or
    by the chain writer's launch; a step that took neither wrote through code
    vmfuzz did not guard (a renamed global, a moved call), so its outputs were
    not checked and must not be judged.
    """
    chain = taken["chain"] is not None and taken["chain"].calls
    if taken["wrapper"].calls and taken["kernel"] is None:
        raise OutOfStep("build_tree_kernel_efficient", "srt/speculative/eagle_utils.py",
                        "no kernel entry found among the globals it calls")
    if taken["wrapper"].calls and not taken["kernel"].calls and not chain:
        taken["kernel"].require(f"build_tree_kernel_efficient did not go through {taken['kernel'].seam}, "
                                "the kernel entry vmfuzz guards")
    if not taken["wrapper"].calls and not chain:
        raise OutOfStep(site + " call site", "srt/speculative/eagle_utils.py",
                        "the verify step wrote its mask through neither build_tree_kernel_efficient nor "
                        "the chain writer's launch, the patches vmfuzz guards writes at")
