"""Behaviour-preserving refactors of the installed SGLang never read as findings.

SGLang under review is never exactly the release vmfuzz was written against.
Each refactor below changes how the code is shaped, not what it does: vmfuzz
must still drive it (exit 0) or say it is out of step, naming the seam (exit
3) -- never exit 1, which is reserved for the target misbehaving. The bug
copies prove that a real bug on top of a refactor is still caught, by the
property meant to catch it; the pristine copy passes.
"""

from __future__ import annotations

import json

import pytest

from tests.sglang_copies import altered_copy, run_on_copy

VERIFY_MASK = ["srt/layers/attention/verify_mask.py"]
EAGLE_UTILS = ["srt/speculative/eagle_utils.py"]
CALL_SITE = ["srt/speculative/eagle_worker_common.py"]
WORKER_V2 = ["srt/speculative/eagle_worker_v2.py"]
CHAIN_WRITER = ["kernels/ops/speculative/eagle.py"]
TRITON = ["srt/layers/attention/triton_backend.py"]
SPEC_TREE = ["kernels/ops/speculative/spec_tree.py"]
PP_SITE = ["srt/managers/scheduler_pp_mixin.py"]
TRTLLM_MLA = ["srt/layers/attention/trtllm_mla_backend.py"]
#: every SGLang module that calls maybe_create_verify_mask
ALLOCATORS = ["deepseek_v4_backend", "deepseek_v4_backend_hip_radix", "flashattention_backend", "flashmla_backend",
              "trtllm_mla_backend", "triton_backend", "qwen_sparse_attn_backend"]

_POSITIONAL_KERNEL_CALL = (r"build_tree_kernel_efficient_func\(\n\s*parent_list,\n\s*top_scores_index,\n\s*seq_lens,\n"
                           r"\s*tree_mask,\n\s*positions,\n\s*retrieve_index,\n\s*retrieve_next_token,\n"
                           r"\s*retrieve_next_sibling,\n\s*topk,\n\s*spec_steps,\n\s*num_verify_tokens,\n"
                           r"\s*tree_mask_mode,\n\s*\)")
_KEYWORD_KERNEL_CALL = ("build_tree_kernel_efficient_func(tree_mask_mode=tree_mask_mode, "
                        "num_verify_tokens=num_verify_tokens, spec_steps=spec_steps, topk=topk, "
                        "retrieve_next_sibling=retrieve_next_sibling, retrieve_next_token=retrieve_next_token, "
                        "retrieve_index=retrieve_index, positions=positions, tree_mask=tree_mask, "
                        "seq_lens=seq_lens, top_scores_index=top_scores_index, parent_list=parent_list)")

_LAYOUT_OMITTED_AT_ITS_DEFAULT = (
    "build_tree_kernel_efficient_func(parent_list, top_scores_index, seq_lens, tree_mask, positions, "
    "retrieve_index, retrieve_next_token, retrieve_next_sibling, topk, spec_steps, num_verify_tokens, "
    "**({} if tree_mask_mode == TreeMaskMode.QLEN_ONLY else {'tree_mask_mode': tree_mask_mode}))")

#: the allocator's draft-width keyword renamed (to a name SGLang's kernels use), every caller updated
_ALLOCATOR_KEYWORD_RENAMED = [
    (VERIFY_MASK, r"num_draft_tokens: Optional\[int\],", "draft_token_num: Optional[int],"),
    (VERIFY_MASK, r"or not num_draft_tokens:", "or not draft_token_num:"),
    (VERIFY_MASK, r"(tree_mask_numel\(\s*mode,\s*max_bs,\s*)num_draft_tokens", r"\1draft_token_num"),
] + [([f"srt/layers/attention/{m}.py"], r"(maybe_create_verify_mask\((?:[^()]|\([^()]*\))*?)\bnum_draft_tokens=",
      r"\1draft_token_num=") for m in ALLOCATORS]

