"""Each pinned SGLang release's sources, read without installing it: do vmfuzz's stand-ins answer what they ask?

``scripts/release_matrix.sh`` installs each release and runs vmfuzz on it (minutes a
release, nightly). This is the cheap part of it that fits every CI run: each
release's wheel (``pip download --no-deps sglang==V``, the same registry
``install_sglang.sh`` uses) is opened as a zip and its Python parsed, never
imported. For every backend vmfuzz builds by its own ``__init__`` over the
stand-in runner (``allocation.BUILT_BY_INIT``, and the parents of their chains),
the names that ``__init__`` -- and the module's functions it calls, followed
call by call -- reads off ``server_args``, off the ``model_runner`` and off its
``model_config`` must be names the stand-ins carry (``backend_init``): a name
they lack is exit 3 on that release. And every method the Triton backend's
module calls on a batch's KV-id view (``index_table.X(...)``) must be callable on
the stand-in view (``seams.TranslatesNothing``): a field that is not is a raise
SGLang never made. Both regressions of 0.5.17 and 0.5.19 (``docs/releases.md``)
were of these two kinds; ``test_the_reads_catch_*`` plant each in the stand-ins.

What is read is reached only through reads written as ``server_args.X``,
``model_runner.X`` and ``model_runner.model_config.X``: a read through another
local name is left to the matrix.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from vmfuzz.harness.model.allocation import ServerNumbers
from vmfuzz.harness.targets.sglang import backend_init
from vmfuzz.harness.targets.sglang.allocation import BUILT_BY_INIT, SITES
from vmfuzz.harness.targets.sglang.seams import TranslatesNothing
from tests.helpers import REQUIRE_SGLANG, ROOT

PINS = ROOT / "scripts" / "sglang" / "pins"
RELEASES = sorted((p.stem for p in PINS.glob("[0-9]*.txt")), key=lambda v: tuple(int(x) for x in v.split(".")))
_ATTN = "sglang/srt/layers/attention/"
NUMBERS = ServerNumbers(max_bs=4, context_len=64, num_draft_tokens=5, topk=2, spec_steps=3)


#: the parent whose ``__init__`` the MLA backends built by theirs run first (``backend_init.CHAINS``)
PARENTS = (("flashinfer_mla_backend", "FlashInferMLAAttnBackend"),)


def _classes() -> list[tuple[str, str]]:
    """(module under layers/attention, class) of each backend built by ``__init__``, and their parents."""
    return [SITES[name] for name in BUILT_BY_INIT] + list(PARENTS)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, zipfile.ZipFile]:
    where = tmp_path_factory.mktemp("wheels")
    found = {}
    for v in RELEASES:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                            "--disable-pip-version-check", "-q", f"sglang=={v}", "-d", str(where / v)],
                           capture_output=True, text=True, timeout=300)
        got = list((where / v).glob("sglang-*.whl"))
        if r.returncode or not got:
            why = f"pip download sglang=={v}: {(r.stderr or r.stdout).strip()[-500:]}"
            if REQUIRE_SGLANG:
                pytest.fail(why)
            pytest.skip(why)
        found[v] = zipfile.ZipFile(got[0])
    return found


def _reads(fn: ast.FunctionDef, functions: dict[str, ast.FunctionDef]) -> set[str]:
    """``server_args.X``, ``model_runner.X`` and ``model_runner.model_config.X`` read in ``fn`` and in the
    module functions it calls, as 'server_args.X', 'runner.X' and 'model_config.X'."""
    names, todo, seen = set(), [fn], set()
    while todo:
        f = todo.pop()
        if f.name in seen:
            continue
        seen.add(f.name)
        for node in ast.walk(f):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions:
                todo.append(functions[node.func.id])
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id == "server_args" or (
                    isinstance(owner, ast.Attribute) and owner.attr == "server_args"):
                names.add("server_args." + node.attr)
            elif isinstance(owner, ast.Name) and owner.id == "model_runner" and node.attr != "server_args":
                names.add("runner." + node.attr)
            elif (isinstance(owner, ast.Attribute) and owner.attr == "model_config"
                  and isinstance(owner.value, ast.Name) and owner.value.id == "model_runner"):
                names.add("model_config." + node.attr)
    return names


def _carried(runner: SimpleNamespace) -> set[str]:
    return ({"server_args." + k for k in vars(runner.server_args)} | {"runner." + k for k in vars(runner)}
            | {"model_config." + k for k in vars(runner.model_config)})


def missing_in_inits(wheel: zipfile.ZipFile, runner: SimpleNamespace) -> dict[str, list[str]]:
    """class -> the names its ``__init__`` reads that the stand-in ``runner`` does not carry."""
    out = {}
    for module, cls in _classes():
        try:
            tree = ast.parse(wheel.read(f"{_ATTN}{module}.py"))
        except KeyError:
            continue  # not in this release: the target says so (not driven), no stand-in is asked
        functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == cls:
                inits = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"]
                lacking = sorted(_reads(inits[0], functions) - _carried(runner)) if inits else []
                if lacking:
                    out[cls] = lacking
    return out


def uncallable_view_methods(wheel: zipfile.ZipFile, view) -> list[str]:
    """The methods the Triton backend's module calls on a KV-id view (``index_table.X(...)``) that ``view``
    cannot call."""
    tree = ast.parse(wheel.read(f"{_ATTN}triton_backend.py"))
    called = {node.func.attr for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "index_table"}
    return sorted(name for name in called if not callable(getattr(view, name, None)))


def _view():
    return TranslatesNothing().index_table_for_batch(SimpleNamespace())


def test_every_release_finds_what_its_backends_init_reads_on_the_stand_in_runner(wheels):
    runner = backend_init.model_runner(NUMBERS)
    lacking = {v: m for v, w in wheels.items() if (m := missing_in_inits(w, runner))}
    assert not lacking, f"the stand-in runner lacks what these releases' __init__ read (exit 3 there): {lacking}"


def test_every_release_can_call_what_it_calls_on_the_stand_in_kv_id_view(wheels):
    lacking = {v: m for v, w in wheels.items() if (m := uncallable_view_methods(w, _view()))}
    assert not lacking, f"the stand-in KV-id view cannot call what these releases call on it: {lacking}"


def test_the_reads_catch_a_server_arg_the_stand_in_lacks(wheels):
    """0.5.17's FlashAttention asks server_args for enable_prefill_cp through a module helper."""
    runner = backend_init.model_runner(NUMBERS)
    del runner.server_args.enable_prefill_cp
    got = missing_in_inits(wheels["0.5.17"], runner)
    assert "server_args.enable_prefill_cp" in got.get("FlashAttentionBackend", []), got


def test_the_reads_catch_a_kv_id_view_method_the_stand_in_answers_with_none(wheels):
    """0.5.19's window gather calls its view's sliding_window_read_ids()."""

    class AnswersNone:
        def __getattr__(self, name):
            return None

    assert "sliding_window_read_ids" in uncallable_view_methods(wheels["0.5.19"], AnswersNone())
