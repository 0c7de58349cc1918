"""The version of the SGLang code under test, read from that code, and where it was read.

Known findings carry closed version ranges, so a wrong label excuses a defect:
SGLang's own ``__version__`` falls back to the installed distribution's metadata
when the package lacks its generated ``_version.py``, so a checkout or a copy of
newer code would be labelled with whatever release pip installed last.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

UNKNOWN = "unknown"


def code_version(package: Path, imported: str | None) -> tuple[str, str]:
    """(the version of the code in ``package``, where that was read), from that code itself.

    In a git checkout a ``_version.py`` the checkout commits is its own; else ``git
    describe`` decides (a tag, or past it ``TAG.postN+gSHA``: newer than the tag, so a
    range closed at the tag no longer applies), since a generated, uncommitted
    ``_version.py`` there dates from the checkout's install, not from its code.
    Elsewhere a built package's ``_version.py`` is its own. Without either, a static
    version in the project's ``pyproject.toml`` beside the package is read. With
    none of these the version is unknown and no known entry with a closed range applies.
    """
    root = next((p for p in (package.parent, package.parent.parent) if (p / ".git").exists()), None)
    if root is not None and _committed(root, package / "_version.py"):
        return imported or UNKNOWN, f"the _version.py committed in the checkout at {root}"
    if root is not None:
        described = _git_described(root)
        if described is not None:
            return described, f"git describe in the checkout at {root}"
    elif (package / "_version.py").is_file():
        return imported or UNKNOWN, "the package's generated _version.py"
    stated = _pyproject_version(package.parent / "pyproject.toml")
    if stated is not None:
        return stated, f"the version in {package.parent / 'pyproject.toml'}"
    if root is not None:
        return UNKNOWN, (f"the checkout at {root} has no release tag git can describe and no static version "
                         "in its pyproject.toml")
    return UNKNOWN, (f"{package} has no generated _version.py, no checkout around it and no static version in a "
                     f"pyproject.toml: its __version__ ({imported or 'none'}) is the installed distribution's, "
                     "not this code's")


def _committed(root: Path, path: Path) -> bool:
    """Is ``path`` a file the checkout at ``root`` tracks (not one its install generated)?"""
    if not path.is_file():
        return False
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "--error-unmatch", "--", str(path)],
                             capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


def _git_described(root: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), "describe", "--tags", "--long", "--dirty", "--match", "v[0-9]*"],
                             capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.fullmatch(r"v(\d[\w.]*)-(\d+)-g([0-9a-f]+)(-dirty)?", out.stdout.strip()) if out.returncode == 0 else None
    if m is None:
        return None
    tag, past, sha, dirty = m.group(1), int(m.group(2)), m.group(3), bool(m.group(4))
    if past == 0 and not dirty:
        return tag
    return f"{tag}.post{past}+g{sha}{'.dirty' if dirty else ''}"


def _pyproject_version(path: Path) -> str | None:
    """``[project] version`` of SGLang's own pyproject.toml; None when dynamic, absent or another project's."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: no reader, so no version from here (unknown is the safe side)
        return None
    try:
        if not path.is_file():
            return None
        project = tomllib.loads(path.read_text()).get("project", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    version = project.get("version")
    if project.get("name") != "sglang" or not isinstance(version, str) or not version.strip():
        return None
    return version.strip()
