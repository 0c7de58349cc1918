"""Finding SGLang's verify-mask code in the installed package, once, at load.

SGLang 0.5.17 ... 0.5.23 differ in where the kernel entry lives and what the
platform dispatch is called; the pre-#33127 API shape takes
``fits(bs, num_draft_tokens)`` and keeps ``max_context_len`` in the struct.
Both are detected from signatures and struct fields, never from version strings.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch

from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang.code_version import code_version
from vmfuzz.harness.targets.sglang.reach import follow_calls
from vmfuzz.harness.targets.sglang.structs import fields_of

#: Finding modules drives no verify-mask code by itself (see call_sites, writers, target).
SURFACE: tuple = ()

def installer() -> Path | None:
    """SGLang's installer and its pins wherever vmfuzz runs from: a wheel carries them as
    ``harness/shipped/sglang_install`` (pyproject.toml maps ``scripts/sglang`` there), a
    source checkout has them in ``scripts/sglang``. None when this installation lost both."""
    package = Path(__file__).resolve().parents[2]  # harness/targets/sglang/ -> harness/
    for place in (package / "shipped" / "sglang_install", package.parent / "scripts" / "sglang"):
        if (place / "install_sglang.sh").is_file():
            return place / "install_sglang.sh"
    return None


def install_hint(found: Path | None = None, *, look: bool = True) -> str:
    """How to get SGLang for this target, naming only what this installation has: the command
    runs the installer it ships (a wheel has no scripts/ folder to point at)."""
    if found is None and look:
        found = installer()
    if found is not None:
        return ("install it with `vmfuzz install-sglang` (sglang==0.5.23 --no-deps and its CPU import chain, "
                "into this Python's environment; --version V for another release)")
    return ("install sglang==0.5.23 with `pip install --no-deps sglang==0.5.23` (its own requirements pull a "
            "CUDA torch), then the modules its import needs (this installation of vmfuzz lost its installer)")


INSTALL_HINT = install_hint()

#: Where the wrapper hands over to the kernel, by the names releases used:
#: 0.5.23 dispatches through a function imported from spec_tree; older wheels
#: call a module global directly in their platform switch (the CUDA/default
#: branch, which a host with no platform flag set also takes, though on CPU
#: the name is never defined). Any other global of the wrapper's whose
#: signature names the tree kernel's buffers is found too (``_kernel_entry``).
KERNEL_ENTRIES = ("build_tree_kernel_efficient_func", "sgl_build_tree_kernel_efficient")



class Sglang(SimpleNamespace):
    """The SGLang modules and callables the adapter drives, found once at load."""

    def pp(self) -> SimpleNamespace:
        """The pipeline-parallel call site's modules, imported on first use.

        The scheduler mixin pulls in the disaggregation and distributed stacks
        (~4 s); a run that never draws the pp call site does not pay for it.
        """
        if getattr(self, "_pp", None) is None:
            with _quiet_import():
                module = _call_site_module("sglang.srt.managers.scheduler_pp_mixin", "the pp call site")
                relay = _call_site_module("sglang.srt.speculative.pp_spec_relay", "the pp call site")
            self._pp = SimpleNamespace(module=module, mixin=module.SchedulerPPMixin,
                                       relay=relay.PPSpecRelayInput)
        return self._pp

    def frozen(self) -> SimpleNamespace:
        """The frozen-KV MTP worker's module, imported on first use (it pulls in the
        scheduler and TP worker stacks, which a run that never draws it need not pay for)."""
        if getattr(self, "_frozen", None) is None:
            with _quiet_import():
                what = "the frozen-KV MTP call site"
                module = _call_site_module("sglang.srt.speculative.frozen_kv_mtp_worker_v2", what)
                info = _call_site_module("sglang.srt.speculative.frozen_kv_mtp_info", what)
            self._frozen = SimpleNamespace(module=module, worker=module.FrozenKVMTPDraftWorker,
                                           draft_input=info.FrozenKVMTPDraftInput)
        return self._frozen


def _call_site_module(name: str, what: str):
    """A call site's module (``imports.sglang_module``: SGLang's own raise is a finding, anything else
    out of step); one this release lacks was never offered as a call site, so asking is out of step."""
    from vmfuzz.harness.targets.sglang.imports import NotInRelease, relative_file, sglang_module
    try:
        return sglang_module(name)
    except NotInRelease as exc:
        raise OutOfStep(what, relative_file(name), str(exc)) from None


@contextlib.contextmanager
def _quiet_import():
    """SGLang's import chain warns about every accelerator it cannot find; a run's
    output should hold findings, not that."""
    logger = logging.getLogger("sglang")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _triton_compiled_not_interpreted() -> bool:
    """Triton decorates its own library (``tl.cdiv``, the reductions' combiners) when it is first
    imported: imported without the interpreter switch, those stay compiled-only functions, and an
    interpreted kernel that calls one raises at its first launch."""
    standard = sys.modules.get("triton.language.standard")
    cdiv = getattr(standard, "cdiv", None)
    return cdiv is not None and type(cdiv).__name__ == "JITFunction"


#: environment switches this loader sets before SGLang's kernels import, which a package reads when it
#: is itself first imported: a process that preloads such a package (the bisect's zygote) sets them first
IMPORT_SWITCHES = ("TRITON_INTERPRET",)


def needs_interpreter(kernel_choice: str = "triton") -> bool:
    """Will this host run SGLang's Triton kernels in Triton's interpreter (no CUDA device)?"""
    return kernel_choice != "jit" and not torch.cuda.is_available()


def preload_mismatch() -> str | None:
    """Why triton, already imported in this process (a zygote's preload), is not the triton a cold
    run of this target would import here; None when it is, or when triton is not yet imported."""
    kernel_choice = os.environ.get("VMFUZZ_SGLANG_KERNEL", "triton")
    standard = sys.modules.get("triton.language.standard")
    cdiv = getattr(standard, "cdiv", None)
    if cdiv is None:
        return None
    interpreted = type(cdiv).__name__ == "InterpretedFunction"
    if needs_interpreter(kernel_choice) and not interpreted:
        return "triton was preloaded compiled, and this host needs its interpreter (no CUDA device)"
    if not needs_interpreter(kernel_choice) and interpreted and os.environ.get("TRITON_INTERPRET") != "1":
        return "triton was preloaded for its interpreter, and this run compiles its kernels"
    return None


def _interpret_kernels() -> None:
    """No CUDA device: SGLang's Triton kernels run in Triton's interpreter. triton.jit picks
    the interpreter at decoration time, i.e. when a kernel's module is imported, so the switch
    must be set before SGLang's kernels, and Triton's own library, are imported."""
    if "sglang.kernels.ops.speculative.spec_tree" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise ImportError("SGLang's kernels were imported before TRITON_INTERPRET=1 was set; "
                          "no CUDA device here, so they cannot run")
    if _triton_compiled_not_interpreted():
        raise ImportError("triton was imported before TRITON_INTERPRET=1 was set, so its own library "
                          "functions cannot run in the interpreter; set TRITON_INTERPRET=1 before "
                          "anything imports triton (no CUDA device here)")
    os.environ["TRITON_INTERPRET"] = "1"
    from vmfuzz.harness.targets.sglang import fork_ready, interpreter_speed
    interpreter_speed.install()
    fork_ready.compiled_as_python()


def import_sglang(kernel_choice: str) -> Sglang:
    if os.environ.get("SGLANG_USE_CPU_ENGINE"):
        # With it set, SGLang takes its CPU-engine branch and imports sgl_kernel's
        # CPU ops, which are not the code this target guards.
        raise ImportError("SGLANG_USE_CPU_ENGINE is set; unset it so SGLang's Triton/CUDA kernels load")
    if needs_interpreter(kernel_choice):
        _interpret_kernels()
    names = {
        "verify_mask": "sglang.srt.layers.attention.verify_mask",
        "eagle_utils": "sglang.srt.speculative.eagle_utils",
        "call_site": "sglang.srt.speculative.eagle_worker_common",
        "worker_v2": "sglang.srt.speculative.eagle_worker_v2",
        "forward_info": "sglang.srt.model_executor.forward_batch_info",
    }
    from vmfuzz.harness.targets.sglang.imports import NotInRelease, sglang_module
    mods = {}
    with _quiet_import():
        try:
            # The package itself not loading is no SGLang here (exit 2), unless a package it pins is
            # what failed (exit 3, naming it); what its modules raise is decided by where
            # (imports.decide): SGLang's own code a finding, a pin the culprit, anything else out of step.
            importlib.import_module("sglang")
        except Exception as exc:  # noqa: BLE001 - one line: SGLang is not available here
            from vmfuzz.harness.targets.sglang.pins import cannot_load, sglang_package
            package = sglang_package()
            pinned = cannot_load(exc, package, "sglang") if package is not None else None
            if pinned is not None:
                raise pinned from None
            raise ImportError(f"sglang: {type(exc).__name__}: {exc}") from None
        for key, name in names.items():
            try:
                mods[key] = sglang_module(name)
            except NotInRelease as exc:  # not an SGLang with the modules this target drives
                raise ImportError(str(exc)) from None
    try:
        spec_tree = sglang_module("sglang.kernels.ops.speculative.spec_tree")
    except NotInRelease:
        spec_tree = None
    try:
        # The chain writer (build_chain_tree) and its Triton kernel; absent
        # before SGLang grew the chain branch.
        chain_mod = sglang_module("sglang.kernels.ops.speculative.eagle")
    except NotInRelease:
        chain_mod = None
    sg = Sglang(**mods, spec_tree=spec_tree, chain_module=chain_mod)
    sg.build_chain_tree = getattr(chain_mod, "build_chain_tree", None)
    sg.chain_launch_name, sg.chain_launch = _chain_launch(sg.build_chain_tree)
    vm, eu = sg.verify_mask, sg.eagle_utils
    for owner, attr in ((vm, "VerifyMask"), (vm, "maybe_create_verify_mask"), (vm, "tree_mask_numel"),
                        (eu, "build_tree_kernel_efficient"), (sg.call_site, "build_eagle_verify_input"),
                        (sg.worker_v2, "EAGLEWorkerV2"), (sg.forward_info, "ForwardMode")):
        if not hasattr(owner, attr):
            raise ImportError(f"{owner.__name__} has no {attr} (not an SGLang with a preallocated verify mask)")
    sg.VerifyMask = vm.VerifyMask
    sg.Mode = getattr(vm, "TreeMaskMode", None) or eu.TreeMaskMode
    # By field names only: whether SGLang declares the struct with msgspec, dataclasses or a plain
    # class is its choice (structs.replaced copies it through whichever it is).
    sg.fields = set(fields_of(sg.VerifyMask, "VerifyMask", "srt/layers/attention/verify_mask.py"))
    sg.fits = sg.VerifyMask.fits
    sg.fits_takes_d, sg.fits_problem = _fits_shape(sg.fits)
    sg.fits_names = _fits_names(sg.fits)
    sg.numel = vm.tree_mask_numel
    sg.maybe_create = vm.maybe_create_verify_mask
    sg.entry, sg.entry_fn = _kernel_entry(eu)
    # The call site calls the wrapper through its own module global when it
    # imported it by name, else through eagle_utils.
    sg.wrapper_owner = sg.call_site if hasattr(sg.call_site, "build_tree_kernel_efficient") else eu
    sg.triton = (getattr(spec_tree, "sgl_build_tree_kernel_triton", None) if spec_tree else None) \
        or getattr(eu, "sgl_build_tree_kernel_triton", None)
    sg.jit = _jit_tree_kernel() if torch.cuda.is_available() else None
    if kernel_choice == "jit" and sg.jit is None:
        raise ImportError("VMFUZZ_SGLANG_KERNEL=jit needs a CUDA device and SGLang's JIT tree kernel")
    # A Triton tree wrapper not found where vmfuzz looks (renamed, moved) is vmfuzz out of
    # step with an SGLang that imported fine, not SGLang missing: the kernel seam says so.
    sg.triton_problem = None if sg.triton is not None else (
        "SGLang's Triton tree wrapper, sgl_build_tree_kernel_triton, is not in "
        + ("kernels/ops/speculative/spec_tree.py" if spec_tree else "srt/speculative/eagle_utils.py")
        + " for vmfuzz to launch")
    return sg


def _jit_tree_kernel():
    """The JIT CUDA tree kernel (a CUDA host only), from whichever package this SGLang keeps it in."""
    for mod, attr in (("sglang.kernels.ops.speculative.tree", "build_tree_kernel_efficient"),
                      ("sgl_kernel", "build_tree_kernel_efficient")):
        try:
            return getattr(importlib.import_module(mod), attr)
        except Exception:  # noqa: BLE001 - the next place it may live
            continue
    return None


def _fits_shape(fits) -> tuple[bool, str | None]:
    """(takes the draft width, why it cannot be bound): read from ``fits``'s parameters by name.

    The first parameter after ``self`` is the batch size; a further *required*
    one is the pre-#33127 draft width when SGLang names it so. Parameters with
    defaults (a keyword-only option added later) are left to their defaults.
    """
    from vmfuzz.harness.targets.sglang.seams import SYNONYMS
    params = list(inspect.signature(fits).parameters.values())[1:]
    required = [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not required:
        return False, "VerifyMask.fits takes no batch size"
    rest = [p.name for p in required[1:]]
    takes_d = bool(rest) and rest[0] in SYNONYMS["d"]
    unknown = rest[1:] if takes_d else rest
    return takes_d, (f"VerifyMask.fits also requires {', '.join(unknown)}, which vmfuzz cannot supply"
                     if unknown else None)


def _fits_names(fits) -> tuple[str | None, str | None]:
    """(batch size, draft width): the names ``fits`` gives its first two required parameters after
    ``self``, so vmfuzz hands them over by name (a ``*`` before them changes nothing)."""
    params = list(inspect.signature(fits).parameters.values())[1:]
    required = [p.name for p in params
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)] + [None, None]
    return required[0], required[1]


def _chain_launch(chain) -> tuple[str | None, object]:
    """(name, kernel): the Triton kernel ``build_chain_tree`` launches, found by following the calls
    its code makes (a renamed kernel, or a launch moved into a helper, is still found): a
    ``kernel[grid](...)`` JIT function."""
    def launches(name, value):
        return callable(getattr(value, "__getitem__", None)) and inspect.isfunction(getattr(value, "fn", None))

    found = follow_calls(chain, launches) if chain else None
    return (found[0], found[1]) if found else (None, None)


def _kernel_entry(eu) -> tuple[str | None, object]:
    """(name, function) through which ``build_tree_kernel_efficient`` hands over to the kernel.

    Found by following the calls the wrapper's code makes (``reach.follow_calls``),
    so an entry reached through a helper of its module, or renamed on import, is
    still found: a known name, or a function whose signature names the kernel's
    output buffers. The function is None where this host never defines the
    entry an older wrapper names (its CUDA import failed).
    """
    def known(name, value):
        return name in KERNEL_ENTRIES and (name == "sgl_build_tree_kernel_efficient" or value is not None
                                           or hasattr(eu, name))

    def writes_the_tree(name, value):
        if not inspect.isfunction(value):
            return False
        try:
            params = set(inspect.signature(value).parameters)
        except (TypeError, ValueError):
            return False
        return {"tree_mask", "positions", "retrieve_next_sibling"} <= params

    wrapper = eu.build_tree_kernel_efficient
    found = follow_calls(wrapper, known, writes_the_tree)
    if found is None:
        return None, None
    name, value, _ = found
    if value is None:
        value = getattr(eu, name, None)
    return name, value


def sg_version() -> str:
    return imported_sglang()[0]


def import_from_checkout(python_dir: Path) -> None:
    """Makes ``import sglang`` load ``python_dir/sglang`` (a checkout's ``python/``).

    First on ``sys.path`` for this process and first on ``PYTHONPATH`` for the
    workers it spawns (forked ones inherit the modules this process imported),
    set before anything imports SGLang. An SGLang already imported from
    elsewhere cannot be swapped out of a running process: ImportError.
    """
    python_dir = Path(python_dir).resolve()
    loaded = sys.modules.get("sglang")
    if loaded is not None:
        where = Path(list(loaded.__path__)[0]).resolve()
        if where != python_dir / "sglang":
            raise ImportError(f"sglang was already imported from {where} before the checkout could be put first")
    if str(python_dir) not in sys.path[:1]:
        sys.path.insert(0, str(python_dir))
    importlib.invalidate_caches()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(python_dir), os.environ.get("PYTHONPATH")]))


def imported_sglang() -> tuple[str, Path]:
    """The SGLang this process imported: its own version (``code_version``) and its folder."""
    version, where, _ = imported_sglang_and_source()
    return version, where


def imported_sglang_and_source() -> tuple[str, Path, str]:
    """The SGLang this process imported: its version, its folder, and where the version was read.

    Never the distribution's metadata: that names whatever pip installed last,
    while a checkout or an altered copy first on the path is what actually runs.
    """
    with _quiet_import():
        import sglang
    version = getattr(sglang, "__version__", None)
    if version is None:
        try:
            version = importlib.import_module("sglang.version").__version__
        except Exception:  # noqa: BLE001 - only describes what was imported
            version = None
    where = Path(list(sglang.__path__)[0]).absolute()
    version, source = code_version(where, str(version) if version else None)
    return version, where, source