#: name -> (edits, properties to run, exit codes allowed, words the out-of-step line must hold)
REFACTORS = {
    "allocator-keyword-renamed": (_ALLOCATOR_KEYWORD_RENAMED, ("no-oob-write", "allocation-soundness"), {0}, ""),
    # the Triton tree wrapper vmfuzz launches, renamed: out of step, not an SGLang that is unavailable
    "triton-tree-wrapper-renamed": (
        [(SPEC_TREE, r"\bsgl_build_tree_kernel_triton\b", "build_tree_kernel_triton")],
        ("no-oob-write",), {3}, "sgl_build_tree_kernel_triton"),
    # an attribute the stand-in never set, now set by a module-level helper of the backend's module
    "attribute-set-by-a-module-helper": (
        [(TRTLLM_MLA, r"self\.num_draft_tokens = get_spec\(\)\.speculative_num_draft_tokens", "_init_draft_width(self)"),
         (TRTLLM_MLA, r"self\.num_draft_tokens\b", "self.draft_width"),
         (TRTLLM_MLA, r"\Z", "\n\ndef _init_draft_width(backend):\n"
                              "    backend.draft_width = get_spec().speculative_num_draft_tokens\n")],
        ("allocation-soundness",), {0}, ""),
    # a value the reader path computed in place, hoisted into TritonAttnBackend.__init__
    "reader-value-hoisted-into-init": (
        [(TRITON, r"(        self\.forward_metadata: ForwardMetadata = None\n)",
          r"\1        self._verify_qo_dtype = torch.int32\n"),
         (TRITON, r"(step=num_tokens_per_req,\n\s*)dtype=torch\.int32,(\n\s*device=self\.device,\n\s*\)\n"
                  r"\s*kv_indptr = self\._fill_kv_indptr_and_indices\()", r"\1dtype=self._verify_qo_dtype,\2")],
        ("reader-agreement",), {0}, ""),
    # the backend's verify state kept in slots
    "triton-backend-gains-slots": (
        [(TRITON, r"(class TritonAttnBackend\(AttentionBackend\):\n)",
          r'\1    __slots__ = ("_verify_mask", "forward_metadata")\n')],
        ("reader-agreement",), {0}, ""),
    # the kernel entry's layout gains a default, and the wrapper leaves it out when it is that default
    "kernel-layout-left-at-its-default": (
        [(SPEC_TREE, r"(num_verify_tokens: int,\n\s*tree_mask_mode: TreeMaskMode)(,\n\) -> None:)",
          r"\1 = TreeMaskMode.QLEN_ONLY\2"),
         (EAGLE_UTILS, _POSITIONAL_KERNEL_CALL, _LAYOUT_OMITTED_AT_ITS_DEFAULT)],
        ("no-oob-write", "reference-agreement"), {0}, ""),
    # fits gains an option whose default admits one more, and every call site passes the strict value
    "fits-called-with-a-non-default-option": (
        [(VERIFY_MASK, r"def fits\(self, bs: int\) -> bool:", "def fits(self, bs: int, *, margin: int = 0) -> bool:"),
         (VERIFY_MASK, r"return bs <= self\.max_bs", "return bs + margin <= self.max_bs + 1"),
         (CALL_SITE, r"verify_mask\.fits\(bs\)", "verify_mask.fits(bs, margin=1)"),
         (PP_SITE, r"verify_mask\.fits\(bs\)", "verify_mask.fits(bs, margin=1)"),
         (WORKER_V2, r"verify_mask\.fits\(bs\)", "verify_mask.fits(bs, margin=1)")],
        ("no-oob-write",), {0}, ""),
    # a new option with a default is not the pre-#33127 fits(bs, d)
    "fits-gains-keyword-only-option": (
        [(VERIFY_MASK, r"def fits\(self, bs: int\)", "def fits(self, bs: int, *, strict: bool = True)")],
        ("capacity-soundness", "no-oob-write"), {0}, ""),
    # fits's parameter renamed, and the call site passes it by keyword
    "fits-parameter-renamed-called-by-keyword": (
        [(VERIFY_MASK, r"def fits\(self, bs: int\) -> bool:", "def fits(self, batch_size: int) -> bool:\n        bs = batch_size"),
         (CALL_SITE, r"verify_mask\.fits\(bs\)", "verify_mask.fits(batch_size=bs)")],
        ("no-oob-write", "fallback-equivalence"), {0}, ""),
    # the kernel called with SGLang's own keyword names, in another order
    "kernel-called-by-keyword-reordered": (
        [(EAGLE_UTILS, _POSITIONAL_KERNEL_CALL, _KEYWORD_KERNEL_CALL)],
        ("no-oob-write", "reference-agreement"), {0}, ""),
    # the module global vmfuzz patches at the kernel entry is renamed
    "kernel-entry-global-renamed": (
        [(EAGLE_UTILS, r"    build_tree_kernel_efficient_func,\n", "    build_tree_kernel_efficient_func as _tree_kernel,\n"),
         (EAGLE_UTILS, r"    build_tree_kernel_efficient_func\(\n", "    _tree_kernel(\n")],
        ("no-oob-write", "reference-agreement"), {0}, ""),
    # the kernel reached through its module, not the name eagle_utils imported
    "kernel-reached-through-its-module": (
        [(EAGLE_UTILS, r"    build_tree_kernel_efficient_func\(\n",
          "    __import__('sglang.kernels.ops.speculative.spec_tree', fromlist=['_']).build_tree_kernel_efficient_func(\n")],
        ("no-oob-write",), {0}, ""),
    # the wrapper reached through eagle_utils rather than imported by name
    "wrapper-behind-its-module": (
        [(CALL_SITE, r"\n    build_tree_kernel_efficient,\n", "\n"),
         (CALL_SITE, r"tree_outputs = build_tree_kernel_efficient\(",
          "tree_outputs = __import__('sglang.srt.speculative.eagle_utils', fromlist=['_']).build_tree_kernel_efficient(")],
        ("no-oob-write",), {0}, ""),
    # the chain writer's private Triton kernel renamed
    "chain-kernel-renamed": (
        [(CHAIN_WRITER, r"_build_chain_tree_kernel", "_chain_tree_kernel")],
        ("chain-writer",), {0}, ""),
    # the d = 1 call site's private method renamed: vmfuzz cannot find it
    "trivial-call-site-renamed": (
        [(WORKER_V2, r"_build_trivial_verify_input", "_trivial_verify_input")],
        ("trivial-path",), {3}, "_build_trivial_verify_input"),
    # a private helper of the triton reader renamed: vmfuzz never calls it by name
    "reader-private-helper-renamed": (
        [(TRITON, r"_update_target_verify_buffers", "_refresh_target_verify_buffers")],
        ("reader-agreement",), {0}, ""),
}

