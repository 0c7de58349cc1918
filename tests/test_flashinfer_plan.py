"""packed-mask judges what FlashInfer's cuda-graph verify plan is handed, not only the packed bits.

The oracle (``expected_plan``) is worked by hand from seq_lens, d and bs. On
``sglang``, altered copies of SGLang's ``flashinfer_backend.py`` and
``eagle_info.py`` -- each a slip in an array the packing never reads, so
packed-mask once let it through -- are run in this process (the altered
module's source executed in a fresh module the FlashInfer driver is handed, on
one fixed batch: no subprocess, no search) and must each be a packed-mask
finding naming the function that handed the array on and the array, never a
raise; a behaviour-preserving refactor must still hold.
"""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.readers import expected_plan
from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
from vmfuzz.harness.targets import resolve
from tests.sglang_copies import assert_not_a_raise

FULL = Config(TreeMaskMode.FULL_MASK, 2, 8, 4, 2, 2)
#: two requests of different lengths, pool slots handed out last first (request 0 in slot 1)
BATCH = Batch((3, 5))


def test_what_the_plan_must_be_handed_comes_from_seq_lens_d_and_bs():
    """Worked by hand for seq_lens (3, 0, 5), d 4, context 8: KV rows of s_b + 4 tokens, slot stride 100."""
    want = expected_plan(Config(TreeMaskMode.FULL_MASK, 4, 8, 4, 2, 2), Batch((3, 0, 5)))
    assert want.qo_indptr == [0, 4, 8, 12]
    assert want.kv_lens == [7, 4, 9]
    assert want.kv_indptr == [0, 7, 11, 20]
    assert want.kv_last_page_len == [1, 1, 1]
    # Request 0 in pool slot 2, request 1 in slot 1, request 2 in slot 0; slot p's token t is (p + 1) * 100 + t.
    assert want.kv_indices == [300 + t for t in range(7)] + [200 + t for t in range(4)] + [100 + t for t in range(9)]


def _handing_on(target, name, alter):
    """``target`` whose packer's plan read ``name`` holds ``alter(values)``."""
    pack = target.pack_mask

    def altered(*args):
        view = pack(*args)
        view.plan = [r if r.name != name else type(r)(r.writer, r.name, r.quantity, alter(r.values.clone()))
                     for r in view.plan]
        return view

    target.pack_mask = altered
    return target


@pytest.mark.parametrize("name, alter, cell", [
    ("kv_indptr", lambda t: t + (torch.arange(t.numel()) > 0), "value"),
    ("kv_indices", lambda t: t[:-1], "length"),
    ("kv_last_page_len", lambda t: t * 0, "value"),
    ("custom_mask", lambda t: ~t, "value"),
])
def test_each_plan_array_is_judged_on_reference(name, alter, cell):
    with pytest.raises(PropertyFailure) as caught:
        PROPERTIES["packed-mask"].check(_handing_on(resolve("reference"), name, alter), FULL, [BATCH])
    origin = caught.value.origin
    assert (origin.property, origin.effect, origin.buffer, origin.cell) == ("packed-mask", "wrong", name, cell)


# -- altered copies of the installed SGLang, in this process -------------------------------------------------

FLASHINFER, EAGLE_INFO = "flashinfer_backend", "eagle_info"
_GEN = r"(total_tokens = [^\n]*\n[^\n]*\n\s*translator\.pack_read_stream\(\n\s*plan,\n\s*)"

