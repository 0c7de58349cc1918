"""The rest of the surface: the frozen-KV MTP call site, DFlash's verify-mask policy,
and the reasons ``vmfuzz surface`` gives for what stays not driven.

The sglang parts skip where SGLang cannot be imported (``VMFUZZ_REQUIRE_SGLANG=1``
makes that a failure). Each altered copy runs one cheap property in a subprocess.
"""

from __future__ import annotations


import pytest
from hypothesis import given, settings

from vmfuzz.harness.model.config import Batch, Config, ConfigError
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES
from vmfuzz.harness.engine.campaign.surface import NO_DRIVER, Row, Undriven, known_reason, not_driven, sglang_rows
from vmfuzz.harness.targets import CATALOGUE, resolve
from vmfuzz.strategies import configs
from tests.helpers import held_or_only_known
from tests.sglang_copies import altered_copy, run_cases, run_on_copy

FULL, QLEN = TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY
FROZEN = "srt/speculative/frozen_kv_mtp_worker_v2.py"
#: what the readers' work drives; everything else of 0.5.23 has a driver or a reason
READERS = {"kernels/ops/speculative/pack_verify_mask.py", "srt/layers/attention/flashinfer_backend.py"}



# -- the frozen-KV MTP call site: what it can run ---------------------------------

def test_frozen_site_takes_only_drafting_full_mask_configs():
    Config(FULL, 2, 8, 4, 2, 2, True, "frozen_kv_mtp").validate()
    with pytest.raises(ConfigError, match="FULL_MASK"):
        Config(QLEN, 2, 8, 4, 2, 2, True, "frozen_kv_mtp").validate()
    with pytest.raises(ConfigError, match="num_draft_tokens >= 2"):
        Config(FULL, 2, 8, 1, 1, 0, True, "frozen_kv_mtp").validate()


@settings(max_examples=40, deadline=None)
@given(configs(max_bs=(1, 3), max_context_len=(1, 8), num_draft_tokens=(2, 5), topk=(1, 2), spec_steps=(1, 3),
               call_sites=["frozen_kv_mtp", "eagle"]))
def test_strategies_draw_frozen_site_only_where_it_runs(config):
    config.validate()
    assert config.call_site == "eagle" or config.mode == FULL


@pytest.mark.parametrize("target_name", ["reference", "sglang"])
@pytest.mark.parametrize("prop", ["no-oob-write", "fallback-equivalence", "reference-agreement", "multi-step-reuse"])
def test_frozen_site_always_falls_back_and_holds(target_name, prop, request):
    target = resolve("reference") if target_name == "reference" else request.getfixturevalue("sglang_target")
    config = Config(FULL, 2, 5, 4, 2, 2, True, "frozen_kv_mtp").validate()
    # bs 1 fits the buffer: any other call site would reuse it; this one never does
    batches = [Batch((5,)), Batch((5, 0, 3))] if prop == "multi-step-reuse" else [Batch((5,))]
    obs = PROPERTIES[prop].check(target, config, batches)
    assert "call site frozen_kv_mtp" in obs.classes
    assert "path fallback" in obs.classes and "path reuse" not in obs.classes


def test_sglang_frozen_site_found_and_left_as_found(sglang_target):
    assert "frozen_kv_mtp" in sglang_target.call_sites
    fz = sglang_target.sglang.frozen()
    before = (fz.module.__dict__["ForwardBatch"], fz.module.__dict__["build_tree_kernel_efficient"])
    PROPERTIES["no-oob-write"].check(sglang_target, Config(FULL, 1, 3, 3, 2, 1, True, "frozen_kv_mtp"),
                                     [Batch((3, 2))])
    assert (fz.module.__dict__["ForwardBatch"], fz.module.__dict__["build_tree_kernel_efficient"]) == before


# -- DFlash's verify-mask policy over the real routers ------------------------------