TBO = ["srt/layers/attention/tbo_backend.py"]
HYBRID = ["srt/layers/attention/hybrid_attn_backend.py"]

#: The binding refactors: each reshapes how SGLang is called or what type it hands back,
#: never what it computes. vmfuzz must bind by names and behaviour, not by position, import style,
#: struct library or the depth at which a launch happens.
BINDING_REFACTORS = {
    # the TBO router's overlap children and the chain writer's buffer become keyword-only; SGLang's
    # own callers (init_new, the call site) already pass them by name, or are made to
    "keyword-only-tbo-router": (
        [(TBO, r"def __init__\(self, primary: AttentionBackend, children:",
          "def __init__(self, primary: AttentionBackend, *, children:")],
        ("routing",), {0}, ""),
    "keyword-only-chain-writer": (
        [(CHAIN_WRITER, r"(def build_chain_tree\(\n\s*bonus_tokens,\n\s*draft_tokens,\n\s*seq_lens,\n)",
          r"\1    *,\n"),
         (CALL_SITE, r"(build_chain_tree\(\n\s*draft_input\.bonus_tokens,\n\s*draft_tokens,\n\s*batch\.seq_lens,"
                     r"\n\s*)tree_mask_buf,", r"\1tree_mask_buf=tree_mask_buf,")],
        ("chain-writer", "no-oob-write"), {0}, ""),
    # the hybrid router reads the server's spec through the module that defines the lookup
    "router-looks-up-through-its-module": (
        [(HYBRID, r"from sglang\.srt\.runtime_context import \(\n\s*get_exec,\n\s*get_spec,\n\)",
          "from sglang.srt import runtime_context\nfrom sglang.srt.runtime_context import get_exec"),
         (HYBRID, r"\bget_spec\(\)", "runtime_context.get_spec()")],
        ("routing",), {0}, ""),
    # the mask's struct becomes a frozen dataclass with the same fields and the same fits
    "verify-mask-is-a-frozen-dataclass": (
        [(VERIFY_MASK, r"class VerifyMask\(msgspec\.Struct, frozen=True\):",
          "@dataclasses.dataclass(frozen=True)\nclass VerifyMask:"),
         (VERIFY_MASK, r"\nimport msgspec\n", "\nimport dataclasses\n")],
        ("no-oob-write", "capacity-soundness", "fallback-equivalence"), {0}, ""),
    # the wrapper hands its outputs to a helper of its module, which launches the kernel
    "tree-kernel-launched-one-call-deeper": (
        [(EAGLE_UTILS, _POSITIONAL_KERNEL_CALL,
          "_write_tree(parent_list, top_scores_index, seq_lens, (tree_mask, positions, retrieve_index, "
          "retrieve_next_token, retrieve_next_sibling), (topk, spec_steps, num_verify_tokens), tree_mask_mode)"),
         (EAGLE_UTILS, r"\Z", "\n\ndef _write_tree(parents, chosen, lens, outs, shape, layout):\n"
                              "    build_tree_kernel_efficient_func(parents, chosen, lens, *outs, *shape,\n"
                              "                                     layout)\n")],
        ("no-oob-write", "reference-agreement"), {0}, ""),
    # the entry captured in a partial at import: no module global vmfuzz can bind leads to it, so the
    # write cannot be guarded -- out of step, never the CPU dispatch's raise judged as SGLang's
    "tree-kernel-captured-at-import": (
        [(EAGLE_UTILS, r"    build_tree_kernel_efficient_func\(\n", "    _captured_tree_kernel(\n"),
         (EAGLE_UTILS, r"\Z", "\n\n_captured_tree_kernel = partial(build_tree_kernel_efficient_func)\n")],
        ("no-oob-write",), {3}, "build_tree_kernel_efficient"),
    # the device's default layout computed once, at import, from the real host: the imitated host is
    # never asked at run time, so the allocator's module is imported again while it answers (it was a
    # false allocation finding, then out of step)
    "default-layout-computed-at-import": (
        [(VERIFY_MASK, r"mode = default_tree_mask_mode\(\) if is_read else", "mode = _HOST_DEFAULT if is_read else"),
         (VERIFY_MASK, r"\Z", "\n\n_HOST_DEFAULT = default_tree_mask_mode()\n")],
        ("capacity-liveness", "allocation-soundness"), {0}, ""),
}
REFACTORS.update(BINDING_REFACTORS)

