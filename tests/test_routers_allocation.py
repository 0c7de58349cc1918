"""``routing`` and ``allocation-soundness``: the routers and the allocation sites of the mask.

On ``reference`` and on ``sglang`` (SGLang's real router classes and the
allocating backends' real cuda-graph set-up), the properties hold; every
router and allocation variant is caught; and altered copies of the installed
SGLang -- a bad edit to each router and to two allocation sites -- are caught
through ``vmfuzz.harness.cli run --target sglang``, while the pristine copy passes.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from vmfuzz.harness.model.allocation import ServerNumbers
from vmfuzz.harness.engine.search.search import run_property
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.cli import main
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
from vmfuzz.harness.model.routing import ROUTERS, SPEC_MODES, Child, verify_child
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.targets import CATALOGUE, resolve
from tests.helpers import held_or_only_known
from tests.sglang_copies import altered_copy, assert_caught_by, assert_not_a_raise, run_cases, run_on_copy

ROOT = Path(__file__).resolve().parent.parent
OURS = ("routing", "allocation-soundness")
ROUTER_VARIANTS = ("hybrid-decode-mask", "tbo-child-mask", "linear-child-mask", "router-short-context")
ALLOCATION_VARIANTS = ("alloc-max-bs-short", "alloc-wrong-d")



def _targets(request):
    return resolve("reference") if request.param == "reference" else request.getfixturevalue("sglang_target")


@pytest.fixture(params=["reference", pytest.param("sglang", marks=pytest.mark.slow)])
def target(request):
    return _targets(request)


# -- the properties hold -----------------------------------------------------------

@pytest.mark.parametrize("prop", OURS)
def test_property_holds(target, prop, tmp_path):
    res = run_property(target, PROPERTIES[prop], seed=5, max_examples=8,
                       bounds=getattr(target, "bounds", None) or Bounds(), findings_dir=tmp_path)
    assert res.finding is None, res.finding.detail
    if prop == "routing":
        for router in ROUTERS:
            for mode in SPEC_MODES:
                assert f"{router} ({mode}) -> {verify_child(router, mode)}" in res.classes
        assert {"path reuse", "path fallback"} <= set(res.classes)
    else:
        assert any(c.startswith("site ") for c in res.classes)


def test_sglang_routers_are_the_real_classes(sglang_target):
    cfg = Config(TreeMaskMode.FULL_MASK, 2, 8, 3, 2, 2)
    heap = ShadowHeap("cpu")
    want = {"hybrid": "HybridAttnBackend", "tbo": "TboAttnBackend", "hybrid-linear": "HybridLinearAttnBackend",
            "dots-swa": "DotsSWAMLAAttnBackend"}
    for router, roles in ROUTERS.items():
        children = {r: Child(r, sglang_target.allocate(cfg, heap), 8) for r in roles}
        for mode in SPEC_MODES:
            r = sglang_target.route(router, mode, children, 8)
            assert type(r.backend).__name__ == want[router]
            assert type(r.backend).__module__.startswith("sglang.")
            # the dispatch of a TARGET_VERIFY forward is observed, not assumed
            assert r.serves_verify == verify_child(router, mode)


def test_sglang_router_step_sizes_the_fallback_from_the_reported_context(sglang_target):
    """The step runs SGLang's call site with the length sum unknown: a router that
    under-reports its context makes the FULL_MASK fallback too short, and the
    guard sees the write past it (not only the arithmetic check)."""
    cfg = Config(TreeMaskMode.FULL_MASK, 1, 8, 3, 2, 2)
    batch = Batch((8, 8))  # past max_bs: the fallback
    for reported, overflows in ((8, False), (4, True)):
        heap = ShadowHeap("cpu")
        mask = sglang_target.allocate(cfg, heap)
        backend = SimpleNamespace(verify_mask=mask, max_context_len=reported)
        routing = SimpleNamespace(backend=backend)
        out = sglang_target.verify_routed(routing, cfg, batch, heap)
        assert not out.reused
        assert bool(heap.check()) is overflows


def test_sglang_allocation_sites_record_their_own_arguments(sglang_target):
    sites = sglang_target.allocating_backends()
    assert sites["triton"] is None
    numbers = ServerNumbers(max_bs=8, context_len=4096, num_draft_tokens=4, topk=2, spec_steps=3)
    call = sglang_target.allocation_call("triton", numbers)
    assert (call.max_bs, call.max_context_len, call.num_draft_tokens, call.is_read) == (8, 4096, 4, True)
    assert call.mask.buffer.device.type == "meta" and call.mask.buffer.numel() == 8 * 4 * (4096 + 4)
    # every site is driven on a CPU host, FlashMLA's too (its "cuda" scratch on meta)
    assert all(why is None for why in sites.values()), sites


def test_no_drivable_site_fails_rather_than_holds():
    target = resolve("reference")
    target.allocating_backends = lambda: {"triton": "not importable here"}
    with pytest.raises(PropertyFailure, match="no allocation site can be driven"):
        PROPERTIES["allocation-soundness"].check(target, Config(TreeMaskMode.FULL_MASK, 2, 8, 3, 2, 2), [Batch((1,))])


def test_a_target_without_the_seams_gets_them_not_driven(tmp_path):
    from vmfuzz.harness.engine.search.search import search_property
    from vmfuzz.harness.targets.reference import ReferenceTarget

    class CoreOnly(ReferenceTarget):
        route = verify_routed = allocating_backends = allocation_call = None

    for prop in OURS:
        res = search_property(CoreOnly(), PROPERTIES[prop], seed=1, max_examples=3, bounds=Bounds(),
                              findings_dir=tmp_path)
        assert res.not_driven and res.examples == 0


# -- the variants are caught --------------------------------------------------------

@pytest.mark.parametrize("variant", ROUTER_VARIANTS + ALLOCATION_VARIANTS)
def test_variant_is_caught(target, variant, tmp_path):
    prop = "routing" if variant in ROUTER_VARIANTS else "allocation-soundness"
    layered = CATALOGUE[variant].layer(target)
    res = run_property(layered, PROPERTIES[prop], seed=2, max_examples=6,
                       bounds=getattr(target, "bounds", None) or Bounds(), findings_dir=tmp_path)
    assert res.finding is not None, f"{layered.name} survived {prop}"
    # caught by the property's own check, never by the target raising
    assert res.finding.origin.property == prop, res.finding.origin
    assert_not_a_raise(res.finding.detail, res.finding.origin)
    # the repro replays
    assert main(["replay", str(res.finding.path), "--target", layered.name, "--isolate", "off"]) == 1


# -- deployments --------------------------------------------------------------------

def _deployment(tmp_path, **fields):
    base = {"cuda_graph_max_bs": 2, "max_running_requests": 4, "context_length": 8, "num_draft_tokens": 3,
            "topk": 2, "spec_steps": 2}
    path = tmp_path / "dep.json"
    path.write_text(json.dumps({**base, **fields}))
    return path


def test_old_deployment_files_load_with_defaults():
    from vmfuzz.harness.model.deployment_file import load
    dep = load(ROOT / "examples" / "deployment-pr33127.json")
    assert (dep.speculative_attention_mode, dep.pp_size, dep.backends()) == ("prefill", 1, ("", ""))


@pytest.mark.parametrize("field,value,says", [
    ("speculative_attention_mode", "verify", "speculative_attention_mode must be one of prefill, decode"),
    ("decode_attention_backend", "tritn", "decode_attention_backend 'tritn' is not an SGLang attention backend"),
    ("attention_backend", "", None),
    ("pp_size", 0, "pp_size must be >= 1"),
    ("pp_size", "two", "invalid deployment"),
])
def test_bad_serving_fields_exit_2_with_one_line(tmp_path, capsys, field, value, says):
    path = _deployment(tmp_path, **{field: value})
    rc = main(["run", "--deployment", str(path), "--property", "allocation-soundness", "--max-examples", "2",
               "--report-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    if says is None:
        assert rc == 0, err
        return
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and says in err, err


@pytest.mark.parametrize("mode,site_line", [("decode", "triton (triton) allocates for max_bs 2"),
                                            ("prefill", "flashinfer preallocates no verify mask")])
def test_deployment_answers_routing_and_allocation(tmp_path, capsys, mode, site_line):
    path = _deployment(tmp_path, prefill_attention_backend="flashinfer", decode_attention_backend="triton",
                       speculative_attention_mode=mode, pp_size=2)
    rc = main(["run", "--deployment", str(path), "--property", "routing", "--max-examples", "3",
               "--report-dir", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"routing: held: HybridAttnBackend(prefill=flashinfer, decode=triton), speculative_attention_mode {mode}" in out
    assert site_line in out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["deployment"]["routing"]["ok"] is True


def test_deployment_with_a_misrouting_target_fails(tmp_path, capsys):
    path = _deployment(tmp_path, prefill_attention_backend="triton", decode_attention_backend="fa3",
                       speculative_attention_mode="prefill")
    rc = main(["run", "--target", "reference+hybrid-decode-mask", "--deployment", str(path),
               "--property", "capacity-soundness", "--max-examples", "2", "--report-dir", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "routing: FAILED: HybridAttnBackend(prefill=triton, decode=fa3)" in out
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["deployment"]["routing"]["ok"] is False


def test_deployment_allocation_fails_for_a_short_site(tmp_path, capsys):
    path = _deployment(tmp_path, attention_backend="trtllm_mla")
    rc = main(["run", "--target", "reference+alloc-max-bs-short", "--deployment", str(path),
               "--property", "capacity-soundness", "--max-examples", "2", "--report-dir", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert rc == 1 and "allocation: FAILED: trtllm_mla: maybe_create_verify_mask(max_bs=1" in out, out


# -- altered copies of the installed SGLang --------------------------------------------

_ATTN = "srt/layers/attention/"

#: Each a bad edit a reviewer could plausibly miss in a router or an allocation site.
ALTERATIONS = {
    # #32920's routing undone: verification is assumed to run on the decode child
    "hybrid-mask-from-decode": [([_ATTN + "hybrid_attn_backend.py"],
                                 r"return self\._select_backend\(ForwardMode\.TARGET_VERIFY\)\.verify_mask",
                                 "return self.decode_backend.verify_mask")],
    # #32690 undone: the hybrid no longer reports the model's context length
    "hybrid-drops-max-context-len": [([_ATTN + "hybrid_attn_backend.py"],
                                      r"\n        self\.max_context_len = model_runner\.model_config\.context_len\n",
                                      "\n")],
    "tbo-mask-from-overlap-child": [([_ATTN + "tbo_backend.py"], r"return self\.primary\.verify_mask",
                                     "return self.children[0].verify_mask")],
    "linear-mask-from-linear-child": [([_ATTN + "hybrid_linear_attn_backend.py"],
                                       r"return self\.full_attn_backend\.verify_mask",
                                       "return self.linear_attn_backend.verify_mask")],
    # a refactor that lets the Dots wrapper inherit its child's "no CPU lengths":
    # the scheduler then drops the length sum, and the wrapper reports no context
    "dots-forgets-cpu-seq-lens": [([_ATTN + "dots_hybrid_backend.py"],
                                   r"(self\.kv_index_translator = backend\.kv_index_translator\n"
                                   r"        self\.needs_cpu_seq_lens = )True",
                                   r"\1backend.needs_cpu_seq_lens")],
    "triton-allocates-max-bs-minus-one": [([_ATTN + "triton_backend.py"],
                                           r"(maybe_create_verify_mask\(\n(?:.*\n)*?\s*)max_bs=max_bs,",
                                           r"\1max_bs=max_bs - 1,")],
    # the draft width confused with the step count, where __init__ derives it
    "triton-init-draft-width-from-steps": [([_ATTN + "triton_backend.py"],
                                            r"self\.num_draft_tokens = get_spec\(\)\.speculative_num_draft_tokens",
                                            "self.num_draft_tokens = get_spec().speculative_num_steps")],
    "qwen-sparse-short-draft-width": [([_ATTN + "qwen_sparse_attn_backend.py"],
                                       r"num_draft_tokens=get_spec\(\)\.speculative_num_draft_tokens,",
                                       "num_draft_tokens=get_spec().speculative_num_draft_tokens - 1,")],
}



@pytest.mark.slow
@pytest.mark.parametrize("alteration", run_cases(ALTERATIONS), ids=lambda a: a or "unaltered")
def test_altered_router_or_allocation_site_is_caught(sglang_target, alteration, tmp_path):
    site = altered_copy(tmp_path, ALTERATIONS[alteration] if alteration else [], alteration)
    proc, out = run_on_copy(site, tmp_path, "run", "--target", "sglang", "--seed", "1", "--max-examples", "10",
                            "--property", "routing", "--property", "allocation-soundness",
                            "--report-dir", str(tmp_path / "report"))
    if alteration is None:
        held_or_only_known(proc, out, tmp_path / "report")
        return
    assert proc.returncode == 1, out
    failed = [line for line in proc.stdout.splitlines() if "FAILED" in line]
    want = "allocation-soundness" if alteration.startswith(("triton", "qwen")) else "routing"
    assert failed and all(want in line for line in failed), out
    # a finding names what went wrong, read from its origin: not a crash of the harness
    assert_caught_by(tmp_path / "report", want, out=out)


def test_sglang_modules_are_left_as_found(sglang_target):
    """What a router's construction or a site's set-up binds is put back, even when the set-up raises."""
    import importlib

    names = {"sglang.srt.layers.attention.hybrid_attn_backend": ("get_spec",),
             "sglang.srt.layers.attention.hybrid_linear_attn_backend": ("check_cuda_graph_backend",),
             "sglang.srt.layers.attention.triton_backend": ("maybe_create_verify_mask", "get_spec", "get_exec",
                                                            "get_parallel", "get_schedule", "mambaish_config"),
             "sglang.srt.layers.attention.qwen_sparse_attn_backend": ("maybe_create_verify_mask", "get_spec")}
    mods = {m: importlib.import_module(m) for m in names}

    def seams():
        return {(m, a): mods[m].__dict__.get(a) for m, attrs in names.items() for a in attrs}

    before = seams()
    cfg = Config(TreeMaskMode.FULL_MASK, 2, 8, 3, 2, 2)
    PROPERTIES["routing"].check(sglang_target, cfg, [Batch((3, 8, 1))])
    PROPERTIES["allocation-soundness"].check(sglang_target, cfg, [Batch((1,))])
    assert seams() == before
    with pytest.raises(TypeError):  # no context length: triton's set-up cannot size its buffers
        sglang_target.allocation_call("triton", ServerNumbers(2, None, 3, 2, 2))
    assert seams() == before
