"""The readers: reader-agreement (Triton's mask_indptr, eager and replay) and packed-mask (FlashInfer's packing).

On ``reference`` the properties must hold and each reader variant must be
caught; on ``sglang`` the same, with SGLang's real metadata methods and packing
kernel; and altered copies of the installed SGLang -- a bad edit to the eager
mask_indptr, to the replay path, to the packing kernel and its host arithmetic --
must be caught by ``harness.cli run --target sglang --property <reader property>``
while the pristine copy passes.
"""

from __future__ import annotations


import pytest
import torch
from hypothesis import given, settings

from harness.engine.cases import cases
from harness.engine.search import run_property
from harness.model.bounds import Bounds
from harness.model.config import Batch, Config
from harness.model.layouts import TreeMaskMode
from harness.properties import PROPERTIES, PropertyFailure
from harness.properties.readers import packed_bytes
from harness.model.readers import reader_config
from harness.guard.shadow import ShadowHeap
from harness.targets import resolve
from tests.sglang_copies import altered_copy, assert_caught_by, run_on_copy

READER_PROPERTIES = ("reader-agreement", "packed-mask")
#: variant -> the reader property that must catch it
READER_VARIANTS = {"eager-indptr-no-draft-span": "reader-agreement", "replay-stale-indptr": "reader-agreement",
                   "pack-msb-first": "packed-mask"}
FULL = Config(TreeMaskMode.FULL_MASK, 2, 8, 4, 2, 2)
#: under, at and past the captured max_bs, with empty and full-context requests
EDGE_BATCHES = [Batch((3,)), Batch((0, 8)), Batch((8, 0, 5))]



def test_packing_is_lsb_first_per_request():
    cells = torch.tensor([1, 0, 0, 0, 0, 0, 0, 1, 1], dtype=torch.bool)
    assert packed_bytes(cells) == [0b10000001, 0b1]


def test_readers_read_full_mask_of_the_same_deployment():
    unread = Config(TreeMaskMode.QLEN_ONLY, 3, 5, 4, 2, 2, is_read=False)
    rc = reader_config(unread)
    assert (rc.mode, rc.is_read, rc.max_bs, rc.max_context_len, rc.d) == (TreeMaskMode.FULL_MASK, True, 3, 5, 4)
    assert reader_config(FULL) is FULL


@pytest.mark.parametrize("name", READER_PROPERTIES)
def test_reference_holds_on_edge_batches_and_reaches_both_paths(name):
    obs = PROPERTIES[name].check(resolve("reference"), FULL, EDGE_BATCHES)
    assert {"path reuse", "path fallback", "seq_len 0", "seq_len = max_context_len"} <= obs.classes
    if name == "reader-agreement":
        assert {"reader eager", "reader replay"} <= obs.classes


@pytest.mark.parametrize("name", READER_PROPERTIES)
def test_reference_holds_on_generated_cases(name):
    prop = PROPERTIES[name]
    target = resolve("reference")

    @settings(max_examples=40)
    @given(cases(prop, Bounds(max_bs=3, max_context_len=10, num_draft_tokens=5)))
    def holds(case):
        prop.check(target, *case)

    holds()


@pytest.mark.parametrize("variant", sorted(READER_VARIANTS))
def test_reader_variant_is_caught_on_reference(variant, tmp_path):
    res = run_property(resolve(f"reference+{variant}"), PROPERTIES[READER_VARIANTS[variant]], seed=1,
                       max_examples=30, bounds=Bounds(), findings_dir=tmp_path)
    assert res.finding is not None, f"{READER_VARIANTS[variant]} let reference+{variant} through"
    assert (tmp_path / f"{READER_VARIANTS[variant]}.json").exists()


def test_a_target_without_reader_seams_is_not_driven():
    class CoreOnly:
        pass

    for name in READER_PROPERTIES:
        assert PROPERTIES[name].missing(CoreOnly()) == list(PROPERTIES[name].needs)
        assert not PROPERTIES[name].missing(resolve("reference"))


