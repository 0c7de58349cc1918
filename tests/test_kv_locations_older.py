"""kv-location-soundness on releases that hold only part of the step's code (0.5.21, 0.5.22).

A sub-check whose SGLang code a release does not hold at all judges nothing there: it is no promise on
that release, said in the ledger ("absent from this SGLang"), and the property holds on the rest. A
release that holds part of that code (a producer under another name, a plan its translator cannot be
asked for) has a sub-check vmfuzz could not make: held in part, exit 3, as before. The first tests build
those shapes from the installed 0.5.23 (what CI has); the ``release``-marked ones plant real bugs in a
copy of an installed 0.5.21 and 0.5.22 (``VMFUZZ_RELEASES_DIR``, as tests/test_graph_older_releases.py
finds them) and check that the sub-check meant to catch each does, on that release's own code.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from vmfuzz.harness.properties import sub_checks_absent, sub_checks_not_driven
from vmfuzz.harness.properties.kit import ABSENT, DONE, SUB_CHECK, gaps
from tests.helpers import sglang_or_skip
from tests.sglang_copies import altered_copy, run_on_copy
from tests.test_graph_older_releases import RELEASES_DIR
from tests.test_kv_locations import (ALTERATIONS, CAUGHT_BY, CHAIN, DRAFT_PROBS_DROPPED, PLAN, PROP, REFACTOR, SEQ_LENS,
                                     TREE)

# -- the ledger ---------------------------------------------------------------------------


def test_a_sub_check_absent_from_the_release_is_no_gap_while_another_was_judged():
    entries = {"verify window": DONE, "fused window": f"{ABSENT} (no producer)"}
    assert gaps(entries) == {}
    # a case the property passed over whole says "not driven" for every sub-check: the release still lacks it
    entries["fused window"] = f"{ABSENT} (no producer); not driven (topk > 1 with a short tree)"
    assert gaps(entries) == {}


def test_absence_never_makes_a_property_that_judged_nothing_held():
    entries = {"verify window": "not driven (never reached)", "fused window": f"{ABSENT} (no producer)"}
    assert set(gaps(entries)) == {"verify window", "fused window"}


def test_a_sub_check_not_driven_stays_a_gap_beside_an_absent_one():
    entries = {"verify window": DONE, "fused window": f"{ABSENT} (no producer)",
               "plan reads": "not driven (KVIndexTranslator has no read_table for the plan's readers)"}
    assert set(gaps(entries)) == {"plan reads"}


def test_the_property_record_says_which_sub_checks_are_no_promise_here():
    classes = {f"{SUB_CHECK}{name}: {DONE}" for name in ("draft window", "verify window", "plan reads", "swa store",
                                                          "accept moves", "bonus stride", "allocation width")}
    classes.add(f"{SUB_CHECK}fused window: {ABSENT} (no KVIndexTranslator.plan_uniform_extend)")
    assert sub_checks_not_driven(PROP, classes) == {}
    assert list(sub_checks_absent(PROP, classes)) == ["fused window"]


# -- what a release holds, read from its code ---------------------------------------------

def _modules():
    sglang_or_skip()
    from vmfuzz.harness.targets.sglang.kv_locations import kv_modules
    return kv_modules()


def _without(cls, *names):
    """``cls`` as a release without ``names`` would define it."""
    return type(cls.__name__, (), {k: v for k, v in vars(cls).items() if k not in names})


def test_the_installed_release_holds_the_fused_producer_and_the_plan():
    from vmfuzz.harness.targets.sglang import kv_plan_reads, kv_translation
    sg = _modules()
    assert kv_translation.absent(sg) is None and kv_translation._missing(sg) is None
    assert kv_plan_reads.absent(sg) is None and kv_plan_reads.not_driven(sg) is None


def test_a_release_with_none_of_the_fused_producer_has_it_absent():
    from vmfuzz.harness.targets.sglang import kv_translation
    sg = _modules()
    plain = inspect.signature(sg.cache_locs.assign_extend_cache_locs_uniform_func)

    def uniform(req_pool_indices, req_to_token, start_offset, batch_size, draft_token_num, device):
        """0.5.22's producer: the window alone."""
    assert kv_translation.FUSED <= set(plain.parameters)
    older = SimpleNamespace(**vars(sg))
    older.cache_locs = SimpleNamespace(assign_extend_cache_locs_uniform_func=uniform)
    older.translator = SimpleNamespace(KVIndexTranslator=_without(sg.translator.KVIndexTranslator,
                                                                  "plan_uniform_extend"))
    assert "plan_uniform_extend" in kv_translation.absent(older)


