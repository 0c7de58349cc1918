"""Where SGLang's code reaches a function, so a patch stands where the code goes.

A patch at one module global binds nothing when the code reaches the same
function another way: imported under another name, through the module that
defines it (``runtime_context.get_spec()``), or from a helper one call
deeper. These find those places -- the holders of a function, the lookups a
module can reach, the entry a wrapper's calls lead to -- and tell a raise
from code vmfuzz meant never to run unguarded.
"""

from __future__ import annotations

import inspect

_HOLDERS: dict = {}


def holders(obj, prefix: str = "sglang") -> list[tuple]:
    """(module, global name) for every loaded ``prefix`` module holding ``obj`` itself: where it is
    defined and wherever it was imported, under any name. A patch at one of them only would leave
    code that reaches it through another unpatched."""
    import sys
    key = (id(obj), len(sys.modules))
    hit = _HOLDERS.get(key)
    if hit is not None and hit[0] is obj:
        return hit[1]
    out = []
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not (mod_name == prefix or mod_name.startswith(prefix + ".")):
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        out.extend((mod, name) for name, value in items if value is obj)
    if len(_HOLDERS) > 64:
        _HOLDERS.clear()
    _HOLDERS[key] = (obj, out)
    return out


def patches_everywhere(obj, value, *also: tuple) -> list[tuple]:
    """(owner, name, value) binding ``value`` in every place ``obj`` is held (``holders``), and at
    ``also``'s (owner, name[, may_add]) where it is not held yet."""
    out, seen = [], set()
    for owner, name in holders(obj) if obj is not None else []:
        out.append((owner, name, value))
        seen.add((id(owner), name))
    for owner, name, *may_add in also:
        if (id(owner), name) not in seen:
            out.append((owner, name, value, *may_add))
            seen.add((id(owner), name))
    return out


def reached(mod, name: str):
    """The function ``name`` that code in ``mod`` can call: its own global, or one a module it holds
    defines (``verify_mask.maybe_create_verify_mask(...)``); None when neither has one."""
    import types
    for owner in [mod] + [v for v in vars(mod).values() if isinstance(v, types.ModuleType)]:
        fn = getattr(owner, name, None)
        if callable(fn):
            return fn
    return None


def lookup_patches(modules, answers: dict) -> list[tuple]:
    """Stand-ins for server-wide lookups (name -> answer) that code in ``modules`` makes: bound where
    those modules imported the function by name, and in each module they hold that defines one
    (code reaching it as ``runtime_context.get_spec()``). Other importers keep the real one:
    SGLang's helpers elsewhere rely on it answering "not published" outside a server."""
    return [(owner, name, answers[name]) for owner, name in _lookup_places(tuple(modules), tuple(answers))]


#: (modules with their sizes, names) -> where those names are held: a graph check binds the same
#: lookups on every step, and scanning every held module's names was a quarter of its time
_PLACES: dict[tuple, list[tuple]] = {}


def _lookup_places(modules: tuple, names: tuple) -> list[tuple]:
    import types
    # a module that gained or lost a name (an import run since) is scanned again
    key = (tuple((id(m), len(vars(m))) for m in modules), names)
    places = _PLACES.get(key)
    if places is None or any(not callable(getattr(owner, name, None)) for owner, name in places):
        places, seen = [], set()
        for name in names:
            for mod in modules:
                for owner in [mod] + [v for v in vars(mod).values() if isinstance(v, types.ModuleType)]:
                    if callable(getattr(owner, name, None)) and (id(owner), name) not in seen:
                        seen.add((id(owner), name))
                        places.append((owner, name))
        _PLACES[key] = places
    return places


def raised_in(exc: BaseException, *where) -> bool:
    """Whether ``exc`` was raised from inside one of ``where`` -- a function's own code, or any code
    of a module -- or from code they called."""
    import types
    codes, files = set(), set()
    for w in where:
        if isinstance(w, types.ModuleType):
            if getattr(w, "__file__", None):
                files.add(w.__file__)
        elif w is not None and getattr(inspect.unwrap(w), "__code__", None) is not None:
            codes.add(inspect.unwrap(w).__code__)
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code in codes or code.co_filename in files:
            return True
        tb = tb.tb_next
    return False


def follow_calls(fn, *matches, depth: int = 3, prefix: str = "sglang."):
    """The first (name, value, globals' module name) one of ``matches(name, value)`` accepts among the
    globals ``fn``'s code names, then those of the ``prefix`` functions it calls, breadth first,
    ``depth`` calls deep: a launch moved into a helper is still found where it now is. Within one
    function the matches are tried in order; a function is searched whole before any it calls, so
    the search never walks into the entry it is looking for."""
    import types
    queue, seen = [(inspect.unwrap(fn), 0)], set()
    while queue:
        func, level = queue.pop(0)
        code = getattr(func, "__code__", None)
        if code is None or id(code) in seen:
            continue
        seen.add(id(code))
        glb = getattr(func, "__globals__", {})
        names = _code_names(code)
        for match in matches:
            for name in names:
                if match(name, glb.get(name)):
                    return name, glb.get(name), glb.get("__name__")
        if level >= depth:
            continue
        for name in names:
            value = glb.get(name)
            if isinstance(value, types.FunctionType) and (value.__module__ or "").startswith(prefix):
                queue.append((value, level + 1))
    return None


def _code_names(code) -> list[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names.extend(n for n in _code_names(const) if n not in names)
    return names