def test_a_replay_copy_past_the_buffer_is_caught():
    target = resolve("reference")
    read_replay = target.read_replay

    def copies_one_cell_too_many(mask, config, batch, step):
        view = read_replay(mask, config, batch, step)
        # Through the storage, as a device copy would: one cell past the preallocated buffer.
        storage = torch.empty(0, dtype=torch.uint8).set_(mask.buffer.untyped_storage())
        storage[mask.buffer.storage_offset() + mask.buffer.numel()] = 1
        return view

    target.read_replay = copies_one_cell_too_many
    with pytest.raises(PropertyFailure, match="replay copied the step's mask out of bounds"):
        PROPERTIES["reader-agreement"].check(target, FULL, [Batch((3, 5))])


def test_a_packer_that_ignores_its_capacity_is_caught():
    target = resolve("reference")

    def packs_without_the_host_check(config, batch, step_mask, buffer):
        from harness.targets.reference.readers import model_pack
        roomy = torch.zeros(buffer.numel() + 64, dtype=torch.uint8)
        view = model_pack(config, batch, step_mask, roomy)
        buffer.copy_(roomy[:buffer.numel()])
        return view

    target.pack_mask = packs_without_the_host_check
    with pytest.raises(PropertyFailure, match="without refusing"):
        PROPERTIES["packed-mask"].check(target, FULL, [Batch((3, 5))])


# -- the sglang target --------------------------------------------------------------

@pytest.mark.parametrize("name", READER_PROPERTIES)
def test_sglang_holds_on_edge_batches(sglang_target, name):
    obs = PROPERTIES[name].check(sglang_target, FULL, EDGE_BATCHES)
    assert {"path reuse", "path fallback"} <= obs.classes


@pytest.mark.parametrize("name", READER_PROPERTIES)
def test_sglang_holds_on_generated_cases(sglang_target, name, tmp_path):
    res = run_property(sglang_target, PROPERTIES[name], seed=5, max_examples=15, bounds=sglang_target.bounds,
                       findings_dir=tmp_path)
    assert res.finding is None, res.finding and res.finding.detail


@pytest.mark.parametrize("variant", sorted(READER_VARIANTS))
def test_reader_variant_is_caught_over_sglang(sglang_target, variant, tmp_path):
    res = run_property(resolve(f"sglang+{variant}"), PROPERTIES[READER_VARIANTS[variant]], seed=3,
                       max_examples=10, bounds=sglang_target.bounds, findings_dir=tmp_path)
    assert res.finding is not None


def test_sglang_readers_are_sglangs_own(sglang_target):
    """The views come from SGLang's metadata and FlashInfer wrapper state, not from this harness."""
    from harness.targets.sglang import readers

    heap = ShadowHeap("cpu")
    mask = sglang_target.allocate(FULL, heap)
    step = sglang_target.verify(mask, FULL, Batch((3, 5)), heap).as_cpu()
    eager = sglang_target.read_eager(FULL, Batch((3, 5)), step)
    assert eager.mask is step.tree_mask  # eager verify reads the step's mask where it lies
    replay = sglang_target.read_replay(mask, FULL, Batch((3, 5)), step)
    assert replay.mask.data_ptr() == mask.buffer.data_ptr()  # replay reads the backend's own buffer
    assert replay.indptr.tolist() == [0, 4 * (3 + 4), 4 * (3 + 4) + 4 * (5 + 4)]
    paths = {path for path, _, _ in readers.SURFACE}
    assert {"srt/layers/attention/triton_backend.py", "srt/layers/attention/flashinfer_backend.py",
            "kernels/ops/speculative/pack_verify_mask.py"} <= paths
    import importlib
    for path, function, props in readers.SURFACE:
        assert set(props) <= set(PROPERTIES), (path, function)
        # Each entry names a function this SGLang has, where the entry says.
        obj = importlib.import_module("sglang." + path.removesuffix(".py").replace("/", "."))
        for part in function.split("."):
            obj = getattr(obj, part)
        assert callable(obj), (path, function)