def test_dflash_policy_resolves_to_the_verify_child_except_behind_dots(sglang_target):
    from vmfuzz.harness.model.routing import ROUTERS, SPEC_MODES, Child, verify_child

    for router, roles in ROUTERS.items():
        for spec_mode in SPEC_MODES:
            r = sglang_target.route(router, spec_mode, {role: Child(role, None, 8) for role in roles}, 8)
            if router != "dots-swa":
                assert r.dflash_resolves == verify_child(router, spec_mode), (router, spec_mode)
            else:
                # The known finding (known/dflash-policy-behind-dots-wrapper.json): the policy stops at the wrapper.
                assert r.dflash_resolves == "DotsSWAMLAAttnBackend", (router, spec_mode, r.dflash_resolves)


def test_routing_fails_on_the_dots_policy_unless_it_is_known_and_then_checks_the_rest(sglang_target):
    from vmfuzz.harness.engine.regression.known import applicable, attach, default_known_root, entries
    from vmfuzz.harness.properties import PropertyFailure

    config, batches = Config(FULL, 2, 4, 3, 2, 2, True), [Batch((4, 1))]
    attached = sglang_target.known_findings
    try:
        sglang_target.known_findings = ()
        with pytest.raises(PropertyFailure, match="dots-swa router.*DFlash"):
            PROPERTIES["routing"].check(sglang_target, config, batches)
        found = applicable(entries(default_known_root()), dict(sglang_target.versions()))
        assert [k.name for _, k in found if k.repro.property == "routing"], found
        attach(sglang_target, found)
        obs = PROPERTIES["routing"].check(sglang_target, config, batches)
    finally:
        sglang_target.known_findings = attached
    assert any(c.startswith("dots-swa: known finding") for c in obs.classes), obs.classes
    # the other routers are still checked in the same case
    assert "hybrid: dflash policy -> decode" in obs.classes and "tbo: dflash policy -> primary" in obs.classes


def test_dflash_variant_is_caught_by_routing_on_reference(tmp_path):
    from vmfuzz.harness.engine.search.search import run_property
    from vmfuzz.harness.model.bounds import Bounds

    assert "dflash-policy-prefill" in CATALOGUE
    target = CATALOGUE["dflash-policy-prefill"].layer(resolve("reference"))
    result = run_property(target, PROPERTIES["routing"], seed=1, max_examples=5, bounds=Bounds(),
                          findings_dir=tmp_path)
    assert result.finding is not None and "DFlash" in result.finding.detail


# -- FlashAttention's allocation site, imported with its CUDA extension stubbed ----------

def test_flashattention_site_is_driven_and_its_stubs_do_not_leak(sglang_target):
    import sys

    from vmfuzz.harness.model.allocation import ServerNumbers
    from vmfuzz.harness.targets.sglang.allocation import load_sites

    before = set(sys.modules)
    sites = load_sites()
    assert not isinstance(sites["flashattention"], str), sites["flashattention"]
    # the stubs and what imported them are forgotten: a later import fails as before
    assert not {m for m in set(sys.modules) - before if m.startswith("sgl_kernel") or "flashattention" in m}
    with pytest.raises(ImportError):
        __import__("sglang.srt.layers.attention.flashattention_backend")
    numbers = ServerNumbers(max_bs=6, context_len=2048, num_draft_tokens=5, topk=2, spec_steps=3)
    call = sglang_target.allocation_call("flashattention", numbers)
    assert (call.max_bs, call.max_context_len, call.num_draft_tokens, call.is_read) == (6, 2048, 5, True)
    assert call.mask.buffer.device.type == "meta"
    assert "flashmla" in str(sites["flashmla"])


# -- surface: NOT_DRIVEN rows and reasons --------------------------------------------

def test_module_reason_overrides_no_driver_yet():
    said = [Undriven("srt/x.py", "X.f", "because of Y", "vmfuzz.harness.targets.sglang.fake")]
    assert known_reason("srt/x.py", said) == "because of Y"
    assert known_reason("srt/other.py", said) == NO_DRIVER
    assert known_reason("kernels/jit/csrc/speculative/tree.cuh", []) != NO_DRIVER