#: an allocation site that calls the allocator through the module defining it, not a name it imported
_ALLOCATOR_THROUGH_ITS_MODULE = [
    (TRITON, r"from sglang\.srt\.layers\.attention\.verify_mask import VerifyMask, maybe_create_verify_mask",
     "from sglang.srt.layers.attention import verify_mask as _verify_mask\n"
     "from sglang.srt.layers.attention.verify_mask import VerifyMask"),
    (TRITON, r"= maybe_create_verify_mask\(", "= _verify_mask.maybe_create_verify_mask("),
]


@pytest.mark.slow
def test_an_allocation_site_reaching_the_allocator_through_its_module_is_still_driven(sglang_target, tmp_path):
    # Held is not enough: a site vmfuzz stopped driving leaves the property held over the others.
    proc, out = _run(tmp_path, _ALLOCATOR_THROUGH_ITS_MODULE, ("allocation-soundness",), "allocator-through-module")
    assert proc.returncode == 0, out
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    (prop,) = summary["properties"]
    assert prop["status"] == "held", out
    assert not [c for c in prop["classes"] if c.startswith("not driven") or ": not driven" in c], prop["classes"]


#: name -> (edits, properties, the property that must catch it): a bug on top of a refactor
BUGS = {
    "fits-option-and-admits-one-more": (
        [(VERIFY_MASK, r"def fits\(self, bs: int\) -> bool:", "def fits(self, bs: int, *, strict: bool = True) -> bool:"),
         (VERIFY_MASK, r"return bs <= self\.max_bs", "return bs <= self.max_bs + 1")],
        ("capacity-soundness",), "capacity-soundness"),
    "keyword-kernel-call-drops-the-layout": (
        [(EAGLE_UTILS, _POSITIONAL_KERNEL_CALL, _KEYWORD_KERNEL_CALL.replace(
            "tree_mask_mode=tree_mask_mode, ", "tree_mask_mode=TreeMaskMode.QLEN_ONLY, "))],
        ("reference-agreement",), "reference-agreement"),
    # the guard still stands where the kernel is reached through its module
    "kernel-through-its-module-and-admits-one-more": (
        [(EAGLE_UTILS, r"    build_tree_kernel_efficient_func\(\n",
          "    __import__('sglang.kernels.ops.speculative.spec_tree', fromlist=['_']).build_tree_kernel_efficient_func(\n"),
         (VERIFY_MASK, r"return bs <= self\.max_bs", "return bs <= self.max_bs + 1")],
        ("no-oob-write",), "no-oob-write"),
}


