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


def _int32_arithmetic(sanitize: bool):
    """A kernel's int32 add, sub and mul, overflowing ones included, run with the sanitizer on or off."""
    import dataclasses
    import torch
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    @triton.jit
    def arithmetic(a_ptr, b_ptr, out_ptr, n: tl.constexpr):
        i = tl.arange(0, n)
        a = tl.load(a_ptr + i)
        b = tl.load(b_ptr + i)
        tl.store(out_ptr + i, a * b + a - b)
        tl.store(out_ptr + n + i, (a + 7) * (b - 3))

    builder = interpreter.interpreter_builder
    kept = builder.options
    builder.options = dataclasses.replace(kept, sanitize_overflow=sanitize)
    try:
        a = torch.tensor([2**31 - 1, -2**31, 46341, -3, 0, 1 << 20, 12345, -1], dtype=torch.int32)
        b = torch.tensor([2, 2, 46341, 7, -2**31, 1 << 12, -54321, 2**31 - 1], dtype=torch.int32)
        out = torch.zeros(16, dtype=torch.int32)
        arithmetic[(1,)](a, b, out, n=8)
        return a.tolist(), b.tolist(), out.tolist()
    finally:
        builder.options = kept


def test_skipping_the_unread_overflow_checks_changes_no_result(sglang_target):
    from triton.runtime import interpreter
    assert interpreter_speed.install()
    assert interpreter_speed.overflow_checks_skipped(), "Triton's interpreter leaves device_assert unread"
    (a, b, checked), (_, _, unchecked) = _int32_arithmetic(True), _int32_arithmetic(False)
    assert checked == unchecked

    def wrapped(x):  # two's complement int32, as the hardware computes it
        return (x + 2**31) % 2**32 - 2**31
    assert checked == [wrapped(x * y + x - y) for x, y in zip(a, b)] + [wrapped((x + 7) * (y - 3)) for x, y in zip(a, b)]
    assert checked[0] != a[0] * b[0] + a[0] - b[0]  # it did overflow, and neither way raised
    assert not interpreter.interpreter_builder.options.debug


def test_an_assert_that_reads_its_condition_keeps_the_overflow_checks(sglang_target, monkeypatch):
    import dataclasses
    from triton.runtime import interpreter
    builder = interpreter.interpreter_builder
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, sanitize_overflow=True))
    read = []

    def reading(cond, msg, mask):  # a Triton whose interpreter checks the condition even with debug off
        read.append(cond.handle)

    monkeypatch.setattr(interpreter.interpreter_semantic, "device_assert", reading)
    assert not interpreter_speed._skip_unread_overflow_checks()
    assert builder.options.sanitize_overflow and not interpreter_speed.overflow_checks_skipped()
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, debug=True))
    assert not interpreter_speed._skip_unread_overflow_checks()  # debug on: the asserts are read


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


def test_a_functions_signature_is_read_once_and_again_when_it_could_differ():
    from vmfuzz.harness.targets.sglang import seams

    def fn(a, b=1):
        return a + b

    first = seams.signature(fn, "seam", "file.py")
    assert seams.signature(fn, "seam", "file.py") is first and str(first) == "(a, b=1)"
    fn.__defaults__ = (2,)
    assert str(seams.signature(fn, "seam", "file.py")) == "(a, b=2)"

    def other(x, *, y):
        return x

    fn.__wrapped__ = other  # what functools.wraps leaves: inspect follows it
    assert str(seams.signature(fn, "seam", "file.py")) == "(x, *, y)"

    def listed(a, b=[]):  # noqa: B006 - an unhashable default is read afresh, never a crash
        return a
    assert str(seams.signature(listed, "seam", "file.py")) == "(a, b=[])"


def test_a_signature_with_keyword_only_defaults_is_read_once_and_again_when_a_default_changes():
    from vmfuzz.harness.targets.sglang import seams

    def fn(a, *, b=1, c=None):
        return a

    first = seams.signature(fn, "seam", "file.py")
    assert seams.signature(fn, "seam", "file.py") is first and str(first) == "(a, *, b=1, c=None)"
    fn.__kwdefaults__["b"] = 2  # the same dict, changed in place
    assert str(seams.signature(fn, "seam", "file.py")) == "(a, *, b=2, c=None)"
    fn.__kwdefaults__ = {"b": 3, "c": None}
    assert str(seams.signature(fn, "seam", "file.py")) == "(a, *, b=3, c=None)"

    def listed(a, *, b=[]):  # noqa: B006 - an unhashable keyword default is read afresh, never a crash
        return a
    assert str(seams.signature(listed, "seam", "file.py")) == "(a, *, b=[])"


