"""Did a check read a class's own default, or only an instance's value of the same name?

A class body runs once, at import; its ``name = 0`` is the value every instance
reads until it sets its own. Most of SGLang's defaults are set again in
``__init__`` (``self.name = ...``), so a method that reads ``self.name`` reads
the instance's value, never the class's: the line that reads it running says
nothing about the default. Only the lookup knows, so the default is watched
where it is looked up: it is swapped for a non-data descriptor that counts each
read that reaches the class (``self.name`` with no instance value, ``Cls.name``,
``super().name``) and hands back the very object the class held. An instance's
own value still wins over it (a non-data descriptor yields to the instance's
dict), so what SGLang computes is unchanged.

Only plain classes are watched (made by ``type`` or ``ABCMeta``): an enum's
members, a msgspec Struct's or pydantic model's fields are not class
attributes the same way, and a watch there could change what they do; a value
that is itself a descriptor (a function, a property) is not a default.
"""

from __future__ import annotations

import abc


class _Default:
    """The class's own value, counted each time a lookup reaches it."""

    __slots__ = ("value", "seen")

    def __init__(self, value, seen):
        self.value = value
        self.seen = seen

    def __get__(self, obj, owner=None):
        self.seen()
        return self.value


def watch(module, qualname: str, name: str, seen) -> str:
    """Counts (``seen()``) every read of class ``qualname``'s own ``name`` in ``module``; '' or why it cannot."""
    owner = module
    for part in qualname.split("."):
        owner = getattr(owner, "__dict__", {}).get(part)
    if not isinstance(owner, type):
        return f"{qualname} is not a class of its module once imported"
    if type(owner) not in (type, abc.ABCMeta):
        return (f"{qualname} is made by {type(owner).__name__}, whose attributes are not plain class defaults "
                "(not watched)")
    if "__dataclass_fields__" in owner.__dict__ and name in owner.__dataclass_fields__:
        return (f"{qualname}.{name} is a dataclass field: its default reaches instances through the generated "
                "__init__, which is not watched")
    if name not in owner.__dict__:
        return f"{qualname} holds no {name} of its own once made"
    value = owner.__dict__[name]
    if isinstance(value, _Default):
        return ""
    if hasattr(type(value), "__get__"):
        return f"{qualname}.{name} is a descriptor, not a default value"
    try:
        setattr(owner, name, _Default(value, seen))
    except (AttributeError, TypeError) as exc:
        return f"{qualname}.{name} could not be watched ({type(exc).__name__}: {exc})"
    return ""
