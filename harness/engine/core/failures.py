"""Any exception a check ends with, as the finding it is: a typed origin and a sentence.

Every place that runs a check (the search, a replay, the minimizer, a known
entry's replay, the exhaustive sweep, a bisect step) turns what it caught into
a failure here, so a raise is named the same way wherever it was seen: its
exception type and the innermost frame of the code under test, never its text.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter

from vmfuzz.harness.model import consultation
from vmfuzz.harness.model.errors import ImportRaised, OutOfStep, SetUpRaised
from vmfuzz.harness.model.origin import Origin
from vmfuzz.harness.properties.kit import PropertyFailure

#: vmfuzz's own package folder: frames inside it are the harness's, not the code under test's
_HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: inside it, the reference target and its planted variants: the code under test when they are the target
_REFERENCE = (os.path.join(_HERE, "targets", "reference") + os.sep, os.path.join(_HERE, "targets", "variants.py"))


class TargetFault(Exception):
    """The worker died or stopped answering while checking one case."""

    def __init__(self, kind: str, detail: str, *, stopped: bool = False):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail
        #: the check was stopped rather than ended: its timeout ran out, or SIGKILL came from outside
        #: (the OOM killer, a runner's cancel) on each try; what it would have come to is unknown
        self.stopped = stopped

    def __reduce__(self):
        return (_fault, (self.kind, self.detail, self.stopped))


def _fault(kind: str, detail: str, stopped: bool) -> TargetFault:
    return TargetFault(kind, detail, stopped=stopped)


class TargetRaised(Exception):
    """The target raised inside the worker; carries the original type name and the innermost
    frame of the code under test, as the worker saw them (the traceback does not cross)."""

    def __init__(self, type_name: str, message: str, frame: str = ""):
        super().__init__(f"{type_name}: {message}")
        self.type_name, self.frame = type_name, frame

    def __reduce__(self):
        return (TargetRaised, (self.type_name, str(self).split(": ", 1)[-1], self.frame))


def _under_test(filename: str) -> bool:
    """Is this frame's code the code under test's? Generated code (``<...>``: vmfuzz's stack room,
    a dataclass's ``__init__``) names no file of anyone's, and made absolute it would name the
    working directory: never. vmfuzz's own files are the harness's, but for the reference
    target and its planted variants, which are the code under test there."""
    if filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    if path.startswith(_REFERENCE):
        return True
    return not path.startswith(_HERE + os.sep) and "hypothesis" not in path


def raise_place(exc: BaseException | None) -> str:
    """``file:function`` of the innermost frame of the code under test (where it raised): the same
    on every machine and from every working directory, so a raise's group key is too."""
    tb, place = getattr(exc, "__traceback__", None), ""
    while tb is not None:
        code = tb.tb_frame.f_code
        if _under_test(code.co_filename):
            parts = os.path.abspath(code.co_filename).split(os.sep)
            place = f"{'/'.join(parts[-2:])}:{code.co_name}"
        tb = tb.tb_next
    return place


def own_raise(exc: BaseException) -> tuple[str, str, str] | None:
    """The code under test's own raise behind a ``SetUpRaised``: (type, ``raise_place``, message), or
    None when it is no set-up raise, or vmfuzz raised it: its innermost frame is vmfuzz's (a stand-in,
    a call vmfuzz made that does not bind), or no frame of SGLang's package is on its way (vmfuzz's
    wiring calling torch). A raise inside Triton's interpreter, under a kernel SGLang launched, is
    SGLang's, whatever vmfuzz frame (its interpreter speed-ups) lies between. Read where the traceback
    still exists (the checking process); across a pipe the exception carries it (``raised``)."""
    if not isinstance(exc, SetUpRaised):
        return None
    if exc.raised is not None:
        return exc.raised
    cause = exc.__cause__
    package = tuple(os.path.abspath(p) + os.sep for p in getattr(sys.modules.get("sglang"), "__path__", ()))
    frames = [_files(e) for e in _chain(cause)]  # an interpreter's error holds the kernel's own frames behind it
    if not frames or not frames[0] or not _under_test(frames[0][-1]):
        return None
    if not any(os.path.abspath(f).startswith(package + _REFERENCE) for fs in frames for f in fs if f[:1] != "<"):
        return None
    return type(cause).__name__, raise_place(cause), str(cause)[:300]


def _files(exc: BaseException) -> list[str]:
    """The files of ``exc``'s traceback, outermost first."""
    files, tb = [], exc.__traceback__
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    return files


def vouched(exc: BaseException, recorded: Origin | None) -> TargetRaised | None:
    """A set-up raise that a repro's own origin names, as the raise it is: the gate that filed the repro
    saw its base run the case, so it was the change's raise, and replayed it is that raise again, not
    out of step (``vmfuzz replay``, ``bisect``). None for any other out of step, or another raise."""
    raised = own_raise(exc)
    if raised is None or recorded is None or recorded.effect != "raise":
        return None
    return TargetRaised(raised[0], raised[2], raised[1]) if (recorded.exc_type, recorded.frame) == raised[:2] else None


def raise_origin(prop: str, exc: BaseException) -> Origin:
    """The origin of ``exc`` raised by the target while ``prop`` was checked (here or in a worker)."""
    if isinstance(exc, TargetRaised):  # raised in a worker: it sent its type and frame across
        return Origin(prop, "raise", exc_type=exc.type_name, frame=exc.frame)
    return Origin(prop, "raise", exc_type=type(exc).__name__, frame=raise_place(exc))


def raise_detail(exc: BaseException) -> str:
    return f"target raised {exc}" if isinstance(exc, TargetRaised) else f"target raised {type(exc).__name__}: {exc}"


def failure_of(prop: str, exc: BaseException) -> tuple[Origin, str]:
    """(origin, detail) of what a check of ``prop`` ended with (a failure, a fault or a raise)."""
    if isinstance(exc, PropertyFailure):
        return exc.origin, exc.detail
    if isinstance(exc, ImportRaised):
        return exc.origin(prop), exc.detail()
    if isinstance(exc, TargetFault):
        return Origin(prop, exc.kind.removeprefix("target-")), str(exc)
    return raise_origin(prop, exc), raise_detail(exc)


@contextlib.contextmanager
def consulted_check():
    """Runs one check with a ledger of the stand-ins it installs; what it ends with is judged here.

    The one place that decides, for every target and property, whether a failure
    is the code under test's: a raise or a property's failure met while a
    load-bearing stand-in went unread (or after the code asked a stand-in for a
    part it does not provide) was not computed from what the code itself
    produced, so it crosses as ``OutOfStep`` naming that seam (exit 3), never as
    a finding.
    """
    with consultation.ledger() as ledger:
        try:
            yield ledger
        except (Exception, SystemExit) as exc:
            out = out_of_step_of(exc, ledger)
            if out is not None:
                raise out from exc
            raise


def out_of_step_of(exc: BaseException, ledger: consultation.Ledger) -> OutOfStep | None:
    """``exc`` as out of step, when its path crossed a stand-in that was not consulted; else None."""
    if isinstance(exc, SetUpRaised):
        return _stand_in_behind(exc, ledger)
    if isinstance(exc, (OutOfStep, ImportRaised)):
        return None  # already the harness's, or decided where the module was imported
    ending = (f"a property failed ({str(exc)[:300]})" if isinstance(exc, PropertyFailure)
              else f"it raised {type(exc).__name__}: {str(exc)[:300]}")
    for asked in _chain(exc):
        entry = ledger.of(getattr(asked, "obj", None)) if isinstance(asked, AttributeError) else None
        if entry is not None:
            return OutOfStep(entry.seam, entry.file, f"the code under test asked vmfuzz's stand-in for "
                             f"{getattr(asked, 'name', '?')}, which it does not provide, and {ending}")
    unset = [] if isinstance(exc, PropertyFailure) else ledger.read_unset()
    if unset:  # a raise, after SGLang read what its skipped set-up makes and vmfuzz did not
        first = unset[0]
        return OutOfStep(first.seam, first.file, f"the code under test read {', '.join(sorted(first.unset))}, "
                         "which that set-up sets and vmfuzz, building the set-up's values in its place, did not, "
                         f"and {ending}")
    unread = ledger.never_consulted()
    if not unread:
        return None
    first, also = unread[0], "".join(f"; nor {', '.join(e.unread())} of {e.seam}" for e in unread[1:])
    return OutOfStep(first.seam, first.file, f"the code under test never read {', '.join(first.unread())} of "
                     f"vmfuzz's stand-in{also}, so what it did was not computed from them, and {ending}")


def _stand_in_behind(exc: SetUpRaised, ledger: consultation.Ledger) -> OutOfStep | None:
    """A set-up raise that asked a stand-in for a part it lacks, or came after SGLang read what vmfuzz
    left unset, is vmfuzz's own gap (a plain ``OutOfStep`` naming that seam), whatever a base says;
    None keeps it a set-up raise, which a gate's base may show to be the change's."""
    for asked in _chain(exc.__cause__):
        entry = ledger.of(getattr(asked, "obj", None)) if isinstance(asked, AttributeError) else None
        if entry is not None and getattr(asked, "name", None) in entry.lacking:
            return OutOfStep(entry.seam, entry.file, f"the code under test asked vmfuzz's stand-in for "
                             f"{asked.name}, which it does not provide, while {exc.seam} was built")
    unset = ledger.read_unset()
    if unset:
        return OutOfStep(unset[0].seam, unset[0].file, f"the code under test read "
                         f"{', '.join(sorted(unset[0].unset))}, which that set-up sets and vmfuzz did not, "
                         f"and {exc.seam} raised")
    return None


def _chain(exc: BaseException):
    """``exc`` and the exceptions it was raised from or while handling, innermost last."""
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def known_cause(target, prop: str, failure: BaseException) -> str | None:
    """The known entry (``known/``) that names this failure's cause, if the run attached one to ``target``."""
    from vmfuzz.harness.properties.kit import known_as
    return known_as(target, failure_of(prop, failure)[0])


def passed_over_as_known(target, prop: str, failure: BaseException, result) -> bool:
    """A known cause is uninteresting to the search: noted among ``result``'s classes, and Hypothesis
    goes on looking, so a second, new cause of the property is still found (the entry's own replay
    says whether it reproduces)."""
    from hypothesis import event
    name = known_cause(target, prop, failure)
    if name is None:
        return False
    result.classes[f"known finding {name}"] += 1
    event(f"known finding {name}")
    return True


def judged_past_known(target, members, judge, known: dict):
    """``judge(names)``: several properties judged on one run of a case, ``members`` first. A member's
    failure that a known entry names passes the case over for that member alone (counted in ``known``,
    member -> Counter of ``known finding NAME``): the others are judged again without it, so another
    member's new cause on the same case is still found. Raises once every member failed as known, or on
    the first failure that is not known. A raise names no member: the caller judges it for the whole run."""
    names = list(members)
    while True:
        try:
            return judge(names)
        except PropertyFailure as exc:
            name = known_cause(target, exc.prop, exc) if exc.prop in names else None
            if name is None:
                raise
            known.setdefault(exc.prop, Counter())[f"known finding {name}"] += 1
            names.remove(exc.prop)
            if not names:
                raise
