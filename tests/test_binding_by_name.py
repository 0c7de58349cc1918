"""The one binding helper (``seams.call_with``) and its kin, on stand-in functions and types.

They need no SGLang: each case is a signature or a struct shape a refactor of
SGLang could leave, and what vmfuzz must make of it -- a call that binds by
name, a copy made the way the type makes copies, a patch found where the code
now reaches the function, or out of step naming the parameter and the file.
"""

from __future__ import annotations

import dataclasses
import sys
import types

import msgspec
import pytest

from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang import reach, seams, structs


def test_a_keyword_only_parameter_is_handed_its_value_by_name():
    def router(primary, *, children):
        return primary, children

    assert seams.call_with(router, "router", "srt/x.py", primary=1, children=[2, 3]) == (1, [2, 3])


def test_a_class_is_constructed_by_its_own_parameter_names_in_any_order():
    class Router:
        def __init__(self, model_runner, prefill_backend, *, decode_backend):
            self.parts = (model_runner, prefill_backend, decode_backend)

    made = seams.call_with(Router, "Router.__init__", "srt/r.py", decode_backend="d", model_runner="m",
                           prefill_backend="p")
    assert made.parts == ("m", "p", "d")


def test_a_release_name_for_the_same_quantity_binds():
    def backend(runner=None):
        return runner

    assert seams.call_with(backend, "Backend.__init__", "srt/b.py", model_runner="r") == "r"


def test_a_positional_only_parameter_is_filled_by_position():
    def kernel(a, b, /, c):
        return a, b, c

    assert seams.call_with(kernel, "kernel", "k.py", c=3, b=2, a=1) == (1, 2, 3)


def test_an_unsatisfiable_signature_is_out_of_step_naming_the_parameter_and_file():
    def writer(bonus_tokens, *, tree_mask_buffer):
        raise AssertionError("never called: the binding fails first")

    with pytest.raises(OutOfStep) as info:
        seams.call_with(writer, "build_chain_tree", "kernels/ops/speculative/eagle.py", bonus_tokens=1,
                        tree_mask_buf=None)
    assert info.value.seam == "build_chain_tree"
    assert info.value.file == "kernels/ops/speculative/eagle.py"
    assert "tree_mask_buffer" in info.value.why


def test_values_a_signature_has_no_parameter_for_are_left_out():
    def writer(bonus_tokens, tree_mask_buf=None):
        return bonus_tokens, tree_mask_buf

    assert seams.call_with(writer, "w", "w.py", bonus_tokens=1, tree_mask_buf=2, with_mrope=True) == (1, 2)


def test_a_method_read_off_its_class_takes_its_receiver_first():
    class Updater:
        def begin(self, *, plan=None):
            return self, plan

    u = Updater()
    assert seams.call_with(Updater.begin, "Updater.begin", "u.py", u, plan=4) == (u, 4)
    assert seams.call_method(u, "begin", plan=5) == (u, 5)


class _Struct(msgspec.Struct, frozen=True):
    buffer: object
    mode: int
    max_bs: int
    is_read: bool = True


@dataclasses.dataclass(frozen=True)
class _Frozen:
    buffer: object
    mode: int
    max_bs: int
    is_read: bool = True


class _Plain:
    def __init__(self, buffer, mode, max_bs, is_read=True):
        self.buffer, self.mode, self.max_bs, self.is_read = buffer, mode, max_bs, is_read


@pytest.mark.parametrize("cls", [_Struct, _Frozen, _Plain])
def test_a_mask_struct_is_read_and_copied_by_its_fields_whatever_its_library(cls):
    mask = cls(buffer="old", mode=1, max_bs=4, is_read=False)
    assert structs.fields_of(cls, "VerifyMask", "v.py")[:4] == ("buffer", "mode", "max_bs", "is_read")
    new = object()
    copy = structs.replaced(mask, "VerifyMask", "v.py", buffer=new)
    assert type(copy) is cls and copy.buffer is new
    assert (copy.mode, copy.max_bs, copy.is_read) == (1, 4, False)
    assert mask.buffer == "old"


def test_a_type_that_cannot_be_copied_is_out_of_step():
    class Sealed:
        def __init__(self, buffer):
            self._buf = buffer  # keeps no attribute by its parameter's name

        @property
        def buffer(self):
            return "fixed"

    with pytest.raises(OutOfStep, match="buffer"):
        structs.replaced(Sealed(1), "VerifyMask", "v.py", buffer=2)


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    vars(mod).update(attrs)
    return mod


