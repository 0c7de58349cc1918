"""The readers: reader-agreement (Triton's mask_indptr, eager and replay) and packed-mask (FlashInfer's packing).

On ``reference`` the properties must hold and each reader variant must be
caught; on ``sglang`` the same, with SGLang's real metadata methods and packing
kernel; and altered copies of the installed SGLang -- a bad edit to the eager
mask_indptr, to the replay path, to the packing kernel and its host arithmetic --
must be caught by ``vmfuzz.harness.cli run --target sglang --property <reader property>``
while the pristine copy passes.
"""

from __future__ import annotations


import pytest
import torch
from hypothesis import given, settings

from vmfuzz.harness.engine.search.cases import cases
from vmfuzz.harness.engine.search.search import run_property
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
from vmfuzz.harness.properties.readers import packed_bytes
from vmfuzz.harness.model.readers import expected_reads, reader_config
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.targets import resolve
from tests.sglang_copies import (altered_copy, assert_caught_by, assert_not_a_raise, failed_check_origin, replay_on_copy,
                                 run_cases, run_on_copy)

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
    assert_not_a_raise(res.finding.detail, res.finding.origin)
    assert (tmp_path / f"{READER_VARIANTS[variant]}.json").exists()


def test_what_the_metadata_must_hold_comes_from_seq_lens_d_and_bs():
    """Worked by hand for seq_lens (3, 0, 5), d 4, replayed in a graph of 4 (one padding row at fill 1)."""
    want = expected_reads(Config(TreeMaskMode.FULL_MASK, 4, 8, 4, 2, 2), Batch((3, 0, 5)), rows=4)
    assert want.qo_indptr == [0, 4, 8, 12, 16]
    assert want.kv_indptr == [0, 3, 3, 8, 9]
    assert want.mask_indptr == [0, 4 * 7, 4 * 7 + 4 * 4, 4 * 7 + 4 * 4 + 4 * 9, 80 + 4 * 5]
    assert want.max_extend_len == 4
    # Pool slots handed out last first (request 0 in slot 3), slot p's token t in KV slot (p + 1) * 10 + t.
    assert want.kv_indices == [40, 41, 42, 20, 21, 22, 23, 24]


def _reading(target, path, alter):
    """``target`` whose ``path`` reader (read_eager or read_replay) hands back ``alter(view, config)``."""
    read = getattr(target, path)

    def altered(*args):
        view = read(*args)
        alter(view, args[1] if path == "read_replay" else args[0])
        return view

    setattr(target, path, altered)
    return target


def _shift(name, by):
    def alter(view, config):
        t = getattr(view, name)
        setattr(view, name, t + by * (torch.arange(t.numel(), device=t.device) > 0))
    return alter


def _swap_first_requests(view, config):
    k = view.kv_indices
    view.kv_indices = torch.cat([k[3:8], k[:3], k[8:]])  # request 1's slots first, then request 0's


def _empty_padding(view, config):
    view.kv_indptr[4] = view.kv_indptr[3]  # a padding row with no KV and no mask cells: nothing of anyone's
    view.indptr[4] = view.indptr[3]


def _padding_backwards(view, config):
    view.indptr[4] = view.indptr[3] - 1  # the padding row runs back into the last real request's cells


#: slip -> (reader, alteration, buffer named by the finding; None: the reader still agrees)
METADATA_SLIPS = {
    "kv_indptr one late": ("read_eager", _shift("kv_indptr", 1), "kv_indptr"),
    "qo_indptr by d - 1": ("read_replay", _shift("qo_indptr", -1), "qo_indptr"),
    "kv_indices of the wrong request": ("read_eager", _swap_first_requests, "kv_indices"),
    "max_extend_len d - 1": ("read_replay", lambda view, config: setattr(view, "max_extend_len", config.d - 1),
                             "max_extend_len"),
    "padding row back into a real request": ("read_replay", _padding_backwards, "mask_indptr"),
    "padding row empty": ("read_replay", _empty_padding, None),
}


@pytest.mark.parametrize("slip", sorted(METADATA_SLIPS))
def test_each_metadata_output_is_judged_against_the_meaning(slip):
    path, alter, buffer = METADATA_SLIPS[slip]
    target = _reading(resolve("reference"), path, alter)
    config, batch = Config(TreeMaskMode.FULL_MASK, 4, 8, 4, 2, 2), Batch((3, 5, 0))  # replays padded to 4
    if buffer is None:
        PROPERTIES["reader-agreement"].check(target, config, [batch])
        return
    with pytest.raises(PropertyFailure) as caught:
        PROPERTIES["reader-agreement"].check(target, config, [batch])
    origin = caught.value.origin
    assert (origin.effect, origin.writer, origin.buffer, origin.stage) == (
        "wrong", "triton reader", buffer, "eager" if path == "read_eager" else "replay"), caught.value


