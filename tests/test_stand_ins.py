"""A finding is SGLang's only when SGLang's code computed it from what SGLang itself produced.

Every stand-in and patch vmfuzz installs records whether SGLang's code read it;
a raise or a property's failure met while a load-bearing stand-in went unread,
or after SGLang asked a stand-in for a part it does not provide, is out of step
naming the seam (exit 3), never a finding. The fast tests hold the facility and
the one decision (``engine.core.failures.consulted_check``) to that; the slow
ones refactor a copy of the installed SGLang so that a stand-in is no longer
read, and check the run says so, while the pristine copy holds and a real bug
is still caught by the property meant to catch it.
"""

from __future__ import annotations

import json

import pytest

from vmfuzz.harness.engine.core.failures import consulted_check
from vmfuzz.harness.model import consultation
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.model.origin import Origin
from vmfuzz.harness.properties.kit import PropertyFailure
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.stand_in import StandIn, consultation_of, never_consulted, recorded
from tests.sglang_copies import altered_copy, failed_check_origin, replay_on_copy


def _backend(mask="the mask"):
    return StandIn("attention backend's verify_mask", "srt/x.py", load_bearing=("verify_mask",),
                   verify_mask=mask, max_context_len=64)


def test_a_stand_in_records_each_field_read_and_each_it_lacks():
    with consultation.ledger() as ledger:
        backend = _backend()
        assert [e.seam for e in ledger.never_consulted()] == ["attention backend's verify_mask"]
        assert backend.max_context_len == 64 and consultation_of(backend).unread() == ["verify_mask"]
        assert backend.verify_mask == "the mask"
        assert ledger.never_consulted() == []
        assert getattr(backend, "verify_mask_for", None) is None and not hasattr(backend, "fits")
        assert consultation_of(backend).lacking == {"verify_mask_for", "fits"}
        backend.spec_info = 3  # SGLang's code sets fields on the objects it is handed
        assert backend.spec_info == 3


def test_a_load_bearing_field_read_by_vmfuzz_itself_is_not_a_consultation():
    from vmfuzz.harness.targets.sglang.stand_in import HARNESS_DIR
    with consultation.ledger() as ledger:
        backend = _backend()
        # code of vmfuzz's own package reading it (to build the next stand-in) consults nothing
        read_by_vmfuzz = compile("backend.verify_mask", HARNESS_DIR + "targets/sglang/call_sites.py", "eval")
        assert eval(read_by_vmfuzz, {"backend": backend}) == "the mask"
        assert ledger.never_consulted()
        read_by_sglang = compile("backend.verify_mask", "/x/sglang/srt/speculative/eagle_worker_common.py", "eval")
        assert eval(read_by_sglang, {"backend": backend}) == "the mask"
        assert not ledger.never_consulted()


def test_a_load_bearing_field_must_be_one_of_its_fields():
    with pytest.raises(ValueError, match="verify_msk"):
        StandIn("backend", "srt/x.py", load_bearing=("verify_msk",), verify_mask=None)


def test_a_patch_records_being_called_and_bound_records_every_function_it_binds():
    import types
    owner = types.SimpleNamespace(helper=lambda: "real")
    with consultation.ledger() as ledger:
        patch = recorded(lambda: "stand-in", "get_spec", "srt/x.py", load_bearing=True)
        assert [e.seam for e in ledger.never_consulted()] == ["get_spec"]
        assert patch() == "stand-in" and not ledger.never_consulted()
        with bound((owner, "helper", lambda: "bound")):
            assert [e.seam for e in never_consulted()] == ["helper"]
            assert owner.helper() == "bound"
            assert never_consulted() == []
    assert owner.helper() == "real" and never_consulted() == []


def _raises(exc, backend_read: bool):
    with consulted_check():
        backend = _backend()
        if backend_read:
            backend.verify_mask
        raise exc


def test_a_raise_with_a_load_bearing_stand_in_unread_is_out_of_step_naming_it():
    with pytest.raises(OutOfStep) as got:
        _raises(TypeError("NoneType is not subscriptable"), backend_read=False)
    assert got.value.seam == "attention backend's verify_mask" and got.value.file == "srt/x.py"
    assert "never read verify_mask" in got.value.why and "TypeError" in got.value.why


