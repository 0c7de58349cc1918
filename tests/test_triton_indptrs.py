"""``allocation-soundness`` judges the Triton backend's per-request index pointers by their size.

``TritonAttnBackend.__init__`` allocates ``kv_indptr``, ``qo_indptr`` and
``mask_indptr`` once, for every batch its request pool can hold; a TARGET_VERIFY
step fills the first bs + 1 entries of each beside the mask. One sized short
surfaced before only as SGLang raising when a full pool verified (a shape
mismatch in its own copy), never as a property's catch: the last mutation run's
``(max_bs ^ 1,)`` for ``qo_indptr`` (short by two at an odd pool) was such a kill.
Here it must be an allocation-soundness finding naming the buffer, and the same
sizes computed another way must hold.
"""

from __future__ import annotations

import pytest

from vmfuzz.harness.model.allocation import TRITON_INDPTRS, TRITON_INIT, ServerNumbers, indptr_entries
from vmfuzz.harness.properties.allocation import check_triton_indptrs
from vmfuzz.harness.properties.kit import Observation, PropertyFailure
from vmfuzz.harness.targets import resolve
from tests.sglang_copies import altered_copy, failed_check_origin, replay_on_copy, run_on_copy

TRITON = ("srt/layers/attention/triton_backend.py",)
ODD_POOL = ServerNumbers(max_bs=3, context_len=64, num_draft_tokens=4, topk=1, spec_steps=3)
DRIVEN = {"triton": None}


class _Sized:
    """The reference target, with the Triton backend's ``__init__`` sizing its pointers as ``shapes`` say."""

    def __init__(self, shapes):
        self._target, self.shapes = resolve("reference"), shapes

    def __getattr__(self, name):
        return getattr(self._target, name)

    def triton_indptr_buffers(self, numbers):
        return {name: self.shapes.get(name, (indptr_entries(numbers.max_bs),)) for name in TRITON_INDPTRS}


@pytest.mark.parametrize("buffer", TRITON_INDPTRS)
def test_a_pointer_one_entry_short_of_the_pool_is_unsound(buffer):
    with pytest.raises(PropertyFailure) as failed:
        check_triton_indptrs(_Sized({buffer: (3,)}), Observation(), ODD_POOL, DRIVEN)
    o = failed.value.origin
    assert (o.property, o.effect, o.writer, o.buffer, o.cell) == (
        "allocation-soundness", "unsound", TRITON_INIT, buffer, "entries too few"), o


def test_a_longer_pointer_holds_and_the_reference_target_says_it_does_not_drive_them():
    obs = Observation()
    check_triton_indptrs(_Sized({"qo_indptr": (64,)}), obs, ODD_POOL, DRIVEN)
    assert obs.classes == {"triton index pointers"}
    obs = Observation()
    check_triton_indptrs(resolve("reference"), obs, ODD_POOL, resolve("reference").allocating_backends())
    assert obs.classes == {"triton index pointers: not driven (not by this target)"}


def test_sglangs_own_pointers_are_read_at_production_scale(sglang_target):
    big = ServerNumbers(max_bs=1024, context_len=1 << 20, num_draft_tokens=64, topk=1, spec_steps=3)
    assert sglang_target.triton_indptr_buffers(big) == {name: (1025,) for name in TRITON_INDPTRS}
    obs = Observation()
    check_triton_indptrs(sglang_target, obs, big, sglang_target.allocating_backends())
    assert obs.classes == {"triton index pointers"}


_QO = r"(self\.qo_indptr = torch\.zeros\(\n\s+)\(max_bs \+ 1,\)"
_MASK = r"(self\.mask_indptr = torch\.zeros\(\n\s+)\(max_bs \+ 1,\)"
ODD = {"mode": "FULL_MASK", "max_bs": 3, "max_context_len": 8, "num_draft_tokens": 2, "topk": 1, "spec_steps": 1}

#: name -> (edit, the buffer the finding must name)
MUTANTS = {
    # the mutation run's kill by raising: even pools are unchanged, an odd one two entries short
    "qo-indptr-xor-one": ((TRITON, _QO, r"\1(max_bs ^ 1,)"), "qo_indptr"),
    "mask-indptr-one-short": ((TRITON, _MASK, r"\1(max_bs,)"), "mask_indptr"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MUTANTS))
def test_a_short_triton_pointer_is_caught_by_its_size_not_by_sglang_raising(sglang_target, name, tmp_path):
    edit, buffer = MUTANTS[name]
    proc, out = replay_on_copy(altered_copy(tmp_path, [edit], name), tmp_path, ODD, [1, 1, 1],
                               "allocation-soundness")
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "report", out)
    assert (o["property"], o["effect"], o["writer"], o["buffer"], o["cell"]) == (
        "allocation-soundness", "unsound", TRITON_INIT, buffer, "entries too few"), out


@pytest.mark.slow
def test_the_same_pointer_sizes_computed_another_way_hold(sglang_target, tmp_path):
    site = altered_copy(tmp_path, [(TRITON, _QO, r"\1(1 + max_bs,)"), (TRITON, _MASK, r"\1[max_bs + 1]")],
                        "triton-pointer-sizes-refactored")
    proc, out = run_on_copy(site, tmp_path, "run", "--target", "sglang", "--seed", "1", "--max-examples", "10",
                            "--isolate", "off", "--property", "allocation-soundness",
                            "--report-dir", str(tmp_path / "report"))
    assert proc.returncode == 0, out
