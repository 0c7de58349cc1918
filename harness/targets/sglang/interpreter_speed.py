"""Triton's interpreter, made cheaper where it recomputes a constant or computes what nobody reads,
never changed in what it does.

On a host without CUDA every SGLang kernel runs in Triton's interpreter, and its
launches are most of a run's time. Two costs in it change no result:

* Its ``_get_np_dtype`` (Triton 3.x) rebuilds a 19-entry dtype table on every
  call, about half a million calls in one gate: roughly a tenth of the search.
  It is swapped for a lookup in that same table, built once, after checking
  that it answers exactly as the original for every type the table holds,
  pointers and blocks included.
* For every 32-bit integer add, sub and mul a kernel runs, Triton's semantic
  layer recomputes the operation in int64 and range-checks it, only to hand the
  check to ``device_assert``, which returns unread when the options' ``debug``
  is off (the interpreter's options never turn it on). In the gate's kernels
  that is about a third of the interpreter's time. The builder's options then
  say ``sanitize_overflow=False``, which skips the recomputation, but only
  after a probe shows ``device_assert`` leaves its condition unread: a Triton
  that would check it keeps the sanitizer.

* Every launch, and every call of one jit function from another, re-patches
  ``triton.language`` for the interpreter; to find what to patch it lists every
  member of each language module with ``inspect.getmembers`` and keeps the
  builtins. The list never changes while a process runs, and listing it is
  about a quarter of the interpreter's time in the graph runners' many small
  launches. The builtins' names are listed once, before any launch has patched
  anything, after checking the list equals Triton's own scan; each patch then
  still reads every member afresh and patches it only if it is a builtin now,
  as the scan would.

* A call of one jit function from another inside a launch re-runs that whole
  patch again (its globals scanned, every language member read, the
  interpreter's replacements set afresh into a scope nobody restores), though
  the launch's own patch already set every one of them for the same language
  modules: about a sixth of a graph check's time (the draft kernels call
  helpers in loops). Such a nested patch is skipped when an earlier patch in the
  launch under way (its own, or a helper's, which nobody restores before the
  launch ends) covered every language module the helper sees; the first helper
  to see another (``triton.language.core`` where the kernel saw only
  ``triton.language``), and one called outside a launch, is patched by Triton
  as before.

* Every value a kernel computes is a new ``tl.tensor``, and its constructor
  builds the block's shape as a Triton tuple of constexprs, whose type in turn
  renders a display name over every dimension: about a twelfth of a gate's
  time, for shapes the semantic layer never reads (it reads the type's). The
  shape, the element count and the tuple type's name are built the first time
  something reads them, from the type the tensor was made with, after checking
  that they equal the eager constructor's for a scalar and blocks of one and two
  dimensions.

A Triton without these pieces, or one whose answers differ, is left as it is.

One more piece is a repair, not a speed-up: Triton 3.6's interpreter turns a
scalar it computed at run time into a Python int with ``int(data)``, where
``data`` is a one-element NumPy array. NumPy 2.4 refuses ``int()`` of an array
that is not 0-dimensional, so every kernel that loops ``range(tl.cdiv(x, B))``
over a loaded or computed ``x`` (SGLang's cache-location kernels) raises in the
interpreter. ``index_one_element`` replaces that conversion, inside the
interpreter's own per-launch patch scope, with ``.item()`` for one-element data:
the value older NumPy gave, so what a kernel computes is unchanged. An array
of more elements still raises as before. ``remove_index_repair`` undoes it.
"""

from __future__ import annotations

#: What this module drives: nothing of SGLang (it speeds up the tool that runs SGLang's kernels).
SURFACE: tuple = ()


def install() -> bool:
    """True when the interpreter now uses the built-once table (the unread overflow checks are
    skipped too where the probe allows; ``overflow_checks_skipped`` says)."""
    _skip_unread_overflow_checks()
    index_one_element()
    _builtins_listed_once()
    _nested_patches_skipped()
    _shapes_on_read()
    return _dtype_table()


def index_one_element() -> bool:
    """True when the interpreter's launches turn a one-element scalar into an int with ``.item()``
    (installed now or before); False when this Triton has no such conversion to repair."""
    try:
        from triton.runtime import interpreter
    except Exception:  # noqa: BLE001 - no Triton: nothing to repair
        return False
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        return False
    if getattr(original, "_vmfuzz_index", False):
        return True

    def as_index(self):
        data = self.handle.data
        # one element: the value NumPy < 2.4 gave for int(data); more: raise as the original does
        return int(data.item()) if getattr(data, "size", 0) == 1 else int(data)

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        # set through the launch's own scope, so the interpreter restores it after the launch
        scope.set_attr(tensor, "__index__", as_index)

    patch_lang_tensor._vmfuzz_index = True
    patch_lang_tensor.original = original
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True