def test_a_wrong_value_with_a_load_bearing_stand_in_unread_is_out_of_step():
    wrong = PropertyFailure(Origin("no-oob-write", "wrong"), "the mask differs")
    with pytest.raises(OutOfStep, match="a property failed"):
        _raises(wrong, backend_read=False)


@pytest.mark.parametrize("exc", [TypeError("boom"), PropertyFailure(Origin("no-oob-write", "wrong"), "differs")])
def test_a_failure_after_every_load_bearing_stand_in_was_read_is_the_targets(exc):
    with pytest.raises(type(exc)):
        _raises(exc, backend_read=True)


def test_an_unread_stand_in_that_is_not_load_bearing_leaves_a_finding_a_finding():
    with pytest.raises(TypeError), consulted_check() as ledger:
        StandIn("model config", "srt/x.py", context_len=8)
        recorded(lambda: 1, "get_exec", "srt/x.py")
        assert len(ledger.unconsulted()) == 2
        raise TypeError("the target's own")


def test_asking_a_stand_in_for_what_it_does_not_provide_is_out_of_step():
    with pytest.raises(OutOfStep) as got, consulted_check():
        backend = _backend()
        backend.verify_mask
        backend.verify_mask_for(2)  # a refactor reading the mask through a helper vmfuzz never stood in for
    assert got.value.seam == "attention backend's verify_mask"
    assert "verify_mask_for" in got.value.why


def test_out_of_step_and_an_interrupt_cross_as_themselves():
    with pytest.raises(OutOfStep, match="its own seam"):
        _raises(OutOfStep("its own seam", "f", "why"), backend_read=False)
    with pytest.raises(KeyboardInterrupt):
        _raises(KeyboardInterrupt(), backend_read=False)


@pytest.mark.parametrize("ran_by", ["exhaustive", "direct", "shrink"])
def test_every_way_a_check_is_run_judges_it_in_the_one_place(ran_by):
    from vmfuzz.harness.engine.core.line_trace import direct_check
    from vmfuzz.harness.engine.regression.shrink import checker
    from vmfuzz.harness.engine.search import exhaustive
    from vmfuzz.harness.properties import Property

    def check(target, config, batches, device="cpu"):
        _backend()  # a call site that never reads the backend's mask, then raises
        raise TypeError("boom")
    prop = Property("no-oob-write", check, "a check whose stand-in goes unread")
    with pytest.raises(OutOfStep, match="never read verify_mask"):
        if ran_by == "exhaustive":
            exhaustive._fails(prop, None, None, [], "cpu")
        elif ran_by == "direct":
            direct_check(None)(prop, None, [], "cpu")
        else:
            checker(prop, None, "cpu", None, 1.0)[0]((None, []))


def test_a_check_inside_a_check_keeps_one_ledger():
    with consulted_check() as outer, consulted_check() as inner:
        assert inner is outer


# -- altered copies of the installed SGLang ---------------------------------------

CALL_SITE = ["srt/speculative/eagle_worker_common.py"]
BASE_BACKEND = ["srt/layers/attention/base_attn_backend.py"]
PP_SITE = ["srt/managers/scheduler_pp_mixin.py"]
VERIFY_MASK = ["srt/layers/attention/verify_mask.py"]
TRITON = ["srt/layers/attention/triton_backend.py"]

#: the call site asks the backend for its mask through a helper every real backend inherits:
#: SGLang behaves the same, and vmfuzz's backend stand-in (which has no such helper) is never read
_MASK_THROUGH_A_HELPER = [
    (BASE_BACKEND, r"(\n    @property\n    def verify_mask\(self\))",
     r"\n    def current_verify_mask(self):\n        return self.verify_mask\n\1"),
    (CALL_SITE, r"verify_mask = target_attn_backend\.verify_mask\n",
     "verify_mask = target_attn_backend.current_verify_mask()\n"),
]
#: the pp rebuild reads the draft shape off the server's arguments, which carry the same fields,
#: rather than through get_spec(): vmfuzz's get_spec is never called
_PP_SPEC_FROM_SERVER_ARGS = [(PP_SITE, r"(_pp_spec_rebuild_verify_input\(self[^\n]*\n(?:[^\n]*\n)*?\s*)spec = get_spec\(\)",
                              r"\1spec = self.server_args")]
