"""kv-location-soundness's ``swa store``: DeepSeek V4's KV store of the verify window in its sliding-window pool.

The store's location choice (``DeepseekV4AttnBackend.get_swa_out_cache_loc``) is driven on a backend made by its
own ``__init__`` (``harness/targets/sglang/swa_store.py``); each alteration below is planted in a COPY of the
installed package and caught by the sub-check (read from the finding's origin, never a raise), a
behaviour-preserving refactor holds (the pristine copy's run is ``test_kv_locations``'s).
"""

from __future__ import annotations

import ast

import pytest

from vmfuzz.harness.model.config import Batch
from vmfuzz.harness.model.kv_locations import KvCase, physical_slot
from vmfuzz.harness.properties import sub_checks
from tests.sglang_copies import assert_altered_replay_caught, assert_altered_replay_holds
from tests.surface_ran import checked_under_coverage, surface_never_ran
from tests.test_kv_locations import PROP, SEQ_LENS, TREE, _config

DSV4 = ["srt/layers/attention/deepseek_v4_backend.py"]
ALTERATIONS = {
    # ours: the store writes the full pool's slots into the SWA pool (the translation skipped)
    "swa-translation-skipped": [(DSV4, r"(return cached\n\s+)return self\.token_to_kv_pool"
                                       r"\.translate_loc_from_full_to_swa\(out_cache_loc\)\.to\(",
                                 r"\1return out_cache_loc.to(")],
    # ours: the metadata's cached locations taken whatever batch they were cached for
    "swa-stale-cache-taken": [(DSV4, r"if cached is not None and cached\.shape\[0\] == out_cache_loc\.shape\[0\]:",
                               "if cached is not None:")],
    # ours: the request window activated with an idle forward's layout for a live batch
    "swa-window-idle-layout": [(DSV4, r"window\.activate\(layout\)\n(\s+)return layout\.write_loc",
                                r"layout = layout\n\1return window.activate_idle(out_cache_loc.shape[0])")],
    # ours: the late-layer tail's own locations ignored (the whole extend's taken for the tail's rows)
    "swa-tail-ignored": [(DSV4, r"if isinstance\(metadata, DSV4Metadata\) and metadata\.late_layer_tail is not None:",
                          "if False:")],
    # ours: DSpark's deferred draft-KV commit never joined before the store
    "swa-hook-skipped": [(DSV4, r"if self\.pre_kv_store_hook is not None:\n(\s+)self\.pre_kv_store_hook\(\)",
                          r"if self.pre_kv_store_hook is not None:\n\1pass")],
    # ours: an idle forward trusts a same-length cache left by an earlier step
    "swa-idle-trusts-cache": [(DSV4, r"if forward_batch\.forward_mode\.is_idle\(\):\n(\s+)if window is not None:",
                               r"if False:\n\1if window is not None:")],
    # 0.5.22's idle forward on a request window: the metadata's (stale) layout activated and written
    "swa-idle-window-trusts-metadata": [
        (DSV4, r"if window is not None:\n(\s+)return window\.activate_idle\(out_cache_loc\.shape\[0\]\)",
         r"if window is not None:\n\1layout = self.forward_metadata.core_attn_metadata.request_window_layout"
         r"\n\1window.activate(layout)\n\1return layout.write_loc")],
}
#: the cache's fit tested by element count and read by getattr (the locations are one-dimensional)
REFACTOR = [(DSV4, r"cached = core\.swa_out_cache_loc if core is not None else None\n(\s+)if cached is not None and "
                   r"cached\.shape\[0\] == out_cache_loc\.shape\[0\]:",
             r"cached = getattr(core, 'swa_out_cache_loc', None)\n\1if cached is not None and "
             r"cached.numel() == out_cache_loc.numel():")]


def test_the_swa_mapping_is_the_page_tables_translation():
    """The driver's map, no SGLang needed: each slot the same offset in its SWA page, 0 for an evicted page and for
    the padding slot; held pages on distinct SWA pages from 1."""
    from vmfuzz.harness.targets.sglang.swa_store import swa_mapping, swa_page_table
    table = swa_page_table(40, 4)
    mapping = swa_mapping(40, table, 4)
    assert table[2] == table[5] == -1 and sorted(q for q in table if q >= 0) == list(range(1, 8))
    assert int(mapping[0]) == 0 and all(int(mapping[v]) == physical_slot(v, table, 4) for v in range(1, 40))
    assert all(int(mapping[v]) == 0 for v in range(8, 12))