def test_a_kv_gather_past_its_buffer_lands_in_the_redzone():
    """The sglang target's stand-in gather writes each request's KV slots through the shadow heap."""
    from vmfuzz.harness.model.readers import kv_slot_stride
    from vmfuzz.harness.targets.sglang.kv_ids import _gather

    stride = kv_slot_stride(8)
    ids_of = lambda slot, tokens: (slot + 1) * stride + tokens  # noqa: E731 - the translator's ids
    heap = ShadowHeap("cpu")
    kv = heap.alloc("kv_indices", 8, torch.int64, redzone_cells=16)
    seq_lens, pool = torch.tensor([3, 5]), torch.tensor([1, 0])
    _gather(heap, kv, pool, seq_lens, torch.tensor([0, 3, 8]), None, ids_of)
    assert not heap.check() and kv.tolist() == [20, 21, 22, 10, 11, 12, 13, 14]
    _gather(heap, kv, pool, seq_lens, torch.tensor([0, 4, 9]), None, ids_of)  # kv_indptr one late from request 1
    [stray] = heap.check()
    assert (stray.buffer, stray.side, stray.start) == ("kv_indices", "back", 8)


def test_a_target_without_reader_seams_is_not_driven():
    class CoreOnly:
        pass

    for name in READER_PROPERTIES:
        assert PROPERTIES[name].missing(CoreOnly()) == list(PROPERTIES[name].needs)
        assert not PROPERTIES[name].missing(resolve("reference"))


def test_a_replay_copy_past_the_buffer_is_caught():
    target = resolve("reference")
    read_replay = target.read_replay

    def copies_one_cell_too_many(mask, config, batch, step, heap):
        view = read_replay(mask, config, batch, step, heap)
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
        from vmfuzz.harness.targets.reference.readers import model_pack
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
@pytest.mark.slow
def test_sglang_holds_on_generated_cases(sglang_target, name, tmp_path):
    res = run_property(sglang_target, PROPERTIES[name], seed=5, max_examples=15, bounds=sglang_target.bounds,
                       findings_dir=tmp_path)
    assert res.finding is None, res.finding and res.finding.detail


@pytest.mark.parametrize("variant", sorted(READER_VARIANTS))
@pytest.mark.slow
def test_reader_variant_is_caught_over_sglang(sglang_target, variant, tmp_path):
    res = run_property(resolve(f"sglang+{variant}"), PROPERTIES[READER_VARIANTS[variant]], seed=3,
                       max_examples=10, bounds=sglang_target.bounds, findings_dir=tmp_path)
    assert res.finding is not None
    assert_not_a_raise(res.finding.detail, res.finding.origin)


def test_sglang_readers_are_sglangs_own(sglang_target):
    """The views come from SGLang's metadata and FlashInfer wrapper state, not from this harness."""
    from vmfuzz.harness.targets.sglang import readers

    heap = ShadowHeap("cpu")
    mask = sglang_target.allocate(FULL, heap)
    step = sglang_target.verify(mask, FULL, Batch((3, 5)), heap).as_cpu()
    eager = sglang_target.read_eager(FULL, Batch((3, 5)), step, heap)
    assert eager.mask is step.tree_mask  # eager verify reads the step's mask where it lies
    replay = sglang_target.read_replay(mask, FULL, Batch((3, 5)), step, heap)
    assert replay.mask.data_ptr() == mask.buffer.data_ptr()  # replay reads the backend's own buffer
    assert replay.indptr.tolist() == [0, 4 * (3 + 4), 4 * (3 + 4) + 4 * (5 + 4)]
    from vmfuzz.harness.targets.sglang import flashinfer
    surface = readers.SURFACE + flashinfer.SURFACE
    paths = {path for path, _, _ in surface}
    assert {"srt/layers/attention/triton_backend.py", "srt/layers/attention/flashinfer_backend.py",
            "kernels/ops/speculative/pack_verify_mask.py"} <= paths
    import importlib
    for path, function, props in surface:
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
    from vmfuzz.harness.properties.kit import reused_mask

    batch = Batch((3, 5))
    heap, mask = reused_mask(target, FULL, "cpu", "reader-agreement")
    step = target.verify(None, FULL, batch, heap).as_cpu()
    assert not step.reused
    view = target.read_replay(mask, FULL, batch, step, heap)
    n = step.tree_mask.numel()
    assert view.mask.data_ptr() == mask.buffer.data_ptr()
    assert torch.equal(view.mask.reshape(-1)[:n].view(torch.uint8), step.tree_mask.view(torch.uint8))
    assert not heap.check()


# -- altered copies of the installed SGLang ------------------------------------------