#: a real bug: fits admits one request more than the buffer holds
_FITS_ADMITS_ONE_MORE = [(VERIFY_MASK, r"return bs <= self\.max_bs", "return bs <= self.max_bs + 1")]

_CONFIG = {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 16, "num_draft_tokens": 3, "topk": 2,
           "spec_steps": 2}


def _replay(tmp_path, edits, name, call_site="eagle", seq_lens=(3, 5), prop="no-oob-write", **config):
    site = altered_copy(tmp_path, edits, name)
    return replay_on_copy(site, tmp_path, dict(_CONFIG, call_site=call_site, **config), seq_lens, prop)


def _out_of_step_line(proc) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if "could not check" in ln]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("call_site", ["eagle", "pp"])
def test_a_call_site_reading_the_mask_through_a_helper_is_out_of_step_not_a_finding(sglang_target, tmp_path,
                                                                                    call_site):
    edits = _MASK_THROUGH_A_HELPER + ([(PP_SITE, r"verify_mask = self\.tp_worker\.model_runner\.attn_backend"
                                                 r"\.verify_mask\n",
                                        "verify_mask = self.tp_worker.model_runner.attn_backend"
                                        ".current_verify_mask()\n")] if call_site == "pp" else [])
    proc, out = _replay(tmp_path, edits, "mask-through-a-helper", call_site)
    assert proc.returncode == 3, out
    assert "attention backend's verify_mask" in _out_of_step_line(proc), out
    checks = json.loads((tmp_path / "report" / "summary.json").read_text())["checks"]
    assert [(c["status"], c["kind"]) for c in checks] == [("error", "out-of-step")], out


@pytest.mark.slow
def test_a_pp_rebuild_no_longer_asking_get_spec_is_out_of_step_not_a_finding(sglang_target, tmp_path):
    proc, out = _replay(tmp_path, _PP_SPEC_FROM_SERVER_ARGS, "pp-spec-from-server-args", "pp")
    assert proc.returncode == 3, out
    assert "nor call of get_spec" in _out_of_step_line(proc), out


#: the Triton reader asks the verify input for its mask through a method SGLang's input gains:
#: vmfuzz's spec-info stand-in has none, so the mask it hands the reader is never read
_READER_MASK_THROUGH_A_METHOD = [
    (["srt/speculative/eagle_info.py"], r"(class EagleVerifyInput\(SpecInput\):\n)",
     r"\1    def verify_custom_mask(self):\n        return self.custom_mask\n\n"),
    (["srt/layers/attention/triton_backend.py"], r"(\n\s*)custom_mask = spec_info\.custom_mask\n",
     r"\1custom_mask = spec_info.verify_custom_mask()\n"),
]


@pytest.mark.slow
@pytest.mark.parametrize("alteration", [None, "reader-mask-through-a-method"])
def test_a_reader_no_longer_reading_the_mask_it_is_handed_is_out_of_step(sglang_target, tmp_path, alteration):
    edits = _READER_MASK_THROUGH_A_METHOD if alteration else []
    proc, out = _replay(tmp_path, edits, alteration, topk=1, prop="reader-agreement")
    if alteration is None:
        assert proc.returncode == 0, out
        return
    assert proc.returncode == 3, out
    assert "verify spec info's custom_mask" in _out_of_step_line(proc), out


@pytest.mark.slow
@pytest.mark.parametrize("call_site", ["eagle", "pp"])
def test_the_pristine_copy_holds_through_every_stand_in(sglang_target, tmp_path, call_site):
    proc, out = _replay(tmp_path, [], None, call_site)
    assert proc.returncode == 0, out


@pytest.mark.slow
def test_a_real_bug_is_still_caught_by_the_property_meant_to_catch_it(sglang_target, tmp_path):
    # three requests where max_bs is two: the buggy fits lets the step write past the buffer
    proc, out = _replay(tmp_path, _FITS_ADMITS_ONE_MORE, "fits-admits-one-more", seq_lens=(13, 13, 13))
    assert proc.returncode == 1, out
    origin = failed_check_origin(tmp_path / "report", out)
    assert origin["property"] == "no-oob-write", out


