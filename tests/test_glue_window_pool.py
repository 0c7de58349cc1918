"""The metadata glue graph on a window-pool server: the window layers' write slots replayed from the capture.

A server whose KV pool keeps its sliding-window layers apart (SGLang's
``SWAKVPool``; ``harness/targets/sglang/swa_server``) writes each verify
token's KV twice, the window layers' at the window slots the Triton backend
copies into a buffer of its own each replay (``_fill_cuda_graph_swa_out_cache_loc``,
from the step's KV-location plan). With the glue graph on, that copy is
captured once and replayed by address, so a glued replay writes the window
layers' KV into the capture step's slots: on pristine 0.5.23 each property meant
for it produces the finding (the known entries
``known/metadata-glue-window-pool-write-slots-*.json``), a copy whose fill
translates the runner's static ``out_cache_loc`` holds, and a rewrite of the
fill that keeps what it does produces the same finding, no other.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import sglang_or_skip
from tests.sglang_copies import altered_copy, run_on_copy
from tests.surface_ran import assert_texts_ran, surface_never_ran
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode

RUNNER = ["srt/model_executor/runner/decode_cuda_graph_runner.py"]
TRITON = ["srt/layers/attention/triton_backend.py"]
PROPS = ("capture-replay-agreement", "graph-replay-equivalence", "padding-inert")
KNOWN = {"capture-replay-agreement": "metadata-glue-window-pool-write-slots-agreement",
         "graph-replay-equivalence": "metadata-glue-window-pool-write-slots-equivalence",
         "padding-inert": "metadata-glue-window-pool-write-slots-padding-inert"}
#: what each property's own failure names on pristine 0.5.23 (the agreement's first moved read; the others'
#: first wrong cell: the window layers' slots, the full layers' and every read being right)
BUFFERS = {"capture-replay-agreement": ("view.out_cache_loc", "view.kv_loc_plan"),
           "graph-replay-equivalence": ("swa_out_cache_loc",), "padding-inert": ("swa_out_cache_loc",)}
WRITER = "metadata glue graph replay, a sliding-window KV pool"

#: the fix: the glued prep reads the runner's static out_cache_loc (repointed for every glue, not only
#: DSpark's) and translates it through the pool's map, both at addresses that outlive the step; and the
#: replay's reads are handed the step's plan only where they go through it (a translating pool: on this
#: static one they read the request rows they are given, so a glued prep needs no per-step object)
FIX = [(TRITON, r"        else:\n            self\._apply_cuda_graph_metadata\(\n"
                r"                plan=forward_batch\.kv_loc_plan,",
        "        else:\n            self._apply_cuda_graph_metadata(\n                plan=(forward_batch.kv_loc_plan"
        " if self.kv_index_translator.reads_are_translated else None),"),
       (RUNNER, r"if \(\n            self\._draft_metadata_glue or self\._target_metadata_glue\n"
                r"        \) and fb_view\.out_cache_loc is not None:",
        "if fb_view.out_cache_loc is not None:"),
       (TRITON, r"(self\.cuda_graph_swa_out_cache_loc\[:n\]\.copy_\(\n\s*)self\.kv_index_translator\.write_ids\("
                r"\n\s*forward_batch, IdSpaceKind\.SLIDING_WINDOW\n\s*\)",
        r"\1self.token_to_kv_pool.translate_loc_from_full_to_swa(out_cache_loc)")]
#: the fill's two branches written around one view of the buffer: what it copies, and from where, unchanged
REFACTOR = [(TRITON, r"        if in_capture:\n            self\.cuda_graph_swa_out_cache_loc\[:n\]\.zero_\(\)\n"
                     r"        else:\n            self\.cuda_graph_swa_out_cache_loc\[:n\]\.copy_\(\n"
                     r"(?P<src>(?:.*\n)*?)            \)\n        return self\.cuda_graph_swa_out_cache_loc\[:n\]\n",
             "        live = self.cuda_graph_swa_out_cache_loc[:n]\n        if not in_capture:\n"
             "            live.copy_(\n\\g<src>            )\n        else:\n            live.zero_()\n"
             "        return live\n")]


def _window_pool_config(call_site: str = "eagle", max_bs: int = 2) -> Config:
    """A case a server of the default shares glues on a window pool (``graph_glue.window_pool``)."""
    from vmfuzz.harness.properties.graph_glue import window_pool
    return next(c for c in (Config(TreeMaskMode.FULL_MASK, max_bs, n, 4, 2, 2, True, call_site) for n in range(8, 200))
                if window_pool(c))


BATCHES = [Batch((5, 7)), Batch((3,)), Batch((2, 6))]


def _case(tmp_path, config: Config) -> str:
    repro = tmp_path / "case.json"
    fields = {"mode": config.mode.name, "max_bs": config.max_bs, "max_context_len": config.max_context_len,
              "num_draft_tokens": config.d, "topk": config.topk, "spec_steps": config.spec_steps,
              "is_read": config.is_read, "call_site": config.call_site}
    repro.write_text(json.dumps({"config": fields, "batches": [{"seq_lens": list(b.seq_lens)} for b in BATCHES]}))
    return str(repro)


def _replay(site, tmp_path, prop: str):
    report = tmp_path / f"report-{prop}"
    proc, out = run_on_copy(site, tmp_path, "replay", _case(tmp_path, _window_pool_config()), "--target", "sglang",
                            "--property", prop, "--isolate", "off", "--report-dir", str(report))
    return proc, out, json.loads((report / "summary.json").read_text())


# -- in-process, on the installed SGLang ---------------------------------------------------------------

@pytest.mark.parametrize("prop", PROPS)
def test_each_property_meant_for_it_produces_the_finding_on_pristine_sglang(prop):
    """With no known entry attached, the property's own check fails, naming the glue graph's replay on a
    window pool and the window layers' slots (or, for agreement, the step's own write window read by it)."""
    from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
    target = sglang_or_skip()
    target.known_findings = ()
    with pytest.raises(PropertyFailure) as caught:
        PROPERTIES[prop].check(target, _window_pool_config(), BATCHES)
    origin = caught.value.origin
    assert (origin.property, origin.effect, origin.writer) == (prop, "wrong", WRITER), origin
    assert origin.buffer in BUFFERS[prop], origin


def test_the_known_entries_excuse_it_and_every_other_check_runs(sglang_target):
    """Each property meets the defect as its known entry (a class), the glue graph captured and replayed
    on the window-pool server, and the rest of the case judged."""
    from vmfuzz.harness.properties import PROPERTIES
    for prop in PROPS:
        obs = PROPERTIES[prop].check(sglang_target, _window_pool_config(), BATCHES)
        assert {f"metadata glue graph: known finding {KNOWN[prop]}", "metadata glue graph: captured and replayed",
                "metadata glue graph: on a sliding-window KV pool server"} <= obs.classes, sorted(obs.classes)


def test_the_window_pool_server_is_sglangs_own_decision_over_its_pool(sglang_target):
    """The backend's ``__init__`` decided the window pool (its write buffer sized by its graph set-up), the
    translator's ``__init__`` gave it a window id space, and its write buffers are redzoned static buffers."""
    from vmfuzz.harness.guard.shadow import ShadowHeap
    heap = ShadowHeap()
    config = _window_pool_config()
    session = sglang_target.graph_session(config, sglang_target.allocate(config, heap), heap, window_pool=True)
    backend = session.server.backend
    assert backend.use_sliding_window_kv_pool and backend.sliding_window_size == config.max_context_len // 2
    assert backend.cuda_graph_swa_out_cache_loc.numel() == session.server.runner.max_num_token
    assert heap.backing_of(backend.cuda_graph_swa_out_cache_loc) is not None
    kinds = {k.name for k in backend.kv_index_translator._spaces}
    assert kinds == {"FULL", "SLIDING_WINDOW"}, kinds
    # the pool is made by SWAKVPool's own __init__: its sub-pools hold the layers of their kind, slots recorded
    pool = backend.token_to_kv_pool
    assert (pool.full_kv_pool.model_layer_ids, pool.swa_kv_pool.model_layer_ids) == ((0,), (1,))
    assert pool.full_kv_pool.size == pool.swa_kv_pool.size == pool.size
    assert pool.layers_mapping == {0: (0, False), 1: (0, True)}
    # a replay the glue graph does not prepare: the window layers read windows and write the window slots of
    # the step's own write window, as the eager run does
    from vmfuzz.harness.model.fa3_reads import swa_slot
    from vmfuzz.harness.model.oracle import expected
    from vmfuzz.harness.properties.graph_shared import read_layout
    batch = Batch((7, 2))
    mask = expected(read_layout(config), batch).tree_mask
    ids, loc = session.inputs(batch)
    got, want = session.replay(batch, mask, ids, loc), session.eager(batch, mask, ids, loc)
    n = batch.bs * config.d
    assert got.forward.attended[:n] == want.attended and any(a.window_seen for a in want.attended)
    assert got.forward.window_writes[:n] == want.window_writes
    assert [s for s, _ in want.window_writes] == [swa_slot(int(v)) for v in loc]