TRITON = "srt/layers/attention/triton_backend.py"
FLASHINFER = "srt/layers/attention/flashinfer_backend.py"
PACK = "kernels/ops/speculative/pack_verify_mask.py"
EAGLE_INFO = "srt/speculative/eagle_info.py"

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
    # The KV indptr counts one token too many before every request after the first.
    "kv-indptr-off-by-one": ([([TRITON], r"kv_indptr\[1:\] = torch\.cumsum\(seq_lens, dim=0\)",
                               "kv_indptr[1:] = torch.cumsum(seq_lens, dim=0) + 1")], "reader-agreement"),
    # Eager qo_indptr stops one request short: arange to bs * d, not (bs + 1) * d.
    "qo-indptr-one-short": ([([TRITON], r"(qo_indptr = torch\.arange\(\n\s*0,\n\s*)\(1 \+ bs\) \* num_tokens_per_req,",
                              r"\1bs * num_tokens_per_req,")], "reader-agreement"),
    # The KV gather takes each request's place in the batch for its request-pool slot.
    "kv-gather-batch-order": ([([TRITON], r"(self\.kv_index_translator\.pack_read_stream\(\n\s*plan,\n\s*)"
                                          r"req_pool_indices=req_pool_indices,",
                                r"\1req_pool_indices=torch.arange(bs, device=seq_lens.device),")],
                              "reader-agreement"),
    # Eager max_extend_len one short of the d draft tokens each request extends by.
    "max-extend-len-off-by-one": ([([TRITON], r"max_extend_len = num_tokens_per_req\n",
                                    "max_extend_len = num_tokens_per_req - 1\n")], "reader-agreement"),
    # Bits shifted from the top: each byte MSB first.
    "pack-bit-order": ([([PACK], r"values\.to\(tl\.uint32\) << bit\[None, :\]",
                         "values.to(tl.uint32) << (7 - bit[None, :])")], "packed-mask"),
    # One byte more per row: the last byte of each row spills into the next row, and past the buffer.
    "pack-store-bound": ([([PACK], r"byte < tl\.cdiv\(count, 8\)", "byte <= tl.cdiv(count, 8)")], "packed-mask"),
    # Byte counts rounded down: rows overlap and the tail runs past the total.
    "packed-lengths-floor": ([([FLASHINFER], r"packed_lengths = \(kv_lens_host \* uniform_verify_width \+ 7\) // 8",
                               "packed_lengths = kv_lens_host * uniform_verify_width // 8")], "packed-mask"),
    # FlashInfer's KV gather takes each request's place in the batch for its request-pool slot.
    "flashinfer-kv-gather-batch-order": ([([EAGLE_INFO], r"(total_tokens = [^\n]*\n[^\n]*\n\s*translator\."
                                                         r"pack_read_stream\(\n\s*plan,\n\s*)"
                                                         r"req_pool_indices=req_pool_indices,",
                                           r"\1req_pool_indices=torch.arange(batch_size, device=device),")],
                                         "packed-mask"),
    # The host-side check on the total dropped as redundant.
    "pack-assert-dropped": ([([FLASHINFER], r"assert int\(packed_indptr\[-1\]\) <= self\._custom_mask_buf\.numel\(\)",
                              "pass")], "packed-mask"),
}



@pytest.mark.parametrize("alteration", run_cases(ALTERATIONS), ids=lambda a: a or "unaltered")
@pytest.mark.slow
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
        assert "target raised" not in out, out
        assert_caught_by(tmp_path / "report", prop, out=out)


_UNKNOWN_SUM = r"(if seq_lens_sum is None:\n\s+seq_lens_sum = )bs \* self\.max_context_len"
_OVERLAP_CASE = {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 16, "num_draft_tokens": 4, "topk": 1,
                 "spec_steps": 3}


@pytest.mark.slow
def test_the_overlap_scheduler_s_unknown_length_sum_is_read_and_judged(sglang_target, tmp_path):
    """The overlap scheduler never copies a batch's total length to the host: the Triton reader then sizes
    its KV gather from the context limit. Sized from the batch size alone, request 1's KV slots are gathered
    past the end of a too-short buffer: a reader-agreement catch on the overlap read, never SGLang raising;
    the same size computed another way holds."""
    triton = ("srt/layers/attention/triton_backend.py",)
    short = altered_copy(tmp_path / "short", [(triton, _UNKNOWN_SUM, r"\1bs")], "unknown-sum-from-bs")
    proc, out = replay_on_copy(short, tmp_path / "short", _OVERLAP_CASE, [5, 9], "reader-agreement")
    assert proc.returncode == 1, out
    o = failed_check_origin(tmp_path / "short" / "report", out)
    assert (o["property"], o["effect"], o["buffer"]) == ("reader-agreement", "overrun", "kv_indices"), o
    same = altered_copy(tmp_path / "same", [(triton, _UNKNOWN_SUM, r"\1self.max_context_len * bs")],
                        "unknown-sum-refactored")
    proc, out = replay_on_copy(same, tmp_path / "same", _OVERLAP_CASE, [5, 9], "reader-agreement")
    assert proc.returncode == 0, out