def _run(tmp_path, edits, props, name):
    site = altered_copy(tmp_path, edits, name)
    args = [a for p in props for a in ("--property", p)]
    return run_on_copy(site, tmp_path, "run", "--target", "sglang", "--seed", "1", "--max-examples", "4",
                       "--isolate", "off", *args, "--report-dir", str(tmp_path / "report"))


#: Refactors the harness does not yet bind right: each still gives a false finding (exit 1).
#: Strict: the day one passes, the mark must go.
STILL_FALSE: dict[str, str] = {}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=STILL_FALSE[n], strict=True))
                                  if n in STILL_FALSE else n for n in REFACTORS])
@pytest.mark.slow
def test_a_refactor_is_driven_or_out_of_step_never_a_finding(sglang_target, name, tmp_path):
    edits, props, allowed, words = REFACTORS[name]
    proc, out = _run(tmp_path, edits, props, name)
    assert proc.returncode in allowed, out
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert not summary["findings"], out
    if proc.returncode == 3:
        line = [ln for ln in proc.stderr.splitlines() if "could not check" in ln]
        assert len(line) == 1 and words in line[0], out
        assert line[0].startswith("vmfuzz: could not check: vmfuzz is out of step with this SGLang: "), out
        assert {p["status"] for p in summary["properties"]} & {"out of step"}, summary["properties"]
        assert "<error" in (tmp_path / "report" / "junit.xml").read_text()
    else:
        assert {p["status"] for p in summary["properties"]} == {"held"}, summary["properties"]


