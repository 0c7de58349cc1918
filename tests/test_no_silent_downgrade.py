"""No silent downgrade: a file under review that does not load is never "not driven", never "held".

An exception while a module of SGLang is imported is decided from where it was
raised (``vmfuzz.harness.targets.sglang.imports.decide``): SGLang's own code raising is
a finding (effect raise, stage import), a file the release does not have is
"not in this release", anything else is out of step. And a capability -- does
SGLang pack the verify mask itself? -- is decided by running its capture, not
by reading its text, so a refactor that moves the code still gets checked.

The decision is tested on exceptions made here (fast), then through the whole
gate on altered copies of the installed SGLang (slow), as a PR would meet it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vmfuzz.harness.model.errors import OutOfStep
from tests.sglang_copies import PRISTINE_GATE_CHANGES, altered_copy, run_on_copy

MODULE = "sglang.srt.layers.attention.some_backend"


def _raised_in(module_name: str, code: str, filename: str = "/x/sglang/srt/layers/attention/some_backend.py"):
    """The exception ``code`` raises when run as the top level of module ``module_name`` (from ``filename``)."""
    try:
        exec(compile(code, filename, "exec"), {"__name__": module_name})
    except Exception as exc:  # noqa: BLE001 - the exception is the test's input
        return exc
    raise AssertionError(f"{code!r} raised nothing")


def test_sglang_code_raising_at_import_is_a_finding_at_its_own_frame():
    from vmfuzz.harness.engine.core.failures import ImportRaised, failure_of
    from vmfuzz.harness.targets.sglang.imports import decide
    decided = decide(MODULE, _raised_in(MODULE, "x = name_not_defined\n"))
    assert isinstance(decided, ImportRaised), decided
    origin, detail = failure_of("reader-agreement", decided)
    assert (origin.effect, origin.stage, origin.exc_type) == ("raise", "import", "NameError")
    assert origin.frame == "attention/some_backend.py:<module>"
    assert MODULE in detail


def test_a_syntax_error_in_an_sglang_file_is_a_finding():
    from vmfuzz.harness.engine.core.failures import ImportRaised
    from vmfuzz.harness.targets.sglang.imports import decide
    try:
        compile("def broken(:\n", "/x/sglang/srt/layers/attention/some_backend.py", "exec")
    except SyntaxError as exc:
        decided = decide(MODULE, exc)
    assert isinstance(decided, ImportRaised) and decided.type_name == "SyntaxError", decided
    assert decided.frame == "attention/some_backend.py:<module>"


def test_a_failing_sibling_import_inside_sglang_is_a_finding():
    from vmfuzz.harness.engine.core.failures import ImportRaised
    from vmfuzz.harness.targets.sglang.imports import decide
    exc = _raised_in(MODULE, "raise ImportError(\"cannot import name 'gone' from 'sglang.srt.utils'\", "
                             "name='sglang.srt.utils')\n")
    assert isinstance(decide(MODULE, exc), ImportRaised)
    sibling = ModuleNotFoundError("No module named 'sglang.srt.moved_away'", name="sglang.srt.moved_away")
    assert isinstance(decide(MODULE, sibling), ImportRaised)


def test_a_file_the_release_lacks_is_not_in_this_release():
    from vmfuzz.harness.targets.sglang.imports import NotInRelease, decide
    for missing in (MODULE, "sglang.srt.layers.attention", "sglang"):
        decided = decide(MODULE, ModuleNotFoundError(f"No module named {missing!r}", name=missing))
        assert isinstance(decided, NotInRelease) and isinstance(decided, ImportError), (missing, decided)


def test_a_missing_dependency_or_a_harness_raise_is_out_of_step():
    from vmfuzz.harness.targets.sglang.imports import decide
    third_party = ModuleNotFoundError("No module named 'flashinfer'", name="flashinfer")
    assert isinstance(decide(MODULE, third_party), OutOfStep)
    # SGLang's own code re-raising the missing dependency in its own words: still the host's lack
    rewrapped = _raised_in(MODULE, "try:\n    import a_cuda_only_extension_xyz\n"
                                   "except ImportError:\n    raise ImportError('needs the CUDA extension')\n")
    assert isinstance(decide(MODULE, rewrapped), OutOfStep)
    # the line names the file whose import failed, not only the module vmfuzz asked for
    assert decide("sglang.srt.speculative.eagle_worker_v2", rewrapped).file == "srt/layers/attention/some_backend.py"
    # raised by code outside SGLang (a harness stand-in, a library)
    harness = _raised_in("vmfuzz.harness.targets.sglang.backend_init", "raise RuntimeError('stub called')\n",
                         "/x/harness/targets/sglang/backend_init.py")
    decided = decide(MODULE, harness)
    assert isinstance(decided, OutOfStep) and decided.file == "srt/layers/attention/some_backend.py", decided


def test_a_decided_raise_is_the_same_for_every_caller_and_crosses_a_pipe():
    import pickle

    from vmfuzz.harness.engine.core.failures import ImportRaised
    from vmfuzz.harness.targets.sglang.imports import sglang_module
    calls = []

    def importer(name):
        calls.append(name)
        exec(compile("x = name_not_defined\n", "/x/sglang/srt/layers/attention/once_backend.py", "exec"),
             {"__name__": name})

    name = "sglang.srt.layers.attention.once_backend"
    for _ in range(2):
        with pytest.raises(ImportRaised) as got:
            sglang_module(name, importer)
    assert calls == [name], "a module SGLang's own code failed to load is not executed again"
    again = pickle.loads(pickle.dumps(got.value))
    assert (again.module, again.type_name, again.frame) == (name, "NameError", "attention/once_backend.py:<module>")


# -- through the gate, on altered copies ---------------------------------------------------------

ATTN = "srt/layers/attention/"
_NAME_ERROR = (r"\Z", "\n_probe = a_name_this_module_never_defines\n")

#: the EAGLE verify branch's loop that swaps each prefill wrapper's plan for the fast one, moved into a
#: module-level helper the capture calls: the same behaviour, in code shaped differently
_PLAN_INSTALL_MOVED = [
    ([ATTN + "flashinfer_backend.py"],
     r"(            and self\.flashinfer_kv_cache_dtype\n            in \([^)]*\)\n        \):\n)"
     r"            for w in self\.prefill_cuda_graph_metadata\[bs\]:\n"
     r"                w\.begin_forward = partial\(fast_prefill_plan, w\)\n",
     r"\1            _swap_in_host_plan(self.prefill_cuda_graph_metadata[bs])\n"),
    ([ATTN + "flashinfer_backend.py"], r"\Z",
     "\n\ndef _swap_in_host_plan(wrappers):\n    for one in wrappers:\n"
     "        one.begin_forward = partial(fast_prefill_plan, one)\n"),
]

#: name -> (edits, the changed file the PR lists)
CASES = {
    # imported by the FA3 reader and the allocation sites only: it used to be "not driven", all held
    "fa3-backend-name-error": ([([ATTN + "flashattention_backend.py"], *_NAME_ERROR)],
                               ATTN + "flashattention_backend.py"),
    # imported by the core chain (the target's own load): it used to be "target unavailable", exit 2
    "triton-backend-name-error": ([([ATTN + "triton_backend.py"], *_NAME_ERROR)], ATTN + "triton_backend.py"),
    "plan-install-moved-to-a-helper": (_PLAN_INSTALL_MOVED, ATTN + "flashinfer_backend.py"),
    "pristine": ([], ATTN + "flashattention_backend.py"),
}


def _gate(tmp_path, name):
    edits, changed_file = CASES[name]
    site = altered_copy(tmp_path, edits, name)
    changed = tmp_path / "changed.txt"
    changed.write_text(f"python/sglang/{changed_file}\n")
    report = tmp_path / "report"
    proc, out = run_on_copy(site, tmp_path, "gate", "--target", "sglang", "--changed-files", str(changed),
                            "--report-dir", str(report))
    return proc, out, json.loads((report / "summary.json").read_text())


def _origins(summary: dict) -> list[dict]:
    """Every finding's origin, from a run's findings or a command's failed checks."""
    return ([f["origin"] for f in summary.get("findings") or []]
            + [c["origin"] for c in summary.get("checks") or [] if c.get("status") == "failed"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fa3-backend-name-error", "triton-backend-name-error"])
def test_a_backend_file_that_does_not_import_fails_the_gate_as_an_import_raise(sglang_target, name, tmp_path):
    proc, out, summary = _gate(tmp_path, name)
    assert proc.returncode == 1, out
    origins = _origins(summary)
    file = os.path.basename(CASES[name][1])
    raised = [o for o in origins if o.get("stage") == "import"]
    assert raised, out
    for origin in raised:
        assert (origin["effect"], origin["exc_type"]) == ("raise", "NameError"), origin
        assert origin["frame"] == f"attention/{file}:<module>", origin
    assert "properties held" not in out, out
    assert "not driven" not in {p["status"] for p in summary.get("properties", [])}, out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["plan-install-moved-to-a-helper", "pristine"])
def test_code_that_loads_and_behaves_passes_the_gate_with_every_property_driven(sglang_target, name, tmp_path,
                                                                                request):
    if name == "pristine":
        # the pristine copy's whole gate is shared with the deep corpus's pristine case: the FA3 backend
        # and verify_mask.py listed as changed, each asked what its own gate asked
        gate = request.getfixturevalue("pristine_gate")
        assert "python/sglang/" + CASES[name][1] in PRISTINE_GATE_CHANGES
        returncode, out = gate["returncode"], gate["out"]
        summary = json.loads((Path(gate["report"]) / "summary.json").read_text())
        assert f"python/sglang/{CASES[name][1]}" in summary["gate"]["exercised"], summary["gate"]
    else:
        proc, out, summary = _gate(tmp_path, name)
        returncode = proc.returncode
    if name == "plan-install-moved-to-a-helper":
        # flashinfer_backend.py also holds a mask-path function vmfuzz does not drive (the multi-step
        # draft's eager metadata, made on a CUDA device): with no diff every such function is required,
        # so the gate says that one, and only that one, could not be checked
        stuck = summary["gate"]["could_not_check"]
        assert returncode == 3 and stuck, out
        assert all("FlashInferMultiStepDraftBackend.init_forward_metadata never ran" in line for line in stuck), out
    else:
        assert returncode == 0, out
    status = {p["name"]: p["status"] for p in summary["properties"]}
    assert status.get("packed-mask") == "held", status
    assert not summary["findings"], out