def test_a_release_with_half_the_fused_producer_is_not_driven_never_absent():
    from vmfuzz.harness.targets.sglang import kv_translation
    sg = _modules()
    half = SimpleNamespace(**vars(sg))  # the launch takes the fused outputs, the translator asks for none
    half.translator = SimpleNamespace(KVIndexTranslator=_without(sg.translator.KVIndexTranslator,
                                                                 "plan_uniform_extend"))
    assert kv_translation.absent(half) is None
    assert "plan_uniform_extend" in kv_translation._missing(half)


def test_a_plan_its_translator_cannot_be_asked_for_is_not_driven_never_absent():
    from vmfuzz.harness.targets.sglang import kv_plan_reads
    sg = _modules()
    renamed = SimpleNamespace(**vars(sg))
    renamed.translator = SimpleNamespace(KVIndexTranslator=_without(sg.translator.KVIndexTranslator, "read_table"))
    assert kv_plan_reads.absent(renamed) is None and "read_table" in kv_plan_reads.not_driven(renamed)
    planless = SimpleNamespace(**vars(sg))
    planless.IdSpaceKind = None  # no kv_loc_plan module: 0.5.21's translator reads without a plan
    assert "kv_loc_plan" in kv_plan_reads.absent(planless)


@pytest.mark.slow
def test_a_copy_that_renames_the_translating_pools_producer_is_held_in_part(sglang_target, tmp_path):
    """The launch still takes the fused outputs: the code is there, vmfuzz cannot ask for it, exit 3."""
    edits = [(["srt/mem_cache/kv_index_translator.py"], r"def plan_uniform_extend\(", "def plan_fused_extend(")]
    proc, out = run_on_copy(altered_copy(tmp_path, edits, "renamed-producer"), tmp_path, "run", "--target", "sglang",
                            "--property", PROP, "--seed", "7", "--max-examples", "4", "--report-dir",
                            str(tmp_path / "run"))
    assert proc.returncode == 3 and "held in part" in out and "fused window: not driven" in out, out


# -- on an installed older release: real bugs planted in a copy of its own code -------------

#: the alterations of tests/test_kv_locations.py whose code each older release holds as 0.5.23 does
SHARED = ("s26866-move-size-bs-d", "s15360-bonus-stride-d", "s26972-row-without-paged-reserve",
          "tail-copy-one-too-many")
OLDER = {
    "0.5.21": {name: ALTERATIONS[name] for name in SHARED},
    "0.5.22": {**{name: ALTERATIONS[name] for name in SHARED + ("packed-stream-through-full-pages",
                                                                  "grown-table-drops-a-row", "captured-padding-lane-stale",
                                                                  "fused-bonus-one-node-early",
                                                                  "fused-length-without-bonus")},
               # ours, on 0.5.22's plan (no reader argument): every sub-pool's read table is the full one's
               "read-table-of-the-full-sub-pool": [(PLAN, r"space = self\._source\.space\(kind\)\n",
                                                    "space = self._source.space(IdSpaceKind.FULL)\n")]},
}
OLDER_CAUGHT_BY = {**CAUGHT_BY, "read-table-of-the-full-sub-pool": "plan reads"}
#: what each older release's ledger says of the sub-checks it holds none of the code of
OLDER_ABSENT = {"0.5.21": {"fused window", "plan reads"}, "0.5.22": {"fused window"}}


def _release(release: str) -> tuple[str, Path]:
    python = RELEASES_DIR / f"venv-{release}" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no SGLang {release} environment under {RELEASES_DIR} (scripts/release_matrix.sh makes one)")
    [package] = (RELEASES_DIR / f"venv-{release}" / "lib").glob("python3*/site-packages/sglang")
    return str(python), package


#: the server of tests/test_kv_locations.py's tree case: a replay there would end at 0.5.22's known defect
#: of the plan's second reader on the case's first page size and never reach its paged tree, where a run
#: goes on past a known defect (``kit.known_goes_on``)
def _deployment(config: dict) -> dict:
    return {"layout": config["mode"], "cuda_graph_max_bs": config["max_bs"], "max_running_requests": len(SEQ_LENS),
            "context_length": config["max_context_len"], "num_draft_tokens": config["num_draft_tokens"],
            "topk": config["topk"], "spec_steps": config["spec_steps"], "seq_lens": list(SEQ_LENS)}