#: name -> (edits (module, regex, replacement), the writer and buffer the finding must name, effect)
ALTERATIONS = {
    # The host KV indptr counts one token too many before every request after the first.
    "kv-indptr-host-off-by-one": ([(FLASHINFER, r"kv_indptr_host\[1:\] = torch\.cumsum\(seq_lens_cpu_i32, dim=0\)",
                                    "kv_indptr_host[1:] = torch.cumsum(seq_lens_cpu_i32, dim=0) + 1")],
                                  ("FlashInferIndicesUpdaterPrefill.call_begin_forward", "kv_indptr_host", "wrong")),
    # The query rows laid out with a stride one wider than the draft.
    "qo-indptr-stride": ([(EAGLE_INFO, r"(\(1 \+ batch_size\) \* self\.draft_token_num,\n\s*step=)"
                                       r"self\.draft_token_num,", r"\1self.draft_token_num + 1,")],
                         ("EagleVerifyInput.generate_attn_arg_prefill", "qo_indptr", "wrong")),
    # The KV gather takes each request's place in the batch for its request-pool slot.
    "kv-indices-wrong-request": ([(EAGLE_INFO, _GEN + r"req_pool_indices=req_pool_indices,",
                                   r"\1req_pool_indices=torch.arange(batch_size, device=device),")],
                                 ("EagleVerifyInput.generate_attn_arg_prefill", "kv_indices", "wrong")),
    # The KV gather takes one token too many per request: the last spills past kv_indices.
    "kv-indices-one-too-many": ([(EAGLE_INFO, _GEN + r"(req_pool_indices=req_pool_indices,\n\s*)"
                                              r"seq_lens=paged_kernel_lens,", r"\1\2seq_lens=paged_kernel_lens + 1,")],
                                ("EagleVerifyInput.generate_attn_arg_prefill", "kv_indices", "overrun")),
    # Each last page taken as the whole KV row (a page-size slip): page size is 1.
    "kv-last-page-len-row": ([(FLASHINFER, r"_paged_kv_last_page_len_buf\.copy_\(\n\s*paged_kv_last_page_len,",
                               "_paged_kv_last_page_len_buf.copy_(paged_kv_indptr[1:] - paged_kv_indptr[:-1],")],
                             ("fast_prefill_plan", "_paged_kv_last_page_len_buf", "wrong")),
    # generate_attn_arg_prefill's indptr counts the prefix only, the gather the draft tokens too. (The packed
    # bytes showed this one before, blamed on the pack kernel; now the array that caused it is named.)
    "generated-kv-indptr-prefix-only": ([(EAGLE_INFO, r"(\n\s*)(paged_kernel_lens = paged_kernel_lens \+ "
                                                      r"self\.draft_token_num)(\n\s*)(cum_kv_seq_len\[1:\] = "
                                                      r"torch\.cumsum\(paged_kernel_lens, dim=0\))",
                                         r"\1\4\3\2")],
                                        ("EagleVerifyInput.generate_attn_arg_prefill", "kv_indptr", "wrong")),
    # The mask handed on trimmed one cell short of the batch's region (the packing still reads the cell).
    "custom-mask-one-short": ([(EAGLE_INFO, r"return kv_indices, cum_kv_seq_len, qo_indptr, self\.custom_mask\n",
                                "return kv_indices, cum_kv_seq_len, qo_indptr, self.custom_mask[: mask_numel - 1]\n")],
                              ("EagleVerifyInput.generate_attn_arg_prefill", "custom_mask", "overrun")),
    # The length the mask must cover taken as d**3 per request for d**2: a mask that already covers the
    # batch is padded into a fresh copy on every verify step (a mutation run's survivor: no cell it read
    # changed, so only the reuse decision shows it).
    "custom-mask-grown-although-it-fits": ([(EAGLE_INFO, r"\(self\.draft_token_num\*\*2\) \* batch_size",
                                             "(self.draft_token_num**3) * batch_size")],
                                           ("EagleVerifyInput.generate_attn_arg_prefill", "custom_mask", "wrong")),
    # The query rows' end shifted out (a mutation run's kill that was only a raise): the indptr handed on is
    # empty and fast_prefill_plan raises copying it. The array handed on before the raise is the cause.
    "qo-indptr-empty-then-plan-raises": ([(EAGLE_INFO, r"\(1 \+ batch_size\) \* self\.draft_token_num,",
                                           "(1 >> batch_size) * self.draft_token_num,")],
                                         ("EagleVerifyInput.generate_attn_arg_prefill", "qo_indptr", "wrong")),
    # fast_prefill_plan's default window turned from none (-1) to 0 tokens: every value the plan's arrays hold
    # is right, yet each query row of a server without a sliding window would see only itself. The plan's
    # thirteenth-on arguments were never judged before.
    "plan-window-default-zero": ([(FLASHINFER, r"(causal: bool = False,\n\s+window_left: int = )-1,", r"\g<1>0,")],
                                 ("fast_prefill_plan", "plan(window_left)", "wrong")),
}

