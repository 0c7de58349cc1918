"""The graph drivers' bindings for a release that lays a piece out otherwise (0.5.22), on stand-in objects.

Each binding follows what the installed code shows: the forward context a capture ran in, restored at
replay; an eager forward's context opened as this release's ``forward_context`` takes it; the glue key
and glue state read where the glue graph gives no method for them; the KV-location step's draft-window
launch guarded where the release launches its Triton kernel itself; the greedy walk found where the
release keeps it. CI has 0.5.23 alone, so the older shapes are built here from plain objects; the run of
the graph properties on an installed 0.5.21 and 0.5.22 is the ``release``-marked test at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import ROOT, sglang_or_skip


def test_a_replay_runs_in_the_forward_context_its_capture_ran_in():
    sglang_or_skip()
    from vmfuzz.harness.targets.sglang.graph_lookups import keep_bodies, verify_modules
    fc = verify_modules().forward_context
    seen = []

    class Backend:
        def __init__(self):
            self.bodies = {}

        def capture_one(self, key, body):
            self.bodies[key] = body
            body()

        def replay(self, key):
            return self.bodies[key]()

    def body():  # a captured body that finds its backend through the context, as 0.5.22's does
        seen.append(fc.get_forward_context().attn_backend if fc.has_forward_context() else None)
    backend = Backend()
    keep_bodies(backend, SimpleNamespace(capturable=lambda fn: fn))
    with fc.forward_context(fc.ForwardContext(attn_backend="the capture's backend")):
        backend.capture_one("bs 4", body)
    assert not fc.has_forward_context()
    backend.replay("bs 4")
    assert seen == ["the capture's backend", "the capture's backend"]
    assert not fc.has_forward_context()  # put back after the replay


def test_an_eager_forward_opens_the_context_as_the_release_takes_it(monkeypatch):
    sglang_or_skip()
    from vmfuzz.harness.targets.sglang.graph_lookups import attention_context, verify_modules
    fc = verify_modules().forward_context
    asked = []
    real = fc.forward_context

    def context_alone(ctx):  # 0.5.22's forward_context: the context, no batch
        asked.append(ctx.attn_backend)
        return real(ctx)
    monkeypatch.setattr(fc, "forward_context", context_alone)
    with attention_context("backend", SimpleNamespace()):
        assert fc.get_forward_context().attn_backend == "backend"
    assert asked == ["backend"]


class _Glue:
    """A metadata glue graph as 0.5.22 has it: ``run`` and its states, no ``is_captured``,
    ``note_not_routed`` or runner-side ``_glue_key``."""

    NUM_WARMUP = 2

    def __init__(self):
        self._states, self.disabled = {}, False

    def run(self, attn_backend, fb_view, key):
        st = self._states.setdefault(key, {"warmups": 0, "graph": None})
        if st["warmups"] < self.NUM_WARMUP:
            st["warmups"] += 1
        else:
            st["graph"] = "captured"


def test_the_glue_watch_reads_a_glue_with_no_methods_for_its_key_and_state():
    from vmfuzz.harness.targets.sglang.glue_graph import GlueWatch
    glue = _Glue()
    watch = GlueWatch(glue, SimpleNamespace(), [])
    assert [attr for _, attr, _ in watch.lookups()] == ["run"]  # nothing to bind for an unrouted prep
    runner = SimpleNamespace()  # no _glue_key
    assert watch.key_for(runner, 2, "TARGET_VERIFY", None) is None
    assert watch.steps_to_replay(None) == 3  # two warm-ups, then the capture
    key = (2, "verify", "verify")
    for outcome in ("warm-up", "warm-up"):
        watch.run(None, SimpleNamespace(batch_size=2), key)
        assert watch.outcome == outcome
    assert watch.key_for(runner, 2, "TARGET_VERIFY", None) == key and watch.steps_to_replay(key) == 1
    glue._states[key]["graph"] = "captured"
    assert watch._captured(key)
    glue.disabled = True
    assert not watch._captured(key)
    own = SimpleNamespace(_glue_key=lambda bs, mode, variant: ("own", bs))  # a release with its own key
    assert watch.key_for(own, 2, "TARGET_VERIFY", None) == ("own", 2)


def test_the_draft_window_launch_is_guarded_where_the_release_launches_the_kernel_itself():
    from vmfuzz.harness.guard.shadow import ShadowHeap
    from vmfuzz.harness.targets.sglang.kv_launches import draft_launch

    class Kernel:  # a Triton kernel as prepare_for_draft launches it in 0.5.22: kernel[grid](...)
        @staticmethod
        def fn(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk):
            pass  # the kernel's own parameters (a JITFunction's ``fn``)

        def __getitem__(self, grid):
            def launch(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk):
                launched.append((grid, out_cache_loc.numel()))
                out_cache_loc[:] = 7
            return launch
    launched = []
    heap = ShadowHeap()
    owner, name, guarded = draft_launch(SimpleNamespace(assign_draft_cache_locs_contiguous=Kernel()), heap, reach=8)
    assert name == "assign_draft_cache_locs_contiguous"
    out = torch.zeros(4, dtype=torch.int64)
    guarded[(2,)](None, None, None, out, 16, 1)
    assert launched == [((2,), 4)] and out.tolist() == [7] * 4 and heap.check() == []
    with_wrapper = SimpleNamespace(assign_draft_cache_locs_contiguous_func=lambda out_cache_loc: None)
    assert draft_launch(with_wrapper, heap, reach=8)[1] == "assign_draft_cache_locs_contiguous_func"


def test_the_greedy_walk_is_found_where_the_release_keeps_it():
    from vmfuzz.harness.targets.sglang.kv_launches import greedy_walk
    calls = []
    beside_the_wrapper = SimpleNamespace(spec_tree=SimpleNamespace(),
                                         eagle_utils=SimpleNamespace(verify_tree_greedy_triton=lambda **kw: calls.append(kw)))
    walk = greedy_walk(beside_the_wrapper)
    got = walk(topk=2, predicts="p", accept_index="a", accept_token_num="n")
    assert got == ("p", "a", "n") and calls == [{"predicts": "p", "accept_index": "a", "accept_token_num": "n"}]


def test_the_installed_release_drives_every_draft_piece():
    sglang_or_skip()
    from vmfuzz.harness.targets.sglang.draft_graph_session import seeded_not_driven, window_not_driven
    assert window_not_driven() is None and seeded_not_driven() is None


def test_the_draft_extend_runner_is_handed_select_index_only_where_it_takes_one():
    """0.5.17-0.5.20's EAGLE v2 draft-extend ``execute`` takes the batch alone and hands back every token's
    row, which the worker then picks from; later ones take ``select_index`` and pick themselves."""
    sglang_or_skip()
    from vmfuzz.harness.targets.sglang.draft_extend_runner import _executed
    rows = torch.arange(12.0).view(6, 2)

    class EveryRow:  # as 0.5.17's
        def execute(self, forward_batch):
            return SimpleNamespace(next_token_logits=rows, hidden_states=rows * 10)

    class Picks:  # as 0.5.23's
        def execute(self, forward_batch, select_index):
            return SimpleNamespace(next_token_logits=rows[select_index], hidden_states=None, picked=select_index)
    pick = torch.tensor([1, 5])
    out = _executed(EveryRow(), "fb", pick)
    assert torch.equal(out.next_token_logits, rows[pick]) and torch.equal(out.hidden_states, rows[pick] * 10)
    assert _executed(Picks(), "fb", pick).picked is pick


def test_the_parallelism_helpers_answer_one_gpu_whether_or_not_they_are_handed_server_args():
    """0.5.17-0.5.20 pass the server_args to the helpers, later releases call them bare."""
    sglang_or_skip()
    from vmfuzz.harness.targets.sglang.graph_lookups import rank_place, server_args, single_gpu_helpers
    helpers = single_gpu_helpers()
    args = server_args(SimpleNamespace(topk=2, spec_steps=3, d=4), [1, 2, 4], pp_size=2)
    for name in ("require_gathered_buffer", "require_mlp_tp_gather", "require_mlp_sync", "require_attn_tp_gather",
                 "is_mla_prefill_cp_enabled"):
        assert helpers[name]() is False and helpers[name](args) is False
    assert helpers["get_cuda_graph_batch_size_alignment"](args) == 1
    assert list(args.cuda_graph_config.decode.bs) == [1, 2, 4] and args.speculative_num_draft_tokens == 4
    assert args.tp_size == 1 and args.pp_size == 2 and not args.enable_mamba_extra_buffer()
    place = rank_place(2)
    assert (place.pp_rank, place.pp_size, place.tp_size) == (1, 2, 1)  # the last pipeline stage's runner


def test_the_draft_runner_binds_no_tuner_its_release_lacks(monkeypatch):
    """A release that tunes nothing before its draft capture holds no tuner: nothing bound there."""
    sglang_or_skip()
    from vmfuzz.harness.targets.sglang import draft_graph_runner as dgr
    from vmfuzz.harness.guard.graph import GraphSpace
    from vmfuzz.harness.guard.shadow import ShadowHeap
    m = dgr.modules()
    shape = SimpleNamespace(topk=1, steps=2, draft_tokens=3, page_size=1, seeded_sampling=False)
    space = GraphSpace(ShadowHeap())
    names = {(owner, name) for owner, name, _ in dgr.bindings(shape, [1, 2], space) if owner is m.runner}
    assert ((m.runner, "maybe_flashinfer_autotune_speculative_draft") in names) == \
        hasattr(m.runner, "maybe_flashinfer_autotune_speculative_draft")
    monkeypatch.delattr(m.runner, "maybe_flashinfer_autotune_speculative_draft", raising=False)
    names = {name for owner, name, _ in dgr.bindings(shape, [1, 2], space) if owner is m.runner}
    assert "maybe_flashinfer_autotune_speculative_draft" not in names


# -- on an installed older release ----------------------------------------------------------------------

#: where scripts/release_matrix.sh (or bench/release_diffs.py) leaves each release's environment
RELEASES_DIR = Path(os.environ.get("VMFUZZ_RELEASES_DIR", "/tmp/vmfuzz-releases"))


@pytest.mark.slow
@pytest.mark.release
@pytest.mark.parametrize("release", ["0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22"])
@pytest.mark.parametrize("prop", ["graph-replay-equivalence", "padding-inert", "capture-replay-agreement",
                                  "graph-buffer-soundness", "kv-location-soundness"])
def test_the_graph_properties_are_driven_and_hold_on_a_pristine_older_release(tmp_path, release, prop):
    """Driven and held, its only findings known ones (kv-location-soundness too: the sub-checks whose code
    the release holds none of, its fused window's producer and on 0.5.21 the plan, are said absent there,
    tests/test_kv_locations_older.py)."""
    python = RELEASES_DIR / f"venv-{release}" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no SGLang {release} environment under {RELEASES_DIR} (scripts/release_matrix.sh makes one)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true"}
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    r = subprocess.run([str(python), "-m", "vmfuzz", "run", "--target", "sglang", "--property", prop, "--seed", "7",
                        "--max-examples", "12", "--report-dir", str(tmp_path / "r")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1200)
    out = r.stdout + r.stderr
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["versions"]["sglang"] == release, s["versions"]
    assert r.returncode == 0, out  # held, its only findings known ones
    [p] = s["properties"]
    assert p["status"] == "held", out
    if prop == "kv-location-soundness":  # the fused window's producer is 0.5.23's: no promise there, said
        assert "plan_uniform_extend" in p["sub_checks"]["fused window"], p["sub_checks"]


def test_a_base_that_cannot_drive_the_piece_a_known_defect_is_of_cannot_say_it_holds():
    """A gate excuses a known entry only where its repro fails on the base; on a base whose release keeps
    vmfuzz from driving the entry's piece (0.5.21's window pool) the case runs without it and holds, which
    says nothing: that base cannot say, and the entry's range decides."""
    from vmfuzz.harness.engine.regression.known_on_base import _names_a_piece
    from vmfuzz.harness.model.known_file import load
    pool = load(ROOT / "known" / "metadata-glue-window-pool-write-slots-agreement.json")
    per_step = load(ROOT / "known" / "metadata-glue-per-step-mask-agreement.json")
    missing = {"a sliding-window KV pool": "this SGLang has no write_ids where 0.5.23 has it"}
    assert _names_a_piece(pool, missing) and not _names_a_piece(pool, {})
    assert not _names_a_piece(per_step, missing)  # also written without the pool: the base can say
