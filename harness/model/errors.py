"""Exit codes and the errors that map to them.

They sit at the bottom of the layers so that every layer can raise them and
the command line, at the top, can map each to its exit code.
"""

EXIT_OK, EXIT_FINDING, EXIT_USAGE, EXIT_OUT_OF_STEP = 0, 1, 2, 3
#: the same code: a check vmfuzz could not make (the time cap reached, a seam out of step) is never "held"
EXIT_COULD_NOT_CHECK = EXIT_OUT_OF_STEP


class UsageError(Exception):
    """Bad input or an unavailable target: one line on stderr, exit 2."""


class CapReached(BaseException):
    """A gate's time cap stopped what was running (``vmfuzz.harness.engine.core.clock``). A BaseException:
    no ``except Exception`` that reads a target's raise as a finding may take it for one."""


class HarnessError(RuntimeError):
    """The harness failed, not the target: reported as such (exit 2), never as a finding."""


class OutOfStep(Exception):
    """vmfuzz is out of step with the code under test: a seam's shape does not match (exit 3).

    Raised where a binding fails before the call, or where a patch or stand-in
    the harness put in place was not gone through. It is the harness's own
    state, never a finding, and a property that meets it is never "held".
    It lives here, at the bottom, so targets raise it and properties and the
    engine recognise it (``vmfuzz.harness.targets.protocol`` re-exports it).
    """

    def __init__(self, seam: str, file: str, why: str):
        super().__init__(f"{seam} in {file}: {why}")
        self.seam, self.file, self.why = seam, file, why

    def __reduce__(self):  # crosses the forked worker's pipe intact
        return (OutOfStep, (self.seam, self.file, self.why))


class SetUpRaised(OutOfStep):
    """The code under test raised while vmfuzz built and captured one of its runners (exit 3).

    vmfuzz wires that set-up over stand-ins of the model and the device, so alone the raise
    cannot be told from vmfuzz's own gap: out of step. A gate with a base tells them apart
    (``engine.regression.out_of_step_on_base``): the base, set up the same way on the same case,
    runs it, so the raise is the change's, a finding. ``raised``: (type, innermost frame of the
    code under test, message) of SGLang's own raise, filled by the engine (``failures.own_raise``)
    where the traceback still exists; None when the raise was vmfuzz's wiring or a stand-in's.
    """

    def __init__(self, seam: str, file: str, why: str, raised: tuple[str, str, str] | None = None):
        super().__init__(seam, file, why)
        self.raised = raised

    def __reduce__(self):
        return (SetUpRaised, (self.seam, self.file, self.why, self.raised))


class CannotLoad(OutOfStep):
    """The code under test cannot load in this environment, for a reason outside it and outside
    vmfuzz: a package it pins is missing here, or installed at another version (exit 3).

    Never a finding (SGLang's code did nothing wrong). Met while the target loads, the run's
    verdict says "cannot load the code under test" and names the pin, not vmfuzz. It is an
    ``OutOfStep`` so that, met mid-search (a module imported on first use), every place that
    keeps the harness's own state from becoming a finding keeps this one too. ``why`` names the
    pin (``transformers pinned ==5.12.1, installed 5.19.0``); ``how`` says what raised.
    """

    def __init__(self, why: str, how: str = ""):
        Exception.__init__(self, f"cannot load the code under test: {why}" + (f" ({how})" if how else ""))
        self.seam, self.file, self.why, self.how = "load the code under test", "", why, how

    def __str__(self) -> str:
        return self.args[0]

    def __reduce__(self):
        return (CannotLoad, (self.why, self.how))


def out_of_step_line(exc: "OutOfStep | str") -> str:
    """The one line a command prints when it could not check (exit 3)."""
    return f"vmfuzz: could not check: vmfuzz is out of step with this SGLang: {exc}"


class ImportRaised(Exception):
    """The code under test raised while one of its modules was imported: a server could not load it.

    Decided where the module is imported (``vmfuzz.harness.targets.sglang.imports``),
    before any property is known, so it carries the raise itself (type, the
    innermost frame of the code under test, the module being imported) and
    becomes a finding of whichever property met it: effect raise, stage import.
    It crosses a worker's pipe as itself.
    """

    def __init__(self, module: str, type_name: str, frame: str, message: str):
        super().__init__(f"importing {module} raised {type_name}: {message}")
        self.module, self.type_name, self.frame, self.message = module, type_name, frame, message

    def __reduce__(self):
        return (ImportRaised, (self.module, self.type_name, self.frame, self.message))

    def origin(self, prop: str):
        from vmfuzz.harness.model.origin import Origin
        return Origin(prop, "raise", stage="import", exc_type=self.type_name, frame=self.frame)

    def detail(self) -> str:
        return f"target raised {self.type_name} while {self.module} was imported: {self.message}"