def remove_index_repair() -> None:
    """Put the interpreter's own scalar conversion back (the repair is in-process and reversible)."""
    try:
        from triton.runtime import interpreter
    except Exception:  # noqa: BLE001 - no Triton: nothing installed
        return
    patched = getattr(interpreter, "_patch_lang_tensor", None)
    if getattr(patched, "_vmfuzz_index", False):
        interpreter._patch_lang_tensor = patched.original


def overflow_checks_skipped() -> bool:
    try:
        from triton.runtime import interpreter
    except Exception:  # noqa: BLE001 - no Triton: nothing was skipped
        return False
    return not getattr(interpreter.interpreter_builder.options, "sanitize_overflow", True)


class _Unread:
    """A condition that fails the probe the moment anything reads it."""

    def __getattr__(self, name):
        raise LookupError(name)


def _skip_unread_overflow_checks() -> bool:
    """True when the interpreter skips the overflow checks whose assert never reads them."""
    import dataclasses
    try:
        from triton.runtime import interpreter
        builder, semantic = interpreter.interpreter_builder, interpreter.interpreter_semantic
        options = builder.options
        if options.debug or not dataclasses.is_dataclass(options) or semantic.builder is not builder:
            return False
        if not options.sanitize_overflow:
            return True
        # The check's only consumer: with debug off it must return without touching the condition.
        if semantic.device_assert(_Unread(), "probe", None) is not None:
            return False
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    except Exception:  # noqa: BLE001 - a Triton shaped otherwise, or one whose assert reads it: as it is
        return False
    return True


def _dtype_table() -> bool:
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except Exception:  # noqa: BLE001 - no Triton (or no interpreter): nothing to speed up
        return False
    original = getattr(interpreter, "_get_np_dtype", None)
    if original is None or getattr(original, "_vmfuzz_table", False):
        return original is not None
    names = ("int1", "float16", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32",
             "int64", "uint64", "bfloat16", "float8e5", "float8e5b16", "float8e4nv", "float8e4b8", "float8e4b15")
    try:
        table = {getattr(tl, name): original(getattr(tl, name)) for name in names}
        pointer = original(tl.pointer_type(tl.int32))
    except Exception:  # noqa: BLE001 - a Triton whose table differs from the one read here
        return False

    def np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.pointer_type):
            return pointer
        if isinstance(tt_dtype, tl.block_type):
            element = tt_dtype.element_ty
            return pointer if isinstance(element, tl.pointer_type) else table[element]
        return table[tt_dtype]

    probes = [*table, tl.pointer_type(tl.float16), tl.block_type(tl.int32, [4]),
              tl.block_type(tl.pointer_type(tl.int8), [2, 2])]
    if any(np_dtype(t) != original(t) for t in probes):
        return False
    np_dtype._vmfuzz_table = True
    np_dtype.original = original  # what it stands for, kept so a test can hold it to the same answers
    interpreter._get_np_dtype = np_dtype
    return True


def _language_modules(interpreter) -> list:
    """What the interpreter's per-launch patch lists members of (``_patch_lang``'s packages)."""
    tl = interpreter.tl
    return [tl, tl.core, tl.tensor, tl.math, tl.core.tensor_descriptor_base]


def _builtins_listed_once() -> bool:
    """True when the per-launch patch reads the builtins' names from a list made once."""
    import inspect
    try:
        from triton.runtime import interpreter
        original, patch_attr = interpreter._patch_builtin, interpreter._patch_attr
        is_builtin = interpreter.tl.core.is_builtin
        packages = _language_modules(interpreter)
    except Exception:  # noqa: BLE001 - a Triton shaped otherwise: as it is
        return False
    if getattr(original, "_vmfuzz_listed", False):
        return True
    # listed now, in this process's import, before any launch has patched a member
    listed = {id(pkg): (pkg, tuple(n for n, m in inspect.getmembers(pkg) if is_builtin(m))) for pkg in packages}
    if any(not names for _, names in listed.values()):
        return False

    def patch_builtin(pkg, builder, scope):
        entry = listed.get(id(pkg))
        if entry is None or entry[0] is not pkg:
            return original(pkg, builder, scope)  # a package not listed here: Triton's own scan
        for name in entry[1]:
            member = getattr(pkg, name, None)
            if is_builtin(member):  # already patched (a nested call's): left as the scan would
                patch_attr(pkg, name, member, builder, scope)

    patch_builtin._vmfuzz_listed = True
    patch_builtin.original = original
    patch_builtin.listed = {id_: names for id_, (_, names) in listed.items()}
    interpreter._patch_builtin = patch_builtin
    return True


