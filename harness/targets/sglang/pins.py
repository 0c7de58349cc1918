"""The packages the code under test pins, against what this environment has: the culprit when it cannot load.

A checkout of an older SGLang pins its own dependencies (``transformers==5.12.1``,
``xgrammar==0.2.7``) in ``python/pyproject.toml``; the environment vmfuzz runs in
has whatever the last install left. When the checkout then fails to import, the
cause is that pin, not vmfuzz and not SGLang's code: the run could not check
(exit 3), and the line names the package, what the checkout pins and what is
installed (``CannotLoad``).

A pin is blamed only where the failure passed through that package (its module
is the one an ``ImportError`` names, or one of its frames is on the raise's
path): most of a release's pins are never met on this CPU host (CUDA kernels,
a server's extras), and a pin unmet but not involved blames nothing.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from vmfuzz.harness.model.errors import CannotLoad

#: what never counts as a dependency's frame: the code under test itself, Python's import machinery, vmfuzz
_NOT_A_DEPENDENCY = {"sglang", "importlib", "vmfuzz", "builtins", "__main__"}


def _normal(name: str) -> str:
    """PEP 503's normal form: ``Flash_Attn-4`` and ``flash-attn-4`` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _project_file(package: Path) -> Path | None:
    """The ``pyproject.toml`` beside the package (a checkout's ``python/``), or None."""
    path = Path(package).parent / "pyproject.toml"
    return path if path.is_file() else None


def pinned(package: Path) -> dict[str, object]:
    """normal name -> the requirement (``packaging.requirements.Requirement``) the code under test at
    ``package`` declares for it: its project file's dependencies, markers evaluated for this
    environment (a requirement for another platform is not this one's)."""
    import tomllib

    from packaging.requirements import InvalidRequirement, Requirement
    where = _project_file(package)
    if where is not None:
        try:
            deps = tomllib.loads(where.read_text(encoding="utf-8")).get("project", {}).get("dependencies", [])
        except (OSError, ValueError):
            return {}
    else:
        deps = _installed_requirements(package)
    out = {}
    for text in deps if isinstance(deps, list) else []:
        try:
            req = Requirement(str(text))
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        out[_normal(req.name)] = req
    return out


def _installed_requirements(package: Path) -> list[str]:
    """An installed SGLang's own requirements (its distribution's metadata), when ``package`` is the
    folder that distribution installed; none otherwise (a copy elsewhere pins nothing we can read)."""
    try:
        dist = metadata.distribution("sglang")
        mine = Path(dist.locate_file("sglang")).resolve() == Path(package).resolve()
    except (metadata.PackageNotFoundError, OSError):
        return []
    return list(dist.requires or []) if mine else []


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def unmet(req) -> str | None:
    """``transformers pinned ==5.12.1, installed 5.19.0`` (or ``not installed``); None when this
    environment meets the requirement."""
    have = _installed(req.name)
    if have is not None and (not req.specifier or req.specifier.contains(have, prereleases=True)):
        return None
    spec = str(req.specifier) or "(any version)"
    return f"{req.name} pinned {spec}, " + (f"installed {have}" if have else "not installed")


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and all(exc is not s for s in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def modules_on_path(exc: BaseException) -> list[str]:
    """The top-level modules the failure passed through, the likeliest culprit first: the module an
    ``ImportError`` names, then each frame's module, innermost first. SGLang's own, Python's import
    machinery and vmfuzz's are left out."""
    named, frames = [], []
    for link in _chain(exc):
        if isinstance(link, ImportError) and link.name:
            named.append(link.name.split(".")[0])
        tb, here = link.__traceback__, []
        while tb is not None:
            name = tb.tb_frame.f_globals.get("__name__") or ""
            here.append(name.split(".")[0])
            tb = tb.tb_next
        frames += reversed(here)
    out = []
    for top in named + frames:
        if top and top not in _NOT_A_DEPENDENCY and not top.startswith("_") and top not in out:
            out.append(top)
    return out


def _distributions(module: str) -> list[str]:
    """The installed distributions that provide ``module``, and the module's own name (a package
    that is not installed provides nothing, and is most often named as it is imported)."""
    provided = metadata.packages_distributions().get(module, [])
    return [*provided, module, module.replace("_", "-")]


def culprit(exc: BaseException, package: Path) -> str | None:
    """The pin at fault for ``exc`` (raised while the code under test at ``package`` was imported):
    ``<pkg> pinned ==X, installed Y`` or ``... not installed``; None when no unmet pin is on its path."""
    pins = pinned(package)
    if not pins:
        return None
    for module in modules_on_path(exc):
        for dist in _distributions(module):
            req = pins.get(_normal(dist))
            if req is not None:
                said = unmet(req)
                if said is not None:
                    return said
    return None


def cannot_load(exc: BaseException, package: Path, what: str) -> CannotLoad | None:
    """``CannotLoad`` naming the pin at fault for ``exc``, raised while ``what`` was imported; None
    when no pin of the code under test explains it (the caller decides what else it is)."""
    pin = culprit(exc, package)
    if pin is None:
        return None
    return CannotLoad(pin, f"importing {what} raised {type(exc).__name__}: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else ""


def sglang_package() -> Path | None:
    """The folder ``import sglang`` loads (or loaded) here, without importing it."""
    loaded = sys.modules.get("sglang")
    if loaded is not None and getattr(loaded, "__path__", None):
        return Path(list(loaded.__path__)[0])
    from importlib.util import find_spec
    try:
        spec = find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])