def test_a_lookup_reached_through_its_module_is_bound_there(monkeypatch):
    def get_spec():
        raise ValueError("config namespace 'spec' not published")

    home = _module("sglang.fake_runtime_context", get_spec=get_spec)
    by_name = _module("sglang.fake_router_a", get_spec=get_spec)
    through_module = _module("sglang.fake_router_b", runtime_context=home)
    for mod in (home, by_name, through_module):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    answer = lambda: "spec"  # noqa: E731
    assert {(m.__name__, n) for m, n, _ in reach.lookup_patches([by_name], {"get_spec": answer})} \
        == {("sglang.fake_router_a", "get_spec")}
    assert {(m.__name__, n) for m, n, _ in reach.lookup_patches([through_module], {"get_spec": answer})} \
        == {("sglang.fake_runtime_context", "get_spec")}
    # a release without the lookup binds nothing
    assert reach.lookup_patches([through_module], {"get_exec": answer}) == []


def test_a_function_is_patched_wherever_it_is_held(monkeypatch):
    def entry():
        pass

    home = _module("sglang.fake_kernels", entry=entry)
    user = _module("sglang.fake_wrapper", _renamed=entry)
    elsewhere = _module("not_sglang.other", entry=entry)
    for mod in (home, user, elsewhere):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    got = {(m.__name__, n) for m, n, *_ in reach.patches_everywhere(entry, "guard")}
    assert got == {("sglang.fake_kernels", "entry"), ("sglang.fake_wrapper", "_renamed")}


def test_a_launch_one_call_deeper_is_found_by_following_calls():
    ns: dict = {"__name__": "sglang.fake_utils"}
    exec("def launch_kernel(tree_mask):\n    pass\n"
         "def _helper(x):\n    launch_kernel(x)\n"
         "def wrapper(x):\n    return _helper(x)\n", ns)
    for fn in ("launch_kernel", "_helper", "wrapper"):
        ns[fn].__module__ = "sglang.fake_utils"
    found = reach.follow_calls(ns["wrapper"], lambda name, value: name == "launch_kernel")
    assert found is not None and found[0] == "launch_kernel" and found[1] is ns["launch_kernel"]
    assert reach.follow_calls(ns["wrapper"], lambda name, value: name == "launch_kernel", depth=0) is None
    # a function is searched whole, by each match in turn, before the functions it calls
    either = reach.follow_calls(ns["wrapper"], lambda name, value: name == "_missing",
                                lambda name, value: name == "_helper")
    assert either is not None and either[0] == "_helper"


def test_a_raise_from_inside_a_function_is_told_from_one_outside_it():
    def inner():
        raise NameError("sgl_build_tree_kernel_efficient")

    def outer():
        inner()

    with pytest.raises(NameError) as info:
        outer()
    assert reach.raised_in(info.value, inner)
    assert not reach.raised_in(RuntimeError("elsewhere"), inner)


def _fake_sglang_module(tmp_path, name: str, source: str):
    """A module outside vmfuzz's folder, as SGLang's code is."""
    import importlib.util
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_HELPERS = '''
def dispatch(x):
    raise RuntimeError("Found no NVIDIA driver on your system")

def direct(x):
    return dispatch(x)

class Holder:
    pass

held = Holder()
held.dispatch = dispatch

def through_another_holder(x):
    return held.dispatch(x)

def own_bug(x):
    return [][x]
'''


def test_a_raise_from_the_real_function_a_stand_in_was_bound_for_is_out_of_step(tmp_path):
    """SGLang reaching the real function by a holder vmfuzz did not bind: the stand-in was never
    consulted, so the real one's raise is vmfuzz out of step, naming the seam; never SGLang's finding."""
    from vmfuzz.harness.model.errors import OutOfStep
    from vmfuzz.harness.targets.sglang.binding import bound
    m = _fake_sglang_module(tmp_path, "fake_sglang_bypass", _HELPERS)
    with bound((m, "dispatch", lambda x: x)):
        assert m.direct(3) == 3  # the bound name: the stand-in answers
    with pytest.raises(OutOfStep) as out, bound((m, "dispatch", lambda x: x)):
        m.through_another_holder(3)
    assert out.value.seam == "dispatch" and "never consulted" in out.value.why
    assert "Found no NVIDIA driver" in out.value.why


def test_sglang_s_own_raise_and_a_stand_in_handing_on_to_the_real_one_stay_raises(tmp_path):
    from vmfuzz.harness.targets.sglang.binding import bound
    m = _fake_sglang_module(tmp_path, "fake_sglang_own", _HELPERS)
    real = m.dispatch
    with pytest.raises(IndexError), bound((m, "dispatch", lambda x: x)):
        m.own_bug(0)  # a raise in code no stand-in was bound for: SGLang's own
    with pytest.raises(RuntimeError, match="NVIDIA"), bound((m, "dispatch", lambda x: real(x))):
        m.direct(1)  # vmfuzz's stand-in consults the real one on purpose: the raise is the real one's
    m.dispatch = lambda x: (_ for _ in ()).throw(KeyboardInterrupt())
    m.held.dispatch = m.dispatch
    with pytest.raises(KeyboardInterrupt), bound((m, "dispatch", lambda x: x)):
        m.through_another_holder(1)  # an interrupt inside the real one is the user's, never out of step