def test_the_judged_sglang_lines_ran(sglang_target):
    """coverage.py, as the gate measures: every function the window-pool server drives ran a line under the
    properties, and so did the lines the finding sits on (the fill's copy, the plan's window ids, the map)."""
    import importlib.util
    from pathlib import Path

    import coverage

    from vmfuzz.harness.properties import PROPERTIES
    from vmfuzz.harness.targets.sglang.swa_server import SURFACE
    root = Path(importlib.util.find_spec("sglang").origin).parent
    cov = coverage.Coverage(include=sorted({str(root / rel) for rel, _, _ in SURFACE}), data_file=None)
    cov.start()
    try:
        for prop in ("graph-replay-equivalence", "capture-replay-agreement"):
            PROPERTIES[prop].check(sglang_target, _window_pool_config(), BATCHES)
    finally:
        cov.stop()
    data = cov.get_data()
    unrun = surface_never_ran(root, SURFACE, data)
    assert not unrun, f"driven functions whose lines never ran: {unrun}"
    assert_texts_ran(root, (
        ("srt/layers/attention/triton_backend.py", "self.cuda_graph_swa_out_cache_loc[:n].copy_("),
        ("srt/layers/attention/triton_backend.py", "self.cuda_graph_swa_out_cache_loc[:n].zero_()"),
        ("srt/layers/attention/triton_backend.py", "if not translated and isinstance(token_to_kv_pool"),
        ("srt/mem_cache/kv_index_translator.py", "return pad_with_sink(ids, out_cache_loc.shape[0])"),
        ("srt/mem_cache/kv_loc_plan.py", "return space.write(self.write_virtual)"),
        ("srt/mem_cache/swa_memory_pool.py", "return self.full_to_swa_index_mapping[kv_indices]"),
    ), data)


