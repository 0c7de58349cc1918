"""SGLang's structs read by their field names and copied the way their own type copies.

vmfuzz relies on a struct's field names (``VerifyMask``'s buffer, mode,
max_bs, is_read), never on the library SGLang declares it with: msgspec
today, a dataclass or a plain class after a refactor. What cannot be copied
so is out of step, never a finding.
"""

from __future__ import annotations

from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang.seams import call_with, signature


def fields_of(cls, seam: str, file: str) -> tuple[str, ...]:
    """The field names of ``cls``, however it declares them (msgspec, dataclass, attrs, a named
    tuple, or a plain class's constructor parameters)."""
    import dataclasses
    for attr in ("__struct_fields__", "_fields"):
        names = getattr(cls, attr, None)
        if isinstance(names, tuple):
            return names
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    attrs = getattr(cls, "__attrs_attrs__", None)
    if attrs is not None:
        return tuple(a.name for a in attrs)
    params = signature(cls, seam, file).parameters.values()
    return tuple(p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


def field_defaults(cls) -> dict:
    """Each field of ``cls`` that has a plain default, with it, for a dataclass or a msgspec Struct (SGLang's
    ``ServerArgs`` has been both); {} for a class declared otherwise."""
    import dataclasses

    import msgspec
    if dataclasses.is_dataclass(cls):
        return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        return {f.name: f.default for f in msgspec.structs.fields(cls) if f.default is not msgspec.NODEFAULT}
    return {}


def replaced(obj, seam: str, file: str, **changes):
    """A copy of ``obj`` with ``changes``, made the way its type makes copies.

    SGLang chooses its struct's library; vmfuzz relies on its field names only.
    A type none of these can copy, or a copy that does not hold what was put in,
    is out of step: the harness could not build the input it meant to.
    """
    import dataclasses
    cls = type(obj)
    if hasattr(cls, "__struct_fields__"):
        import msgspec
        out = msgspec.structs.replace(obj, **changes)
    elif dataclasses.is_dataclass(cls):
        try:
            out = dataclasses.replace(obj, **changes)
        except (TypeError, ValueError) as exc:
            raise OutOfStep(seam, file, f"{cls.__name__} cannot be copied with {', '.join(changes)} changed: "
                            f"{exc}") from None
    elif hasattr(cls, "__attrs_attrs__") and (evolve := _attrs_evolve()) is not None:
        out = evolve(obj, **changes)
    elif hasattr(obj, "_replace") and hasattr(cls, "_fields"):
        out = obj._replace(**changes)
    else:
        values = {}
        for name in fields_of(cls, seam, file):
            if name in changes:
                values[name] = changes[name]
            elif hasattr(obj, name):
                values[name] = getattr(obj, name)
        out = call_with(cls, seam, file, **values)
    for name, value in changes.items():
        if getattr(out, name, None) is not value:
            raise OutOfStep(seam, file, f"a copy of {cls.__name__} made by its own constructor does not hold "
                            f"the {name} vmfuzz gave it")
    return out


def _attrs_evolve():
    """attrs' own copy-with-changes, from the attrs that made the class (vmfuzz does not depend on it)."""
    import sys
    for name in ("attrs", "attr"):
        evolve = getattr(sys.modules.get(name), "evolve", None)
        if evolve is not None:
            return evolve
    return None