@pytest.mark.parametrize("spec", ["reference", "sglang"])
def test_replay_copies_a_fallback_steps_mask_into_the_backends_buffer(spec, request):
    """A step that wrote its own allocation: replay must copy it over the stale preallocated buffer."""
    target = request.getfixturevalue("sglang_target") if spec == "sglang" else resolve(spec)
    from harness.properties.kit import reused_mask

    batch = Batch((3, 5))
    heap, mask = reused_mask(target, FULL, "cpu")
    step = target.verify(None, FULL, batch, heap).as_cpu()
    assert not step.reused
    view = target.read_replay(mask, FULL, batch, step)
    n = step.tree_mask.numel()
    assert view.mask.data_ptr() == mask.buffer.data_ptr()
    assert torch.equal(view.mask.reshape(-1)[:n].view(torch.uint8), step.tree_mask.view(torch.uint8))
    assert not heap.check()


# -- altered copies of the installed SGLang ------------------------------------------

TRITON = "srt/layers/attention/triton_backend.py"
FLASHINFER = "srt/layers/attention/flashinfer_backend.py"
PACK = "kernels/ops/speculative/pack_verify_mask.py"

#: name -> (edits, the property that must catch it); each a bug a reviewer could plausibly miss.
ALTERATIONS = {
    # Precedence slip in the eager metadata: d*s_b + d cells a request instead of d*(s_b + d).
    "eager-indptr-precedence": ([([TRITON], r"seq_mask_len = num_tokens_per_req \* \(\n\s*forward_batch\.seq_lens "
                                            r"\+ num_tokens_per_req\n\s*\)",
                                  "seq_mask_len = num_tokens_per_req * forward_batch.seq_lens + num_tokens_per_req")],
                                "reader-agreement"),
    # The replay refill lands one slot early: indptr[0] is request 0's end, not 0.
    "replay-indptr-slot-early": ([([TRITON], r"(seq_mask_len = num_tokens_per_req \* \(seq_lens \+ num_tokens_per_req\)"
                                             r"\n\s*mask_indptr = self\.mask_indptr\[: bs \+ 1\]\n\s*)"
                                             r"mask_indptr\[1 : bs \+ 1\]",
                                   r"\1mask_indptr[:bs]")],
                                 "reader-agreement"),
    # Bits shifted from the top: each byte MSB first.
    "pack-bit-order": ([([PACK], r"values\.to\(tl\.uint32\) << bit\[None, :\]",
                         "values.to(tl.uint32) << (7 - bit[None, :])")], "packed-mask"),
    # One byte more per row: the last byte of each row spills into the next row, and past the buffer.
    "pack-store-bound": ([([PACK], r"byte < tl\.cdiv\(count, 8\)", "byte <= tl.cdiv(count, 8)")], "packed-mask"),
    # Byte counts rounded down: rows overlap and the tail runs past the total.
    "packed-lengths-floor": ([([FLASHINFER], r"packed_lengths = \(kv_lens_host \* uniform_verify_width \+ 7\) // 8",
                               "packed_lengths = kv_lens_host * uniform_verify_width // 8")], "packed-mask"),
    # The host-side check on the total dropped as redundant.
    "pack-assert-dropped": ([([FLASHINFER], r"assert int\(packed_indptr\[-1\]\) <= self\._custom_mask_buf\.numel\(\)",
                              "pass")], "packed-mask"),
}



@pytest.mark.parametrize("alteration", [None, *ALTERATIONS], ids=lambda a: a or "unaltered")
def test_altered_sglang_reader_is_caught(sglang_target, alteration, tmp_path):
    edits, prop = ALTERATIONS[alteration] if alteration else ([], None)
    site = altered_copy(tmp_path, edits, alteration)
    props = [prop] if prop else list(READER_PROPERTIES)
    proc, out = run_on_copy(site, tmp_path, "run", "--target", "sglang", "--seed", "1", "--max-examples", "25",
                            *[a for p in props for a in ("--property", p)],
                            "--report-dir", str(tmp_path / "report"))
    if alteration is None:
        assert proc.returncode == 0, out
    else:
        assert proc.returncode == 1, out
        assert f"{prop}" in proc.stdout and "FAILED" in proc.stdout, out
        assert_caught_by(tmp_path / "report", prop, out=out)
