"""bench/stillborn.py: a mutated Triton kernel is stillborn only when Triton's frontend refuses it.

A stand-in kernel, launched once in Triton's interpreter with its types recorded,
is compiled to TTIR for CUDA: pointer arithmetic turned into ``**`` is refused,
an offset changed by one compiles (it stays a raising kill where it raised).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import stillborn  # noqa: E402

pytest.importorskip("triton")

KERNEL = '''import triton
import triton.language as tl


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + i, tl.load(src + i, i < n), i < n)


def copy(src, dst):
    _copy_kernel[(triton.cdiv(src.numel(), 4),)](src, dst, src.numel(), BLOCK=4)
'''
LINE = 8  # the kernel's load and store
LAUNCH = '''import sys, torch
sys.path.insert(0, sys.argv[2])
import stillborn
stillborn.record(__import__("pathlib").Path(sys.argv[1]))
import kernel
kernel.copy(torch.arange(6, dtype=torch.int32), torch.zeros(6, dtype=torch.int32))
'''


@pytest.fixture
def recorded(tmp_path):
    """The stand-in kernel launched once in Triton's interpreter, its launch recorded."""
    (tmp_path / "kernel.py").write_text(KERNEL)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(tmp_path))
    subprocess.run([sys.executable, "-c", LAUNCH, str(tmp_path / "launches.jsonl"), str(BENCH)], env=env,
                   cwd=tmp_path, check=True, capture_output=True)
    runs = stillborn.launches(tmp_path / "launches.jsonl", tmp_path / "kernel.py")
    assert [r["signature"] for r in runs] == [{"src": "*i32", "dst": "*i32", "n": "i32", "BLOCK": "constexpr"}]
    return tmp_path, runs


def _mutant(tmp_path: Path, old: str, new: str) -> Path:
    path = tmp_path / "mutant" / "kernel.py"
    path.parent.mkdir(exist_ok=True)
    assert old in KERNEL
    path.write_text(KERNEL.replace(old, new, 1))
    return path


def test_pointer_arithmetic_turned_into_a_power_is_refused_by_tritons_frontend(recorded):
    tmp_path, runs = recorded
    said = stillborn.verdict(_mutant(tmp_path, "src + i", "src ** i"), tmp_path / "kernel.py", runs, [LINE])
    assert said.startswith("refused: _copy_kernel"), said


def test_a_mutated_kernel_the_frontend_accepts_is_not_stillborn(recorded):
    tmp_path, runs = recorded
    said = stillborn.verdict(_mutant(tmp_path, "src + i", "src + i + 1"), tmp_path / "kernel.py", runs, [LINE])
    assert said == "compiles", said


def test_a_mutation_outside_any_kernel_is_not_decided(recorded):
    tmp_path, runs = recorded
    said = stillborn.verdict(_mutant(tmp_path, "BLOCK=4)", "BLOCK=8)"), tmp_path / "kernel.py", runs, [13])
    assert said.startswith("not decided"), said
