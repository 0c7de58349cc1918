"""Two cache_locs.py mutants a fresh sample left green, shown equivalent beyond the gate's examples.

The seed-20261207 sample (bench/mutation-0.5.23/survivors-seed20261207.md) kept, among others:

- ``assign_extend_cache_locs`` looping ``cdiv(kv_end + kv_start, BLOCK)`` times for ``cdiv(kv_end -
  kv_start, BLOCK)``: every start offset is a length (never negative), so it loops at least as often, and
  each extra pass's mask (``load_offset < kv_end``, the offsets past the last pass) is all false: no load,
  no store.
- ``assign_extend_cache_locs_uniform_func`` handing ``num_v_pages=-1`` for 0 when there is no page table:
  the kernel reads it only under ``if full_v2p is not None``, a branch Triton settles per launch.

``tests/cache_locs_scope.py`` runs both kernels over 656 small shapes (variable-length batches of 1-3
requests across block edges; the uniform launch with and without page tables, positions and anchors)
on the pristine copy and on each mutant: every output, and every cell around it, is the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import sglang_or_skip
from tests.sglang_copies import script_on_copy

KERNELS = ["kernels/ops/speculative/cache_locs.py"]
MUTANTS = {
    "extend-loops-start-plus-end": [(KERNELS, r"num_loop = tl\.cdiv\(kv_end - kv_start, BLOCK_SIZE\)",
                                     "num_loop = tl.cdiv(kv_end + kv_start, BLOCK_SIZE)")],
    "no-page-table-minus-one-pages": [(KERNELS, r"num_v_pages=0 if full_v2p is None else",
                                       "num_v_pages= -1 if full_v2p is None else")],
}


def _scope(tmp_path: Path, edits, name: str) -> list[str]:
    return script_on_copy(tmp_path, edits, name, "cache_locs_scope.py")


@pytest.mark.slow
def test_both_mutants_give_every_small_shape_the_pristine_outputs(tmp_path):
    sglang_or_skip()
    base = _scope(tmp_path, [], "pristine")
    assert len(base) == 656
    for name, edits in MUTANTS.items():
        assert _scope(tmp_path, edits, name) == base, name