# -- copies of SGLang, through the CLI ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("edits,name", [([], None), (REFACTOR, "fill-rewritten")], ids=["pristine", "fill-rewritten"])
@pytest.mark.parametrize("prop", PROPS)
def test_pristine_sglang_and_a_rewrite_of_the_fill_end_in_the_known_entry_and_add_none(tmp_path, prop, edits, name):
    sglang_or_skip()
    proc, out, summary = _replay(altered_copy(tmp_path, edits, name), tmp_path, prop)
    assert proc.returncode == 0 and f"known {prop} on sglang: known finding {KNOWN[prop]}:" in out, out
    [check] = summary["checks"]
    assert check["origin"]["property"] == prop and check["origin"]["buffer"] in BUFFERS[prop], check


@pytest.mark.slow
@pytest.mark.parametrize("prop", PROPS)
def test_a_copy_whose_fill_copies_the_live_steps_ids_holds(tmp_path, prop):
    sglang_or_skip()
    proc, out, _ = _replay(altered_copy(tmp_path, FIX, "fill-from-static-out-cache-loc"), tmp_path, prop)
    assert proc.returncode == 0 and f"held {prop}" in out, out


@pytest.mark.slow
def test_the_rewrite_on_the_fixed_copy_holds(tmp_path):
    sglang_or_skip()
    proc, out, _ = _replay(altered_copy(tmp_path, FIX + REFACTOR, "fixed-and-rewritten"), tmp_path,
                           "graph-replay-equivalence")
    assert proc.returncode == 0 and "held graph-replay-equivalence" in out, out


def test_a_per_step_mask_on_a_window_pool_meets_both_entries(sglang_target):
    """Frozen-KV MTP's server on a window pool: the glue graph's prep reads both its frozen mask and the
    capture step's write window, each excused by its own entry (whose writer names the window pool)."""
    from vmfuzz.harness.properties import PROPERTIES
    obs = PROPERTIES["capture-replay-agreement"].check(sglang_target, _window_pool_config("frozen_kv_mtp"), BATCHES)
    assert {"metadata glue graph: known finding metadata-glue-per-step-mask-agreement",
            "metadata glue graph: known finding metadata-glue-window-pool-write-slots-agreement"} <= obs.classes, \
        sorted(obs.classes)


def test_each_glue_entry_reproduces_on_its_own(sglang_target):
    """Each glue entry's repro fails as the entry says with no other entry attached, as a gate's base
    replays it: a repro that met another entry's defect first could not tell whether the base has its own."""
    from vmfuzz.harness.engine.regression.known import applicable, default_known_root, entries, replay_known
    found = [(p, k) for p, k in applicable(entries(default_known_root()), dict(sglang_target.versions()))
             if k.name.startswith("metadata-glue-")]
    assert {k.name for _, k in found} >= set(KNOWN.values()), [k.name for _, k in found]
    for path, entry in found:
        [outcome] = replay_known([(path, entry)], sglang_target, findings_dir=None, device="cpu", isolate=False,
                                 timeout=300)
        assert outcome.reproduces, (entry.name, outcome.status, outcome.detail)