def _run_on_release(tmp_path, release: str, edits, name: str, config: dict = TREE):
    """``run --deployment`` of the tree case's server (or ``config``'s), kv-location-soundness alone, on a copy
    of ``release``'s SGLang with ``edits``: (process, output, summary)."""
    python, package = _release(release)
    site = altered_copy(tmp_path, edits, name, package=package)
    (tmp_path / "deployment.json").write_text(json.dumps(_deployment(config)))
    proc, out = run_on_copy(site, tmp_path, "run", "--deployment", str(tmp_path / "deployment.json"), "--target",
                            "sglang", "--property", PROP, "--seed", "7", "--max-examples", "12", "--report-dir",
                            str(tmp_path / "run"), python=python)
    return proc, out, json.loads((tmp_path / "run" / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.release
@pytest.mark.parametrize("release,alteration", [(r, a) for r, alts in OLDER.items() for a in alts])
def test_a_real_bug_in_an_older_release_is_caught_by_its_sub_check(tmp_path, release, alteration):
    proc, out, summary = _run_on_release(tmp_path, release, OLDER[release][alteration], alteration)
    assert proc.returncode == 1, out
    findings = summary["findings"]
    assert findings and all(f["kind"] == "property" for f in findings), out
    assert {(f["origin"]["property"], f["origin"]["stage"]) for f in findings} == {(PROP, OLDER_CAUGHT_BY[alteration])}, out


@pytest.mark.slow
@pytest.mark.release
@pytest.mark.parametrize("release", list(OLDER))
@pytest.mark.parametrize("edits", [[], REFACTOR], ids=["pristine", "page-count-refactor"])
def test_an_older_release_holds_pristine_and_refactored_its_absent_sub_checks_said(tmp_path, release, edits):
    proc, out, summary = _run_on_release(tmp_path, release, edits, "copy")
    assert proc.returncode == 0, out  # held, known findings aside
    [p] = summary["properties"]
    assert p["status"] == "held", out
    absent = {name for name, why in p["sub_checks"].items() if why.startswith(ABSENT)}
    assert absent == OLDER_ABSENT[release] and "no promise here" in out, (p["sub_checks"], out)
    assert all(p["sub_checks"][name] == DONE for name in set(p["sub_checks"]) - absent), p["sub_checks"]


@pytest.mark.slow
@pytest.mark.release
@pytest.mark.parametrize("release", list(OLDER))
def test_an_older_releases_rejection_sampling_is_judged_and_its_dropped_draft_distribution_caught(tmp_path, release):
    """Its CPU branch imports sgl_kernel's renormalisation (not installed, not called without top-k or top-p):
    stubbed for the call, the branch runs as the release wrote it."""
    proc, out, summary = _run_on_release(tmp_path / "pristine", release, [], "pristine", CHAIN)
    assert proc.returncode == 0, out
    [p] = summary["properties"]
    assert {"accept moves: rejection sampling, per token", "accept moves: rejection sampling, block verification"} \
        <= set(p["classes"]), p["classes"]
    proc, out, summary = _run_on_release(tmp_path / "dropped", release, DRAFT_PROBS_DROPPED, "draft-probs-dropped", CHAIN)
    assert proc.returncode == 1, out
    assert {(f["kind"], f["origin"]["stage"]) for f in summary["findings"]} == {("property", "accept moves")}, out
    assert "rejection sampling" in out, out


def test_a_base_without_the_plan_cannot_say_its_known_defect_holds():
    """A gate's base without the plan (0.5.21) runs the entry's case with plan reads absent and holds,
    which says nothing of the plan's defect: the entry's range decides, as for a piece not driven."""
    from vmfuzz.harness.engine.regression.known_on_base import _names_a_piece
    from vmfuzz.harness.model.known_file import load
    from vmfuzz.harness.properties.kv_locations import WRITERS
    from vmfuzz.harness.targets.sglang.graph_support import FUSED_PIECE, PLAN_PIECE
    assert PLAN_PIECE in WRITERS["plan reads"] and FUSED_PIECE in WRITERS["fused window"]
    entry = load(Path(__file__).resolve().parents[1] / "known" / "plan-reads-second-reader-through-runner-table.json")
    assert _names_a_piece(entry, {PLAN_PIECE: "no kv_loc_plan"}) and not _names_a_piece(entry, {FUSED_PIECE: "x"})
    assert not _names_a_piece(entry, {})


def test_the_installed_release_lacks_no_kv_location_piece():
    sglang_or_skip()
    from vmfuzz.harness.targets.sglang.graph_support import FUSED_PIECE, PLAN_PIECE, pieces_not_driven
    assert not {PLAN_PIECE, FUSED_PIECE} & set(pieces_not_driven())


# -- the step's pieces under the names 0.5.17-0.5.20 read them by ------------------------------------------

_SIZING_0517 = '''
def get_alloc_reserve_per_decode(server_args=None):
    if server_args is None:
        server_args = get_server_args()
    return 2 * max(server_args.speculative_num_steps * server_args.speculative_eagle_topk,
                   server_args.max_speculative_num_draft_tokens)

def get_req_to_token_extra_context_len(server_args):
    return 4 + server_args.max_speculative_num_draft_tokens

def get_server_args():
    raise AssertionError("no server args published")
'''

_PREPARE_0517 = '''
def eagle_prepare_for_decode(batch):
    batch.maybe_evict_swa()
    page = batch.token_to_kv_pool_allocator.page_size
    reserve = sizing.get_alloc_reserve_per_decode()
    nxt = [max(r.kv.kv_allocated_len, (r.kv_committed_len + reserve + page - 1) // page * page) for r in batch.reqs]
    alloc_for_spec_decode(None, batch.req_to_token_pool, nxt_kv_lens_cpu=torch.tensor(nxt))

def alloc_for_spec_decode(*args, **kwargs):
    raise AssertionError("the real allocation ran")
'''


def _module(name: str, source: str, **names):
    import types
    mod = types.ModuleType(name)
    vars(mod).update(names)
    exec(compile(source, name, "exec"), vars(mod))
    return mod


def test_a_release_that_sizes_in_its_decode_preparation_is_read_there():
    """0.5.17/0.5.18 hold no page_aligned_decode_alloc_lens: the allocation ends are what
    eagle_prepare_for_decode hands its allocation call, its settings read off get_server_args()."""
    import torch

    from vmfuzz.harness.targets.sglang.kv_locations import allocation
    sizing = _module("sizing", _SIZING_0517)
    eagle_utils = _module("eagle_utils", _PREPARE_0517, sizing=sizing, torch=torch)
    case = SimpleNamespace(topk=1, spec_steps=3, d=4, page_size=4, seq_lens=(5, 8), context_len=32, bs=2)
    reserve, nxt, extra, asked = allocation(SimpleNamespace(sizing=sizing, eagle_utils=eagle_utils), case)
    assert (reserve, extra) == (8, 8)
    assert nxt == [16, 16]  # committed + reserve, rounded up to the page
    assert asked is None  # the allocator's count is made inside the preparation: not read there
    with pytest.raises(AssertionError, match="no server args"):  # its own again once the step is sized
        sizing.get_server_args()


def test_a_release_with_neither_sizing_helper_nor_preparation_is_out_of_step():
    from vmfuzz.harness.model.errors import OutOfStep
    from vmfuzz.harness.targets.sglang.kv_locations import allocation
    sizing = _module("sizing", _SIZING_0517)
    case = SimpleNamespace(topk=1, spec_steps=3, d=4, page_size=1, seq_lens=(5,), context_len=32, bs=1)
    with pytest.raises(OutOfStep, match="page_aligned_decode_alloc_lens"):
        allocation(SimpleNamespace(sizing=sizing, eagle_utils=SimpleNamespace()), case)


def test_the_samplers_tp_group_is_answered_only_where_the_package_holds_it():
    from vmfuzz.harness.targets.sglang.kv_locations import one_rank_group
    group = SimpleNamespace(world_size=1)
    [(owner, name, answer)] = one_rank_group(SimpleNamespace(distributed=SimpleNamespace(get_tp_group=None)), group)
    assert name == "get_tp_group" and answer() is group
    assert one_rank_group(SimpleNamespace(distributed=SimpleNamespace()), group) == []