def test_a_bound_methods_signature_is_read_once_for_its_function_and_again_when_it_could_differ():
    from vmfuzz.harness.targets.sglang import seams

    class Backend:
        def init(self, batch, *, in_capture=False):
            return batch

    one, two = Backend(), Backend()
    first = seams.signature(one.init, "seam", "file.py")
    assert str(first) == "(batch, *, in_capture=False)"  # bound: self is not a parameter
    assert seams.signature(two.init, "seam", "file.py") is first  # any instance's bound method
    assert str(seams.signature(Backend.init, "seam", "file.py")) == "(self, batch, *, in_capture=False)"
    Backend.init.__kwdefaults__["in_capture"] = True
    assert str(seams.signature(one.init, "seam", "file.py")) == "(batch, *, in_capture=True)"

    def other(self, batch, extra):
        return batch

    Backend.init = other  # the class's method replaced: its bound methods are the new function's
    assert str(seams.signature(one.init, "seam", "file.py")) == "(batch, extra)"


def test_the_builtins_listed_once_are_tritons_own_scan_and_kernels_answer_the_same():
    import inspect
    pytest.importorskip("triton.language")
    import torch
    import triton
    import triton.language as tl
    from triton.runtime import interpreter
    assert interpreter_speed.install()
    fast = interpreter._patch_builtin
    assert fast._vmfuzz_listed and fast is not fast.original
    for pkg in interpreter_speed._language_modules(interpreter):
        # what Triton's own scan patches now (a jit helper's patch is never put back, so an earlier
        # launch may have left members patched) is what the list patches now
        own = tuple(n for n, m in inspect.getmembers(pkg) if tl.core.is_builtin(m))
        assert tuple(n for n in fast.listed[id(pkg)] if tl.core.is_builtin(getattr(pkg, n, None))) == own, pkg

    kernel = _kernels()

    def run():
        x = torch.arange(8, dtype=torch.int32)
        out = torch.zeros(8, dtype=torch.int32)
        kernel[(1,)](x, out, n=8)
        return out.tolist()

    got = run()
    interpreter._patch_builtin = fast.original
    try:
        assert run() == got  # Triton's own scan, launch after launch, answers the same
    finally:
        interpreter._patch_builtin = fast
    x = list(range(8))
    assert got == [(max(v, 3) + min(v, 5)) * (2 if v > 2 else 1) + sum(x) for v in x]


_KERNELS = """
import triton
import triton.language as tl

@triton.jit
def helper(x):
    return tl.maximum(x, 3) + tl.minimum(x, 5)

@triton.jit
def kernel(x_ptr, out_ptr, n: tl.constexpr):
    i = tl.arange(0, n)
    x = tl.load(x_ptr + i)
    tl.store(out_ptr + i, helper(x) * tl.where(x > 2, 2, 1) + tl.sum(x, axis=0))
"""


def _kernels():
    """A kernel that calls a jit helper (a nested patch), built in a module of its own: the interpreter
    looks names up in the kernel's globals."""
    space: dict = {"__name__": "vmfuzz_speed_probe"}
    exec(compile(_KERNELS, "<vmfuzz speed probe>", "exec"), space)
    return space["kernel"]


_NESTED = """
import triton
import triton.language as tl

@triton.jit
def clamp(x):
    return tl.maximum(x, 3) + tl.minimum(x, 5)

@triton.jit
def kernel(x_ptr, out_ptr, n: tl.constexpr, rounds: tl.constexpr):
    i = tl.arange(0, n)
    x = tl.load(x_ptr + i)
    acc = tl.zeros([n], dtype=tl.int32)
    for r in range(rounds):  # a helper in a loop, a standard-library helper (it sees triton.language.core)
        acc += clamp(x + r) + tl.sum(x, axis=0) + tl.cdiv(x + r, 2)
    tl.store(out_ptr + i, acc)

@triton.jit
def failing(x_ptr, n: tl.constexpr):
    i = tl.arange(0, n)
    tl.store(x_ptr + i, clamp(tl.load(x_ptr + i)))
    tl.static_assert(n < 0, "a launch that raises")
"""


