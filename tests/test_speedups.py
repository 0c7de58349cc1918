"""What the harness does to run faster answers exactly as the slow way did."""

from __future__ import annotations

import sys
import types

import pytest

from vmfuzz.harness.targets.sglang import interpreter_speed


def test_the_interpreter_dtype_table_answers_as_tritons_own():
    tl = pytest.importorskip("triton.language")
    from triton.runtime import interpreter
    assert interpreter_speed.install()
    fast = interpreter._get_np_dtype
    assert fast._vmfuzz_table and fast is not fast.original
    assert interpreter_speed.install()  # a second install keeps the first
    assert interpreter._get_np_dtype is fast
    for t in [tl.int1, tl.int32, tl.uint8, tl.uint64, tl.float64, tl.bfloat16, tl.float8e4nv,
              tl.pointer_type(tl.int64), tl.block_type(tl.float32, [8]), tl.block_type(tl.pointer_type(tl.int1), [2])]:
        assert fast(t) == fast.original(t), t
    with pytest.raises(KeyError):  # a type Triton's own table lacks is refused the same way
        fast.original(tl.void)
    with pytest.raises(KeyError):
        fast(tl.void)


def test_default_layout_holders_follow_a_module_imported_later(sglang_target):
    from vmfuzz.harness.targets.sglang import call_sites
    sg = sglang_target.sglang
    caller = sg.maybe_create
    before = call_sites.default_layout_holders(sg, caller)
    assert before, "SGLang holds its default-layout function somewhere"
    fn = getattr(before[0][0], before[0][1])
    late = types.ModuleType("sglang._vmfuzz_late_holder")
    late.default_tree_mask_mode = fn
    sys.modules[late.__name__] = late
    try:
        during = call_sites.default_layout_holders(sg, caller)
        assert (late, "default_tree_mask_mode") in during
        late.default_tree_mask_mode = None  # a holder that stops holding it is dropped too
        assert (late, "default_tree_mask_mode") not in call_sites.default_layout_holders(sg, caller)
    finally:
        del sys.modules[late.__name__]
    assert call_sites.default_layout_holders(sg, caller) == before
