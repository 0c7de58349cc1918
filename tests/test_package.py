"""vmfuzz as a user installs it: a wheel built from pyproject.toml, in a fresh venv.

The wheel must carry the saved repros (repro/) and the known findings (known/):
a gate installed without them replayed nothing and said nothing, and the guard
for #33127 silently disappeared. Here the harness is imported from the installed
wheel, never from this checkout: no PYTHONPATH, and the working directory is
outside the checkout (a ``./repro`` there would be found first).
"""

from __future__ import annotations

import ast
import email.parser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers import ROOT, vmfuzz

VERIFY_MASK = "python/sglang/srt/layers/attention/verify_mask.py"
#: what pyproject.toml builds the wheel from
BUILT_FROM = ("pyproject.toml", "README.md", "vmfuzz", "harness", "strategies", "repro", "known", "scripts")


def _checkout_packages() -> set[str]:
    """Every package of the checkout by its installed name: harness/ and strategies/ live under vmfuzz."""
    return {"vmfuzz"} | {".".join(("vmfuzz", *p.parent.relative_to(ROOT).parts))
                         for top in ("harness", "strategies") for p in (ROOT / top).rglob("__init__.py")}


def test_every_package_of_the_checkout_is_listed_for_the_wheel():
    """pyproject.toml lists its packages (so it can map repro/ and known/ in): a new one must be added."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the wheel test checks the same on 3.10
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert _checkout_packages() - listed == set()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """vmfuzz's wheel, built without its dependencies."""
    base = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools leaves build/ behind, whose stale files a later wheel would reuse.
    source = base / "source"
    source.mkdir()
    for name in BUILT_FROM:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "-w", str(base / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (built_wheel,) = (base / "dist").glob("vmfuzz-*.whl")
    return built_wheel


@pytest.fixture(scope="module")
def installed(wheel) -> Path:
    """A fresh venv with vmfuzz's wheel installed; its dependencies (torch...) come from this
    interpreter's site-packages through a path file, which adds a folder but runs none of its
    own path files, so no editable vmfuzz of the checkout comes with them."""
    env_dir = wheel.parents[1] / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # --force-reinstall: pip, run from this interpreter, sees the vmfuzz installed here
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                           "--no-index", "--force-reinstall", str(wheel)], env=_clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (site / "zz_vmfuzz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return wheel


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | {"CI": "true"}


#: imported by the harness, yet installed apart: the sglang target's (vmfuzz install-sglang)
INSTALLED_APART = {"sglang", "triton"}


def _third_party_imports() -> set[str]:
    """The top-level modules the harness and strategies import that are neither stdlib nor their own."""
    found = set()
    for path in [*(ROOT / "harness").rglob("*.py"), *(ROOT / "strategies").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"vmfuzz", "__future__"}


def test_the_wheel_declares_its_runtime_imports_and_no_cuda_stack(wheel):
    """A user's `pip install vmfuzz` gets what the harness imports (and numpy, which torch wants
    at import), and never an nvidia-* package: those come only with a CUDA torch the user chose."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    requires = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    always = {canonicalize_name(r.name) for r in requires if r.marker is None}
    anywhere = {canonicalize_name(r.name) for r in requires}
    assert {"numpy", "torch"} <= always
    imported = {canonicalize_name(m) for m in _third_party_imports() - INSTALLED_APART}
    assert "msgspec" in imported and imported - anywhere == set()
    assert [r for r in anywhere if r.startswith("nvidia")] == []


def test_the_wheel_carries_the_saved_repros_and_known_findings(installed):
    names = set(zipfile.ZipFile(installed).namelist())
    for folder in ("repro", "known"):
        for path in (ROOT / folder).rglob("*.json"):
            assert f"vmfuzz/harness/shipped/{folder}/{path.relative_to(ROOT / folder).as_posix()}" in names
    assert {f"{p.replace('.', '/')}/__init__.py" for p in _checkout_packages()} <= names
    # and the JSON Schemas of the files vmfuzz reads and writes (tests/test_schemas.py)
    assert {f"vmfuzz/harness/schemas/{p.name}" for p in (ROOT / "harness" / "schemas").glob("*.schema.json")} <= names
    # and SGLang's installer with every release's pins, which `vmfuzz install-sglang` runs
    shipped = "vmfuzz/harness/shipped/sglang_install"
    assert f"{shipped}/install_sglang.sh" in names
    assert {f"{shipped}/pins/{p.name}" for p in (ROOT / "scripts" / "sglang" / "pins").glob("*.txt")} <= names


def test_the_wheel_puts_only_vmfuzz_on_the_import_path(installed):
    """One top-level name: harness and strategies are names of other projects on PyPI, and a
    wheel that installed them at the top would overwrite those (or be overwritten)."""
    tops = {n.split("/")[0] for n in zipfile.ZipFile(installed).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"vmfuzz"}, tops
    site = installed.parents[1] / "venv" / "lib"
    (purelib,) = site.glob("python*/site-packages")
    ours = {p.name for p in purelib.iterdir() if p.name.startswith(("vmfuzz", "harness", "strategies"))}
    assert {p for p in ours if not p.endswith(".dist-info")} == {"vmfuzz"}, ours


def test_the_installed_wheel_installs_sglang_with_what_it_ships(installed, tmp_path):
    """From a wheel (no checkout, no scripts/ folder, no .venv): the command finds its shipped
    installer, which reads its shipped pins (an unknown release is refused naming the known ones,
    exit 2, before anything is installed), and the missing-SGLang hint names that command."""
    bin_dir = installed.parents[1] / "venv" / "bin"
    proc = subprocess.run([str(bin_dir / "vmfuzz"), "install-sglang", "--version", "9.9.9", "--check"], cwd=tmp_path,
                          env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "unknown sglang release '9.9.9' (known: 0.5.17" in proc.stderr, proc.stderr
    hint = subprocess.run([str(bin_dir / "python"), "-c", "from vmfuzz.harness.targets.sglang.loader import install_hint, "
                           "installer; print(installer()); print(install_hint())"], cwd=tmp_path, env=_clean_env(),
                          capture_output=True, text=True, check=True).stdout.splitlines()
    assert Path(hint[0]).is_relative_to(bin_dir.parent) and "shipped/sglang_install" in hint[0], hint
    assert "`vmfuzz install-sglang`" in hint[1] and "scripts/" not in hint[1]


@pytest.mark.slow
def test_a_gate_from_the_installed_wheel_replays_the_saved_repro_and_fails(installed, tmp_path):
    """Only capacity-liveness is searched, and it holds on pr33127: exit 1 is the saved repro's."""
    bin_dir = installed.parents[1] / "venv" / "bin"
    where = subprocess.run([str(bin_dir / "python"), "-c", "import vmfuzz.harness; print(vmfuzz.harness.__file__)"],
                           cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, check=True).stdout
    assert Path(where.strip()).is_relative_to(bin_dir.parent), where
    (tmp_path / "changed.txt").write_text(VERIFY_MASK + "\n")
    proc = subprocess.run([str(bin_dir / "vmfuzz"), "gate", "--target", "reference+pr33127",
                           "--changed-files", "changed.txt", "--property", "capacity-liveness",
                           "--report-dir", "out"], cwd=tmp_path, env=_clean_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    saved = [r for r in summary["replays"] if r["source"] == "saved"]
    assert {Path(r["repro"]).name for r in saved} >= {"pr33127.json"}
    assert all("harness/shipped/repro" in Path(r["repro"]).as_posix() for r in saved)
    assert summary["counts"]["replays_failed"] == len(saved) and summary["counts"]["failed"] == 0
    assert summary["warnings"] == [] and "no saved repro" not in proc.stderr


@pytest.mark.slow
def test_a_gate_that_finds_no_saved_repro_says_so(tmp_path):
    (tmp_path / "changed.txt").write_text(VERIFY_MASK + "\n")
    (tmp_path / "empty").mkdir()
    proc = vmfuzz("gate", "--target", "reference", "--changed-files", str(tmp_path / "changed.txt"), "--property", "capacity-liveness",
                  "--repro-root", str(tmp_path / "empty"), "--report-dir", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"vmfuzz: warning: no saved repro found under {tmp_path / 'empty'}" in proc.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["counts"]["replays"] == 0
    assert [w for w in summary["warnings"] if w.startswith("no saved repro found")]
    assert "warning: no saved repro found" in (tmp_path / "out" / "summary.md").read_text()