def test_every_branch_a_cpu_takes_ran_and_was_judged(sglang_target):
    """coverage.py, as the gate measures: every statement of get_swa_out_cache_loc ran under the property, and
    each run was judged."""
    from vmfuzz.harness.targets.sglang import swa_store
    root, obs, data = checked_under_coverage(sglang_target, PROP, _config(topk=1, spec_steps=3, num_draft_tokens=4),
                                             [Batch(SEQ_LENS)], [f for f, _, _ in swa_store.SURFACE])
    assert sub_checks(PROP, obs.classes)["swa store"] == "done", obs.classes
    assert {f"swa store: {run}" for run in ("translated", "cached", "stale cache", "deferred commit",
                                            "late-layer tail", "request window", "idle",
                                            "idle on a request window")} <= obs.classes
    assert not surface_never_ran(root, swa_store.SURFACE, data)
    path = root / DSV4[0]
    fn = next(n for n in ast.walk(ast.parse(path.read_text()))
              if isinstance(n, ast.FunctionDef) and n.name == "get_swa_out_cache_loc")
    body = {n.lineno for stmt in fn.body[1:] for n in ast.walk(stmt) if isinstance(n, ast.stmt)}
    lines = path.read_text().splitlines()
    unrun = sorted(body - set(data.lines(str(path))))
    assert not unrun, [lines[line - 1].strip() for line in unrun]


def test_a_case_without_the_store_says_so():
    """A release with no DeepSeek V4 backend: the sub-check is absent there, never held."""
    from vmfuzz.harness.properties.kit import Observation
    from vmfuzz.harness.properties.kv_locations import _fail
    from vmfuzz.harness.properties.kv_swa_store import judge_swa_store
    from vmfuzz.harness.targets.sglang.swa_store import SwaStores
    case = KvCase(topk=1, spec_steps=1, num_draft_tokens=2, page_size=1, context_len=8, seq_lens=(3,),
                  parents=((-1, 0),), paths=((0,),)).validate()
    obs = Observation()
    judge_swa_store(case, type("W", (), {"swa": SwaStores(absent="no deepseek_v4_backend.py")})(), obs, _fail)
    assert sub_checks(PROP, obs.classes)["swa store"].startswith("absent"), obs.classes


def test_a_backend_not_made_here_leaves_the_store_not_driven(sglang_target, monkeypatch):
    """A release whose DeepSeek V4 backend vmfuzz cannot make (out of step): the sub-check says not driven, and
    why, never held."""
    import torch

    from vmfuzz.harness.model.errors import OutOfStep
    from vmfuzz.harness.properties.kit import Observation
    from vmfuzz.harness.properties.kv_locations import _fail
    from vmfuzz.harness.properties.kv_swa_store import judge_swa_store
    from vmfuzz.harness.targets.sglang import swa_store

    def refuse(*_):
        raise OutOfStep("DeepseekV4AttnBackend.__init__", swa_store.DSV4_FILE, "asks for what vmfuzz cannot hand")
    monkeypatch.setattr(swa_store, "_server", refuse)
    case = KvCase(topk=1, spec_steps=1, num_draft_tokens=2, page_size=1, context_len=8, seq_lens=(3,),
                  parents=((-1, 0),), paths=((0,),)).validate()
    stores = swa_store.run_stores(case, torch.tensor([4, 5]), [1], 2 * 10 + 1)
    obs = Observation()
    judge_swa_store(case, type("W", (), {"swa": stores, "pool_rows": [1]})(), obs, _fail)
    assert sub_checks(PROP, obs.classes)["swa store"].startswith("not driven"), obs.classes


@pytest.mark.slow
@pytest.mark.parametrize("alteration", list(ALTERATIONS))
def test_a_wrong_swa_location_is_caught_by_the_swa_store(sglang_target, alteration, tmp_path):
    assert_altered_replay_caught(tmp_path, ALTERATIONS[alteration], alteration, TREE, SEQ_LENS, PROP,
                                 {"stage": "swa store"})


@pytest.mark.slow
def test_a_refactor_of_the_cache_fit_holds(sglang_target, tmp_path):
    assert_altered_replay_holds(tmp_path, REFACTOR, "swa-cache-fit-refactor", TREE, SEQ_LENS, PROP)
