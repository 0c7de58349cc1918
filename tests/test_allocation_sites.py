"""``allocation-soundness`` over backends built by their own ``__init__`` from the server's arguments.

What a backend allocates with (its context length, draft width, the max_bs it
passes) is derived by SGLang from a stand-in runner carrying only the server's
arguments; the expectation comes from ``ServerNumbers`` alone. So a backend
whose ``__init__`` derives one of them wrongly is caught by the property, not
by a raise, while behaviour-preserving refactors of the same code are driven
(exit 0), never a finding and never out of step.
"""

from __future__ import annotations

import json

import pytest

from vmfuzz.harness.model.allocation import ServerNumbers, reads_mask
from tests.sglang_copies import altered_copy, assert_caught_by, run_on_copy

_ATTN = "srt/layers/attention/"
TRITON = [_ATTN + "triton_backend.py"]
FA = [_ATTN + "flashattention_backend.py"]
TRTLLM_MLA = [_ATTN + "trtllm_mla_backend.py"]
DSV4 = [_ATTN + "deepseek_v4_backend.py"]

_FA_VERIFY_MASK_CALL = r"(self\._verify_mask = maybe_create_verify_mask\(\n(?:.*\n)*?\s*)"


def test_each_site_allocates_what_its_init_derived_from_the_servers_arguments(sglang_target):
    from vmfuzz.harness.targets.sglang.allocation import BUILT_BY_INIT

    sites = sglang_target.allocating_backends()
    assert {"flashmla", "trtllm_mla", "qwen_sparse", "flashattention"} <= set(BUILT_BY_INIT)
    numbers = ServerNumbers(max_bs=6, context_len=3000, num_draft_tokens=5, topk=2, spec_steps=3)
    for name in BUILT_BY_INIT:
        assert sites[name] is None, (name, sites[name])
        call = sglang_target.allocation_call(name, numbers)
        assert (call.max_bs, call.max_context_len, call.num_draft_tokens) == (6, 3000, 5), name
        assert call.is_read == reads_mask(name, numbers.topk) and not call.is_draft_runner, name
        assert call.mask is not None and call.mask.buffer.device.type == "meta", name


def test_deepseek_v4_is_built_by_its_init_on_a_chain_server(sglang_target):
    """DeepSeek V4's backend asserts topk 1 at most: on such a server its ``__init__`` derives what it
    allocates with (its changed lines ran under the check); a tree server, which it never runs, still has
    its set-up driven on the attributes ``__init__`` would set."""
    import importlib.util
    from pathlib import Path

    import coverage
    root = Path(importlib.util.find_spec("sglang").origin).parent
    path = str(root / DSV4[0])
    cov = coverage.Coverage(include=[path], data_file=None)
    cov.start()
    try:
        chain = sglang_target.allocation_call("deepseek_v4", ServerNumbers(6, 3000, 5, 1, 4))
    finally:
        cov.stop()
    text = (root / DSV4[0]).read_text().splitlines()
    init = next(i for i, line in enumerate(text) if "self._early_verify_metadata_ids: set = set()" in line) + 1
    assert init in set(cov.get_data().lines(path) or ()), "DeepseekV4AttnBackend.__init__ never ran to its end"
    tree = sglang_target.allocation_call("deepseek_v4", ServerNumbers(6, 3000, 5, 2, 3))
    for call in (chain, tree):
        assert (call.max_bs, call.max_context_len, call.num_draft_tokens) == (6, 3000, 5)
        assert not call.is_read and not call.is_draft_runner and call.mask is not None


def test_deepseek_v4_binds_only_what_this_release_holds(sglang_target, monkeypatch):
    """0.5.17-0.5.20 have no V4.1 indexer module: a module the installed
    SGLang lacks is bound nowhere, never imported (a ModuleNotFoundError there was filed as SGLang's raise)."""
    from vmfuzz.harness.targets.sglang import dsv4_backend
    absent = "sglang.srt.layers.attention.no_such_package.indexer"
    monkeypatch.setattr(dsv4_backend, "DSV4_CUDA_ONLY",
                        (*dsv4_backend.DSV4_CUDA_ONLY, (absent, "is_sm100_or_newer", lambda: False, "-")))
    monkeypatch.setattr(dsv4_backend, "_DSV4_LOOKUP_MODULES", (*dsv4_backend._DSV4_LOOKUP_MODULES, absent))
    assert not dsv4_backend._holds(absent) and dsv4_backend._holds("sglang.srt.server_args")
    call = sglang_target.allocation_call("deepseek_v4", ServerNumbers(6, 3000, 5, 1, 4))
    assert call.max_bs == 6