def _nested_patches_skipped() -> bool:
    """True when a jit helper's patch inside a launch is skipped where the launch's own patch covers it."""
    try:
        from triton.runtime import interpreter
        original, executor, empty = interpreter._patch_lang, interpreter.GridExecutor, interpreter._LangPatchScope
        languages = (interpreter.tl, interpreter.tl.core)
    except Exception:  # noqa: BLE001 - a Triton shaped otherwise: as it is
        return False
    if getattr(original, "_vmfuzz_nested", False):
        return True
    #: per launch under way (innermost last): the ids of the language modules its own patch covered
    launches: list = []

    def patch_lang(fn):
        # the modules Triton's own patch picks from the function's globals (a module compares by identity)
        seen = {id(v) for v in fn.__globals__.values() if v is languages[0] or v is languages[1]}
        if seen and launches and launches[-1] is not None and seen <= launches[-1]:
            return empty()  # every member it would set is set, by the launch's scope, to the same
        scope = original(fn)
        if launches:  # the launch's own patch, or a helper's, whose scope is never restored in the launch
            launches[-1] = seen if launches[-1] is None else launches[-1] | seen
        return scope

    real_call = executor.__call__

    def launch(self, *args, **kwargs):
        launches.append(None)
        try:
            return real_call(self, *args, **kwargs)
        finally:
            launches.pop()

    patch_lang._vmfuzz_nested = True
    patch_lang.original, launch.original = original, real_call
    patch_lang.launches = launches
    interpreter._patch_lang = patch_lang
    executor.__call__ = launch
    return True


def _shapes_on_read() -> bool:
    """True when a ``tl.tensor``'s shape and element count, and a tuple type's name, are built when read."""
    try:
        from triton.language import core
        tensor, tuple_type = core.tensor, core.tuple_type
        eager_init, eager_type_init = tensor.__init__, tuple_type.__init__
    except Exception:  # noqa: BLE001 - a Triton shaped otherwise: as it is
        return False
    if getattr(eager_init, "_vmfuzz_on_read", False):
        return True
    if "shape" in vars(tensor) or "numel" in vars(tensor) or "name" in vars(tuple_type):
        return False  # a Triton that already defines them on the class: not this constructor's
    probes = [core.int32, core.block_type(core.int64, [4]), core.block_type(core.float32, [2, 8])]
    eager = [_shown(eager_init, tensor, t) for t in probes]

    def init(self, handle, type):
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        self._made_as = type  # what shape and numel are read from, whatever is assigned to .type later

    def built(field, make):
        slot = "_" + field

        def read(self):
            d = self.__dict__
            if slot not in d:
                d[slot] = make(self)
            return d[slot]

        def write(self, value):
            self.__dict__[slot] = value
        return property(read, write)

    dims = lambda self: self._made_as.shape if self._made_as.is_block() else ()  # noqa: E731
    shape = built("shape", lambda self: core.tuple([core.constexpr(s) for s in dims(self)]))
    numel = built("numel", lambda self: core.constexpr(_product(dims(self))))

    def type_init(self, types, fields=None):
        self.types = types
        self.fields = fields or [""] * len(types)
        self._named = (list(types), list(self.fields))

    name = built("name", lambda self: "[" + ",".join(f"{k}:{v}" for k, v in zip(self._named[1], self._named[0]))
                 + "]")
    init._vmfuzz_on_read, init.original, type_init.original = True, eager_init, eager_type_init
    tensor.__init__, tensor.shape, tensor.numel = init, shape, numel
    tuple_type.__init__, tuple_type.name = type_init, name
    if [_shown(init, tensor, t) for t in probes] != eager:
        tensor.__init__, tuple_type.__init__ = eager_init, eager_type_init
        del tensor.shape, tensor.numel, tuple_type.name
        return False
    return True


def _product(dims) -> int:
    import math
    return math.prod(dims)


def _shown(init, tensor, ty) -> tuple:
    """What a tensor made by ``init`` with type ``ty`` answers: its shape, count, dtype and names."""
    t = tensor.__new__(tensor)
    init(t, None, ty)
    return ([type(s).__name__ + repr(s.value) for s in t.shape], str(t.shape.type), repr(t.numel.value),
            str(t.dtype), str(t.type))