# -- one of SGLang's own objects, its set-up skipped and its values built by vmfuzz -----------------

_BACKEND_SOURCE = '''
class Backend:
    def __init__(self):
        self._mask = None
        self._buffer = None

    def set_up(self, n):
        self._mask = [0] * n
        self._buffer = self._mask

    def _graph_buffer(self):
        return self._buffer

    def replay(self, values):
        buf = self._graph_buffer()
        buf[: len(values)] = values
        return buf
'''


def _watched_backend(tmp_path):
    """A backend of code outside vmfuzz whose set-up vmfuzz skipped, building only ``_mask``."""
    import importlib.util

    from vmfuzz.harness.targets.sglang.stand_in import watch_unset
    path = tmp_path / "fake_backend.py"
    path.write_text(_BACKEND_SOURCE)
    spec = importlib.util.spec_from_file_location("fake_backend", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    backend = mod.Backend()
    backend._mask = [0] * 4
    return watch_unset(backend, "the backend's set-up", "srt/fake.py", "set_up", ("_mask",))


def test_a_raise_after_reading_what_the_skipped_set_up_makes_is_out_of_step(tmp_path):
    with pytest.raises(OutOfStep) as got, consulted_check():
        backend = _watched_backend(tmp_path)
        assert type(backend).__name__ == "Backend" and backend._mask == [0] * 4
        backend.replay([1, 2])  # the buffer, through a helper: None, never built by vmfuzz
    assert got.value.seam == "the backend's set-up" and "_buffer" in got.value.why
    assert "TypeError" in got.value.why and "_mask" not in got.value.why


def test_what_vmfuzz_built_or_read_itself_and_a_property_failure_stay_as_they_were(tmp_path):
    with consulted_check() as ledger:
        backend = _watched_backend(tmp_path)
        backend._buffer = backend._mask  # vmfuzz's own read and write: no consultation
        assert backend.replay([1, 2]) == [1, 2, 0, 0] and ledger.read_unset() != []
    with pytest.raises(PropertyFailure), consulted_check():
        backend = _watched_backend(tmp_path)
        backend.set_up(2)
        backend.replay([1])
        raise PropertyFailure(Origin("reader-agreement", "wrong"), "a wrong mask is judged as ever")


#: SGLang keeps the cuda-graph verify buffer under a name of its own and hands it to the replay
#: through a small helper: the same behaviour, but vmfuzz, which builds the set-up's values itself,
#: never set that name, so the replay meets the None ``__init__`` left there
_VERIFY_BUFFER_THROUGH_A_HELPER = [
    (TRITON, r"(\n(\s*)self\._verify_mask = None\n)", r"\1\2self._verify_buffer = None\n"),
    (TRITON, r"(\n(\s*)self\._verify_mask = maybe_create_verify_mask\((?:[^()]|\([^()]*\))*\)\n)",
     r"\1\2self._verify_buffer = self._verify_mask.buffer if self._verify_mask is not None else None\n"),
    (TRITON, r"custom_mask = \(\n\s*self\._verify_mask\.buffer if self\._verify_mask is not None else None\n\s*\)",
     "custom_mask = self._graph_mask_buffer()"),
    (TRITON, r"(\n    @property\n    def verify_mask\(self\))",
     r"\n    def _graph_mask_buffer(self):\n        return self._verify_buffer\n\1"),
]


@pytest.mark.slow
def test_a_verify_buffer_through_a_helper_is_out_of_step_never_a_raise_finding(sglang_target, tmp_path):
    proc, out = _replay(tmp_path, _VERIFY_BUFFER_THROUGH_A_HELPER, "verify-buffer-through-a-helper",
                        prop="reader-agreement", max_context_len=8, num_draft_tokens=4)
    assert proc.returncode == 3, out
    line = _out_of_step_line(proc)
    assert "init_cuda_graph_state" in line and "_verify_buffer" in line, out
    checks = json.loads((tmp_path / "report" / "summary.json").read_text())["checks"]
    assert [(c["status"], c["kind"]) for c in checks] == [("error", "out-of-step")], out