def test_deepseek_v4_kernel_choices_are_this_releases_server_arg_defaults(sglang_target):
    """Where a release reads them off the runner's server_args, they are its own ServerArgs' defaults; a name it
    does not declare is not made up."""
    import msgspec

    from sglang.srt.server_args import ServerArgs
    from vmfuzz.harness.targets.sglang import dsv4_backend
    got = dsv4_backend._server_arg_defaults((*dsv4_backend.DSV4_KERNEL_ARGS, "no_such_server_arg"))
    # read independently of the harness: 0.5.23's ServerArgs is a msgspec Struct
    declared = {f.name: f.default for f in msgspec.structs.fields(ServerArgs)}
    assert got == {k: declared[k] for k in dsv4_backend.DSV4_KERNEL_ARGS}, got
    assert got["enable_deepseek_v4_fp4_indexer"] is False
    runner = dsv4_backend.model_runner(ServerNumbers(6, 3000, 5, 1, 4))
    assert all(getattr(runner.server_args, k) == v for k, v in got.items())


def test_the_stand_in_runner_leaves_the_process_as_found(sglang_target):
    """The construction's stubs and bindings are put back: no stubbed extension stays importable."""
    import sys

    from vmfuzz.harness.targets.sglang import backend_init

    mods = {name: sys.modules.get("sglang.srt.layers.attention." + module)
            for group in backend_init.CUDA_ONLY.values() for module, name, _, _ in group}
    before = {name: (mod.__dict__.get(name) if mod else None) for name, mod in mods.items()}
    finders = list(sys.meta_path)
    for name in ("flashattention", "flashmla", "trtllm_mla"):
        sglang_target.allocation_call(name, ServerNumbers(2, 8, 3, 2, 2))
    assert sys.meta_path == finders
    assert not any(m.partition(".")[0] in ("sgl_kernel", "flash_mla") for m in sys.modules)
    assert {name: (mod.__dict__.get(name) if mod else None) for name, mod in mods.items()} == before


#: A backend that derives what it allocates with wrongly: each passed before its backend was built
#: by ``__init__`` from the server's arguments (the harness set those attributes itself, or the
#: stand-in lacked the argument: out of step).
ALTERATIONS = {
    # the captured max_bs kept from the server's arguments, off by one
    "triton-allocates-for-cuda-graph-max-bs-minus-one": [
        (TRITON, r"(        self\.max_context_len = model_runner\.model_config\.context_len\n)",
         r"\1        self.cuda_graph_max_bs = model_runner.server_args.cuda_graph_max_bs - 1\n"),
        (TRITON, r"(self\._verify_mask = maybe_create_verify_mask\(\n(?:.*\n)*?\s*)max_bs=max_bs,",
         r"\1max_bs=self.cuda_graph_max_bs,")],
    "fa-init-context-off-by-one": [
        (FA, r"self\.max_context_len = model_runner\.model_config\.context_len\n",
         "self.max_context_len = model_runner.model_config.context_len - 1\n")],
    # the draft width read from the step count, where __init__ derives it
    "fa-init-draft-width-from-steps": [
        (FA, r"self\.speculative_num_draft_tokens = get_spec\(\)\.speculative_num_draft_tokens",
         "self.speculative_num_draft_tokens = get_spec().speculative_num_steps")],
    # the context length re-derived in the subclass's __init__, off by one
    "trtllm-init-context-off-by-one": [
        (TRTLLM_MLA, r"(        self\.page_size = model_runner\.page_size\n)",
         r"\1        self.max_context_len = config.context_len - 1\n")],
    "trtllm-init-draft-width-from-topk": [
        (TRTLLM_MLA, r"self\.num_draft_tokens = get_spec\(\)\.speculative_num_draft_tokens",
         "self.num_draft_tokens = get_spec().speculative_eagle_topk")],
    # max_bs taken from the decode indptr __init__ sized for the request pool, off by one
    "trtllm-max-bs-from-decode-indptr": [
        (TRTLLM_MLA, r"(self\._verify_mask = maybe_create_verify_mask\(\n(?:.*\n)*?\s*)max_bs=max_bs,",
         r"\1max_bs=self.q_indptr_decode.numel() - 2,")],
    # DeepSeek V4 (a chain server's: built by its __init__ there) with its context one short, and its draft
    # width read from the step count
    "dsv4-init-context-off-by-one": [
        (DSV4, r"self\.max_context_len = model_runner\.model_config\.context_len\n",
         "self.max_context_len = model_runner.model_config.context_len - 1\n")],
    "dsv4-init-draft-width-from-steps": [
        (DSV4, r"self\.speculative_num_draft_tokens: int = get_spec\(\)\.speculative_num_draft_tokens",
         "self.speculative_num_draft_tokens: int = get_spec().speculative_num_steps")],
}

