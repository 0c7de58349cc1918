"""Importing SGLang's modules: what an exception while importing one of them means.

Every loader of the sglang target imports through ``sglang_module``, so the
decision is made here and only here. An exception while a module is imported is
one of three things, told apart by where it was raised, never by its text:

- the module's file does not exist in this release (a ``ModuleNotFoundError``
  for that module or a package above it): ``NotInRelease``, an ``ImportError``
  the caller turns into "not in this release" -- an older SGLang, not a fault;
- SGLang's own code raised (a name or syntax error in a file of the ``sglang``
  package, a sibling import inside ``sglang`` that fails, an assert at module
  level): ``ImportRaised``, a finding (effect raise, stage import) -- a server
  running this code could not load that module either;
- a package the code under test pins (its ``pyproject.toml``) that this
  environment lacks or has at another version, on the failure's path:
  ``CannotLoad``, exit 3 naming the pin (``pins``) -- not vmfuzz's fault;
- anything else (a third-party dependency this CPU host lacks, a library
  raising under SGLang's call, a harness stand-in): ``OutOfStep``, exit 3 --
  vmfuzz cannot load what a server would, so it cannot check it.

None of them is "not drivable here", and none lets a property be "held".
A module SGLang's own code failed to load, or that is not in the release, is
decided once: it is not executed again (a second run of its top level could
fail differently, e.g. on a custom op it registered the first time), so every
caller meets the same answer. Out of step is not kept: it is the host's state,
which a later import (a stand-in installed for it) may no longer meet.
"""

from __future__ import annotations

import importlib
import os

from vmfuzz.harness.model.errors import CannotLoad, ImportRaised
from vmfuzz.harness.model.errors import OutOfStep

PACKAGE = "sglang"

#: module -> the exception its import was decided to be
_DECIDED: dict[str, Exception] = {}


class NotInRelease(ImportError):
    """The module's file is not in this SGLang release."""

    def __init__(self, module: str, missing: str):
        super().__init__(f"{module} is not in this release ({missing} does not exist)")
        self.module, self.missing = module, missing

    def __reduce__(self):
        return (NotInRelease, (self.module, self.missing))


def _in_package(name: str | None) -> bool:
    return bool(name) and (name == PACKAGE or name.startswith(PACKAGE + "."))


def relative_file(module: str) -> str:
    """``sglang.srt.x.y`` -> ``srt/x/y.py``: the file as vmfuzz names SGLang's files."""
    return module.removeprefix(PACKAGE + ".").replace(".", "/") + ".py"


def _chain(exc: BaseException):
    """``exc`` and the exceptions it was raised while handling, innermost cause last."""
    seen = []
    while exc is not None and all(exc is not s for s in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _innermost_frame(exc: BaseException):
    """(module name, ``dir/file.py:function``) of the frame that raised ``exc``, import machinery skipped."""
    tb, found = exc.__traceback__, (None, "")
    while tb is not None:
        code = tb.tb_frame.f_code
        if not code.co_filename.startswith("<frozen importlib"):
            parts = os.path.abspath(code.co_filename).split(os.sep)
            found = (tb.tb_frame.f_globals.get("__name__"), f"{'/'.join(parts[-2:])}:{code.co_name}")
        tb = tb.tb_next
    return found


def _innermost_sglang_module(exc: BaseException) -> str | None:
    """The module of SGLang whose code ran last before ``exc`` (the file that made the failing import)."""
    tb, found = exc.__traceback__, None
    while tb is not None:
        name = tb.tb_frame.f_globals.get("__name__")
        if _in_package(name) and name != PACKAGE:
            found = name
        tb = tb.tb_next
    return found


def decide(module: str, exc: BaseException) -> Exception:
    """What ``exc``, raised while ``module`` (a module of the sglang package) was imported, is."""
    # the file named is the one whose import failed, when SGLang's chain got that far
    seam, file = f"import {module}", relative_file(_innermost_sglang_module(exc) or module)
    if isinstance(exc, ModuleNotFoundError) and exc.name and (module + ".").startswith(exc.name + "."):
        # the module itself, or a package above it, is not there: this release has no such file
        return NotInRelease(module, exc.name)
    pinned = _pin_at_fault(module, exc)
    for link in _chain(exc):
        if isinstance(link, ImportError) and link.name and not _in_package(link.name):
            if pinned is not None:  # a package the code under test pins, missing or at another version
                return pinned
            # a module outside SGLang that this host lacks or that lacks a name SGLang imports
            return OutOfStep(seam, file, f"it imports {link.name}, which does not import here "
                                         f"({type(link).__name__}: {link})")
    if isinstance(exc, SyntaxError) and exc.filename:
        # a syntax error is raised by the compiler, before the file has a frame of its own
        parts = os.path.abspath(exc.filename).split(os.sep)
        if PACKAGE in parts[:-1]:
            return ImportRaised(module, type(exc).__name__, f"{'/'.join(parts[-2:])}:<module>", str(exc))
        return OutOfStep(seam, file, f"{exc.filename} does not compile here ({exc})")
    if isinstance(exc, ImportError) and _in_package(exc.name):
        # a sibling inside SGLang is missing, or lacks the name the importing file asks it for
        where = _innermost_frame(exc)[1]
        return ImportRaised(module, type(exc).__name__, where, str(exc))
    owner, where = _innermost_frame(exc)
    if _in_package(owner):
        return ImportRaised(module, type(exc).__name__, where, str(exc))
    if pinned is not None:
        return pinned
    return OutOfStep(seam, file, f"importing it raised {type(exc).__name__} in {where or 'no frame of SGLang'}, "
                                 f"outside SGLang's code ({exc})")


def _pin_at_fault(module: str, exc: BaseException):
    """``CannotLoad`` when a package the code under test pins, and this environment does not meet,
    is on the failure's path (``pins``); else None."""
    from vmfuzz.harness.targets.sglang.pins import cannot_load, sglang_package
    package = sglang_package()
    return cannot_load(exc, package, module) if package is not None else None


def sglang_module(module: str, importer=importlib.import_module):
    """``module`` imported by ``importer`` (a stand-in-aware import may be passed), or the decided
    exception raised: ``NotInRelease``, ``ImportRaised`` or ``OutOfStep`` (``decide``)."""
    decided = _DECIDED.get(module)
    if decided is not None:
        raise _fresh(decided)
    try:
        return importer(module)
    except (NotInRelease, ImportRaised, OutOfStep, CannotLoad):
        raise  # already decided by a nested import of the same kind
    except Exception as exc:  # noqa: BLE001 - every failure is decided, none is swallowed
        decided = decide(module, exc)
        if not isinstance(decided, (OutOfStep, CannotLoad)):  # the host's state: a later import may differ
            _DECIDED[module] = decided
        raise _fresh(decided) from None


def _fresh(decided: Exception) -> Exception:
    """A new exception equal to ``decided`` (each raise gets its own traceback)."""
    make, args = decided.__reduce__()[:2]
    return make(*args)