def test_not_driven_entries_are_rows_even_beside_a_driven_function(tmp_path):
    pkg = tmp_path / "sglang"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "srt" / "a.py").write_text("def f(): return VerifyMask\ndef g(): return VerifyMask\n")
    (pkg / "srt" / "b.py").write_text("VerifyMask\n")
    from vmfuzz.harness.engine.campaign.surface import Entry

    target = resolve("reference")
    rows = sglang_rows(target, pkg, entries=[Entry("srt/a.py", "f", ("no-oob-write",), "m")],
                       undriven=[Undriven("srt/a.py", "g", "g needs a GPU", "m"),
                                 Undriven("srt/b.py", "", "b is an interface", "m")])
    by = {(r.file, r.function): r for r in rows}
    assert by[("srt/a.py", "f")].driven
    assert not by[("srt/a.py", "g")].driven and by[("srt/a.py", "g")].why == "g needs a GPU"
    assert by[("srt/b.py", "")].why == "b is an interface"
    assert all(isinstance(r, Row) for r in rows) and len(rows) == 3


def test_every_not_driven_entry_is_well_formed():
    entries = not_driven()
    assert entries, "the modules declare what they do not drive"
    assert all(e.why and not e.file.startswith("sglang/") for e in entries)


def test_no_sglang_file_is_left_without_a_driver_or_a_reason(sglang_target):
    from vmfuzz.harness.engine.campaign.surface import loaded_package

    rows = sglang_rows(sglang_target, loaded_package())
    files = {r.file for r in rows if r.in_grep}
    assert len(files) == 29
    bare = {r.file for r in rows if r.in_grep and not r.driven and r.why == NO_DRIVER}
    assert bare <= READERS, bare
    driven = {r.file for r in rows if r.driven}
    assert {FROZEN, "srt/speculative/dflash_utils.py", "srt/layers/attention/flashattention_backend.py"} <= driven


# -- altered copies --------------------------------------------------------------

#: name -> (edits, the property that must catch it)
ALTERATIONS = {
    # the length sum the fallback is sized from, taken as if seq_lens counted the bonus token
    "frozen-mtp-short-length-sum": ([([FROZEN], r"batch\.seq_lens_sum = torch\.sum\(batch\.seq_lens\)\.item\(\)",
                                      "batch.seq_lens_sum = torch.sum(batch.seq_lens - 1).item()")],
                                    "no-oob-write"),
    # the hybrid router resolved through its prefill child, whatever runs TARGET_VERIFY
    "dflash-resolves-through-prefill": ([(["srt/speculative/dflash_utils.py"],
                                          r"backend = backend\._select_backend\(ForwardMode\.TARGET_VERIFY\)",
                                          "backend = backend.prefill_backend")],
                                        "routing"),
    # FlashAttention's cuda-graph set-up (imported with sgl_kernel stubbed) sizes for one request fewer
    "flashattention-allocates-max-bs-minus-one": (
        [(["srt/layers/attention/flashattention_backend.py"],
          r"(self\._verify_mask = maybe_create_verify_mask\(\n(?:.*\n)*?\s*)max_bs=max_bs,",
          r"\1max_bs=max_bs - 1,")],
        "allocation-soundness"),
}



@pytest.mark.parametrize("alteration", run_cases(ALTERATIONS), ids=lambda a: a or "unaltered")
@pytest.mark.slow
def test_altered_copy_is_caught(sglang_target, alteration, tmp_path):
    edits, prop = ALTERATIONS[alteration] if alteration else ([], None)
    props = [prop] if prop else ["no-oob-write", "routing", "allocation-soundness"]
    site = altered_copy(tmp_path, edits, alteration)
    args = [a for p in props for a in ("--property", p)]
    proc, out = run_on_copy(site, tmp_path, "run", "--target", "sglang", "--seed", "1", "--max-examples", "5", *args,
                            "--report-dir", str(tmp_path / "report"))
    if alteration is None:
        held_or_only_known(proc, out, tmp_path / "report")
        return
    assert proc.returncode == 1, out
    failed = [line for line in proc.stdout.splitlines() if "FAILED" in line]
    assert failed and all(prop in line for line in failed), out
    assert "target raised" not in out, out