def test_a_helpers_patch_is_skipped_only_inside_the_launch_that_covered_it_and_kernels_answer_the_same(
        monkeypatch):
    pytest.importorskip("triton.language")
    import torch
    from triton.runtime import interpreter
    interpreter_speed.install()
    fast = interpreter._patch_lang
    assert fast._vmfuzz_nested and interpreter.GridExecutor.__call__.original is not None
    space: dict = {"__name__": "vmfuzz_nested_probe"}
    exec(compile(_NESTED, "<vmfuzz nested probe>", "exec"), space)
    patched = []
    real_core = interpreter._patch_lang_core
    monkeypatch.setattr(interpreter, "_patch_lang_core", lambda lang, scope: (patched.append(lang),
                                                                                real_core(lang, scope)))

    def run():
        x = torch.arange(8, dtype=torch.int32)
        out = torch.zeros(8, dtype=torch.int32)
        space["kernel"][(1,)](x, out, n=8, rounds=3)
        return out.tolist()

    got = run()
    skipped = len(patched)
    assert fast.launches == []  # the launch ended: a later helper call is nobody's nested one
    x = list(range(8))
    assert got == [sum(max(v + r, 3) + min(v + r, 5) + sum(x) + -(-(v + r) // 2) for r in range(3)) for v in x]
    monkeypatch.setattr(interpreter, "_patch_lang", fast.original)
    patched.clear()
    assert run() == got  # every helper patched afresh, as Triton does: the same answers
    assert len(patched) > skipped  # and more patching than with the skip
    monkeypatch.setattr(interpreter, "_patch_lang", fast)
    with pytest.raises(Exception):
        space["failing"][(1,)](torch.arange(8, dtype=torch.int32), n=8)
    assert fast.launches == []  # a launch that raised is over too
    assert run() == got


_SHAPED = """
import triton
import triton.language as tl

@triton.jit
def kernel(x_ptr, out_ptr, n: tl.constexpr, m: tl.constexpr):
    rows = tl.arange(0, n)[:, None]
    cols = tl.arange(0, m)[None, :]
    x = tl.load(x_ptr + rows * m + cols)
    flat = tl.reshape(x, (n * m,))
    back = tl.reshape(flat, (m, n))
    y = tl.trans(back) + tl.broadcast_to(tl.sum(x, axis=1)[:, None], (x.shape[0], x.shape[1]))
    tl.store(out_ptr + rows * m + cols, y * x.numel)
"""


def test_shapes_built_on_read_equal_the_eager_constructors_and_kernels_answer_the_same():
    pytest.importorskip("triton.language")
    import torch
    from triton.language import core
    interpreter_speed.install()
    init = core.tensor.__init__
    assert init._vmfuzz_on_read and interpreter_speed._shapes_on_read()  # a second install keeps the first
    for ty in (core.int1, core.block_type(core.int32, [8]), core.block_type(core.float16, [4, 2]),
               core.block_type(core.pointer_type(core.int8), [2, 4])):
        lazy = interpreter_speed._shown(init, core.tensor, ty)
        assert lazy == interpreter_speed._shown(init.original, core.tensor, ty), ty
    t = core.tensor(None, core.block_type(core.int32, [4]))
    t.shape = core.tuple([core.constexpr(2)])  # an assignment wins over the built value, as an attribute's would
    assert [s.value for s in t.shape] == [2] and t.numel.value == 4
    space: dict = {"__name__": "vmfuzz_shape_probe"}
    exec(compile(_SHAPED, "<vmfuzz shape probe>", "exec"), space)

    def run():
        x = torch.arange(32, dtype=torch.int32)
        out = torch.zeros(32, dtype=torch.int32)
        space["kernel"][(1,)](x, out, n=4, m=8)
        return out.tolist()

    got = run()
    shape, numel, name, type_init = core.tensor.shape, core.tensor.numel, core.tuple_type.name, core.tuple_type.__init__
    core.tensor.__init__, core.tuple_type.__init__ = init.original, type_init.original
    del core.tensor.shape, core.tensor.numel, core.tuple_type.name
    try:
        assert run() == got  # the eager constructors answer the same
    finally:
        core.tensor.__init__, core.tensor.shape, core.tensor.numel = init, shape, numel
        core.tuple_type.__init__, core.tuple_type.name = type_init, name
    x = torch.arange(32).reshape(4, 8)
    want = (x.reshape(-1).reshape(8, 4).T + x.sum(1, keepdim=True)) * 32
    assert got == want.reshape(-1).tolist()


def _decorated(fn):
    import functools

    @functools.wraps(fn)
    def inner(*args, **kwargs):
        return fn(*args, **kwargs)
    return inner


class _Holder:
    @staticmethod
    def plain(bs):
        return bs * 2

    @_decorated
    def wrapped(self, bs, *, capacity=8):
        if bs > capacity:  # a comment, and a string with "def" in it
            return None
        return [bs for _ in range(bs)]


def test_function_source_read_cheaply_is_inspects_own_text(sglang_target):
    """source_text reads what inspect.getsource reads, for SGLang's functions, their code objects, methods,
    static methods, wrapped and nested functions, without inspect.getmodule's scan of every module."""
    import inspect

    from vmfuzz.harness.targets.sglang import source_text
    sg = sglang_target.sglang
    functions = [f for module in (sg.eagle_utils, sg.verify_mask) for f in vars(module).values()
                 if inspect.isfunction(f) and f.__module__ == module.__name__]
    functions += [f for cls in (_Holder,) + tuple(c for c in vars(sg.verify_mask).values() if isinstance(c, type))
                  for f in vars(cls).values() if inspect.isfunction(f) or isinstance(f, staticmethod)]
    functions += [_Holder.wrapped, _decorated, test_function_source_read_cheaply_is_inspects_own_text]
    assert len(functions) > 20
    for fn in functions:
        assert source_text.of(fn) == inspect.getsource(fn), fn
        code = inspect.unwrap(fn).__code__ if callable(fn) else fn.__func__.__code__
        assert source_text.of(code) == inspect.getsource(code), fn
    nested = [c for c in _decorated.__code__.co_consts if inspect.iscode(c)]
    assert nested and all(source_text.of(c) == inspect.getsource(c) for c in nested)
    with pytest.raises(TypeError):  # what inspect refuses, refused the same way
        source_text.of(42)