#: Behaviour-preserving refactors of the same code: each must be driven (exit 0). Before the
#: backends were built by ``__init__``, the first two were a false finding or out of step.
REFACTORS = {
    # the verify width hoisted into __init__ under another name
    "fa-verify-width-hoisted-into-init": [
        (FA, r"(        self\.speculative_step_id = speculative_step_id\n)",
         r"\1        self._verify_width = self.speculative_num_draft_tokens\n"),
        (FA, _FA_VERIFY_MASK_CALL + r"num_draft_tokens=self\.speculative_num_draft_tokens,",
         r"\1num_draft_tokens=self._verify_width,")],
    # the verify width set by a module-level helper, under another name
    "fa-verify-width-set-by-a-module-helper": [
        (FA, r"(        self\.speculative_step_id = speculative_step_id\n)", r"\1        _init_verify_width(self)\n"),
        (FA, _FA_VERIFY_MASK_CALL + r"num_draft_tokens=self\.speculative_num_draft_tokens,",
         r"\1num_draft_tokens=self.verify_width,"),
        (FA, r"\Z", "\n\ndef _init_verify_width(backend):\n"
                    "    backend.verify_width = get_spec().speculative_num_draft_tokens\n")],
    # DeepSeek V4's early-metadata flag set with the draft glue flag it sits beside
    "dsv4-init-flags-set-together": [
        (DSV4, r"self\.draft_metadata_glued = False\n",
         "self.draft_metadata_glued = self.builds_verify_metadata_early = False\n"),
        (DSV4, r"        self\.builds_verify_metadata_early = False\n", "")],
    # the backend's verify state kept in slots
    "trtllm-backend-gains-slots": [
        (TRTLLM_MLA, r"(class TRTLLMMLABackend\(FlashInferMLAAttnBackend\):\n)",
         r'\1    __slots__ = ("_verify_mask", "num_draft_tokens")\n')],
}


def _run(tmp_path, edits, name):
    site = altered_copy(tmp_path, edits, name)
    return run_on_copy(site, tmp_path, "run", "--target", "sglang", "--seed", "1", "--max-examples", "10",
                       "--isolate", "off", "--property", "allocation-soundness",
                       "--report-dir", str(tmp_path / "report"))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ALTERATIONS))
def test_a_wrong_derivation_is_caught_by_allocation_soundness(sglang_target, name, tmp_path):
    proc, out = _run(tmp_path, ALTERATIONS[name], name)
    assert proc.returncode == 1, out
    assert_caught_by(tmp_path / "report", "allocation-soundness", out=out)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    origins = [f.get("origin") or {} for f in summary["findings"]]
    # a size too small (overrun, unsound), or FA3's constant running sum stepped by the wrong width
    assert all(o.get("property") == "allocation-soundness" and (o.get("effect") in ("overrun", "unsound") or (
        o.get("effect"), o.get("cell")) == ("wrong", "constant running sum")) for o in origins), origins


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REFACTORS))
def test_an_allocation_refactor_is_driven_never_a_finding(sglang_target, name, tmp_path):
    proc, out = _run(tmp_path, REFACTORS[name], name)
    assert proc.returncode == 0, out
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert not summary["findings"], out
    assert {p["status"] for p in summary["properties"]} == {"held"}, summary["properties"]