#: the same arrays computed another way, locals renamed: must still hold
REFACTOR = [(FLASHINFER, r"kv_indptr_host = torch\.zeros\(bs \+ 1, dtype=torch\.int32, device=\"cpu\"\)\n"
                         r"\s*kv_indptr_host\[1:\] = torch\.cumsum\(seq_lens_cpu_i32, dim=0\)",
             "kv_indptr_host = torch.nn.functional.pad(torch.cumsum(seq_lens_cpu_i32, dim=0), (1, 0))"
             ".to(torch.int32)"),
            (EAGLE_INFO, r"\bcum_kv_seq_len\b", "kv_bounds"),
            # handed on as a view of the region it covers: the same storage, no copy
            (EAGLE_INFO, r"return kv_indices, kv_bounds, qo_indptr, self\.custom_mask\n",
             "return kv_indices, kv_bounds, qo_indptr, self.custom_mask[:mask_numel]\n")]


def _altered(edits) -> types.SimpleNamespace:
    """SGLang's reader modules with ``edits`` applied, each edited module executed afresh from its altered
    source (the installed one untouched, nothing else reimported). An edit that no longer applies fails."""
    from vmfuzz.harness.targets.sglang import readers

    found = dict(vars(readers.modules()))
    texts: dict[str, str] = {}
    for key, pattern, repl in edits:
        text = texts.get(key) or Path(found[key].__file__).read_text()
        if not re.search(pattern, text):
            pytest.fail(f"alteration no longer applies to the installed {key}: {pattern!r}")
        texts[key] = re.sub(pattern, repl, text)
    for key, text in texts.items():
        real = found[key]
        module = types.ModuleType(real.__name__)
        module.__file__, module.__package__ = real.__file__, real.__package__
        exec(compile(text, real.__file__, "exec"), module.__dict__)
        found[key] = module
    return types.SimpleNamespace(**found)


def _check_on(sglang_target, monkeypatch, edits):
    from vmfuzz.harness.targets.sglang import flashinfer

    monkeypatch.setattr(flashinfer, "modules", lambda: _altered(edits))
    return PROPERTIES["packed-mask"].check(sglang_target, FULL, [BATCH])


@pytest.mark.parametrize("alteration", sorted(ALTERATIONS))
def test_altered_sglang_plan_is_caught(sglang_target, monkeypatch, alteration):
    edits, (writer, buffer, effect) = ALTERATIONS[alteration]
    with pytest.raises(PropertyFailure) as caught:
        _check_on(sglang_target, monkeypatch, edits)
    origin = caught.value.origin
    assert_not_a_raise(caught.value.detail, origin)
    assert (origin.property, origin.effect, origin.writer, origin.buffer) == (
        "packed-mask", effect, writer, buffer), caught.value


def test_a_plan_that_raises_after_right_arrays_stays_a_raise(sglang_target, monkeypatch):
    """Only what was handed on before a raise is judged: when it was all right, the raise itself is passed
    on (never a property's catch), and the wrapper buffers the raising plan never refreshed are not blamed."""
    edits = [(FLASHINFER, r"self\._qo_indptr_buf\.copy_\(qo_indptr,", "self._qo_indptr_buf.copy_(qo_indptr[1:],")]
    with pytest.raises(RuntimeError, match="must match the size"):
        _check_on(sglang_target, monkeypatch, edits)


@pytest.mark.parametrize("edits", [[], REFACTOR], ids=["unaltered", "refactor"])
def test_unaltered_and_refactored_sglang_plan_holds(sglang_target, monkeypatch, edits):
    obs = _check_on(sglang_target, monkeypatch, edits)
    assert "flashinfer plan: judged" in obs.classes