@pytest.mark.parametrize("name", list(BUGS))
@pytest.mark.slow
def test_a_bug_on_a_refactor_is_still_caught_by_its_property(sglang_target, name, tmp_path):
    edits, props, catcher = BUGS[name]
    proc, out = _run(tmp_path, edits, props, name)
    assert proc.returncode == 1, out
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert catcher in {f["property"] for f in summary["findings"]}, out
    assert not any(f["detail"].startswith("target raised") for f in summary["findings"]), out


@pytest.mark.slow
def test_the_pristine_copy_passes(sglang_target, tmp_path):
    proc, out = _run(tmp_path, [], ("no-oob-write", "trivial-path", "chain-writer"), None)
    assert proc.returncode == 0, out


#: default_tree_mask_mode moved beside the platform flag in the kernel module, eagle_utils re-exporting
#: it, and the pp rebuild importing it from its new home
_DEFAULT_LAYOUT_MOVED = [
    (SPEC_TREE, r"\Z", "\n\ndef default_tree_mask_mode() -> TreeMaskMode:\n"
                       "    return TreeMaskMode.QLEN_ONLY if _is_cpu else TreeMaskMode.FULL_MASK\n"),
    (EAGLE_UTILS, r"\ndef default_tree_mask_mode\(\) -> TreeMaskMode:\n(?:    .*\n)+", "\n"),
    (EAGLE_UTILS, r"(    build_tree_kernel_efficient_func,\n)", r"\1    default_tree_mask_mode,\n"),
    (PP_SITE, r"(            build_tree_kernel_efficient,\n)            default_tree_mask_mode,\n(        \)\n)",
     r"\1\2        from sglang.kernels.ops.speculative.spec_tree import default_tree_mask_mode\n"),
]


@pytest.mark.slow
def test_the_pp_default_layout_follows_its_function_when_it_moves(sglang_target, tmp_path):
    # The pp rebuild's fallback step has no mask, so it takes the device's default layout: on this
    # host FULL_MASK unless vmfuzz chose the case's QLEN_ONLY, whose cells it then compares.
    site = altered_copy(tmp_path, _DEFAULT_LAYOUT_MOVED, "default-layout-moved")
    repro = tmp_path / "pp-default-layout.json"
    repro.write_text(json.dumps({
        "config": {"mode": "QLEN_ONLY", "max_bs": 2, "max_context_len": 8, "num_draft_tokens": 3, "topk": 2,
                   "spec_steps": 2, "call_site": "pp"},
        "batches": [{"seq_lens": [3, 5]}]}))
    proc, out = run_on_copy(site, tmp_path, "replay", str(repro), "--target", "sglang", "--property",
                            "fallback-equivalence",
                            "--isolate", "off", "--report-dir", str(tmp_path / "report"))
    assert proc.returncode == 0, out
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert [c["status"] for c in summary["checks"]] == ["held"], out


def test_a_dflash_policy_module_that_does_not_import_is_out_of_step(sglang_target, monkeypatch):
    # SGLang's own import chain loads dflash_utils already, so a copy that breaks it never
    # reaches the router; the failure is made where vmfuzz imports it.
    import importlib

    from vmfuzz.harness.model.config import Config
    from vmfuzz.harness.model.errors import OutOfStep
    from vmfuzz.harness.model.layouts import TreeMaskMode
    from vmfuzz.harness.model.routing import Child
    from vmfuzz.harness.targets.sglang import routers

    real = importlib.import_module

    def without_dflash(name, *args, **kwargs):
        if name == "sglang.srt.speculative.dflash_utils":
            raise ImportError("no module named a_cuda_extension")
        return real(name, *args, **kwargs)

    cfg = Config(TreeMaskMode.FULL_MASK, 2, 8, 3, 2, 2)
    children = {r: Child(r, sglang_target.allocate(cfg, None), 8) for r in ("prefill", "decode")}
    monkeypatch.setattr(routers.importlib, "import_module", without_dflash)
    with pytest.raises(OutOfStep, match="resolve_dflash_verify_mask_policy"):
        sglang_target.route("hybrid", "decode", children, 8)
