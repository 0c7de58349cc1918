"""kv-location-soundness's ``swa store`` sub-check: where DeepSeek V4's KV store writes the verify window in its
sliding-window pool (``harness/targets/sglang/swa_store.py`` drives it), judged from the meaning: each row's own
``req_to_token`` cell (``verify_columns``) through the SWA page table the driver handed the pool
(``physical_slot``), never the translation SGLang computed.
"""

from __future__ import annotations

from vmfuzz.harness.model.kv_locations import KvCase, physical_slot, verify_columns
from vmfuzz.harness.properties.kit import Observation, sub_check_absent, sub_check_done, sub_check_skipped


def judge_swa_store(case: KvCase, w, obs: Observation, fail_case) -> None:
    """DeepSeek V4's SWA store of the verify window, per branch of its location choice: each row written at
    its node's own cell's slot through the SWA page table the driver handed the pool (``physical_slot``; an
    idle row at the dummy slot 0), inside the SWA pool; on a request window, at the workspace row past the
    history rows (one window per request run; an idle forward's rows are one run), in query order, under the
    forward's own layout, inside the workspace; a deferred commit joined
    before the store, once. ``fail_case``: the property's failure, filed under the sub-check."""
    t, sub = w.swa, "swa store"
    if t is None or t.absent:
        sub_check_absent(obs, sub, t.absent if t is not None else "no DeepSeek V4 store was asked")
        return
    if t.not_driven:
        sub_check_skipped(obs, sub, t.not_driven)
        return
    P, rows = t.page_size, w.pool_rows
    for s in t.stores:
        def wrong(detail: str, cell: str) -> None:
            fail_case(sub, case, f"{s.run}: {detail}", buffer="swa out_cache_loc", cell=cell)
        if s.written is None:
            wrong("the store never reached the SWA pool", "store")
            continue
        if s.log != (["join", "store"] if s.hook_set else ["store"]):
            wrong(f"the store log is {s.log}" + (", a pending deferred commit is joined once before the store"
                                                 if s.hook_set else ", the store alone"), "deferred commit")
        if len(s.written) != len(s.rows):
            wrong(f"{len(s.written)} locations for its {len(s.rows)} rows", "length")
            continue
        window = s.layout_active is not None
        if window:
            want = [s.history_rows + i for i in range(len(s.rows))]
            if not s.layout_active:
                wrong("the request window's active layout is not this forward's own", "window layout")
        else:
            want = [0 if b is None else physical_slot(w.slot_of(rows[b], verify_columns(case, case.seq_lens[b])[x]),
                                                      t.swa_map, P) for b, x in s.rows]
        top = s.workspace_rows if window else t.swa_slots
        for j, ((b, x), have, exp) in enumerate(zip(s.rows, s.written, want)):
            if not 0 <= have < top:
                wrong(f"row {j} writes {have}, outside the {'request window workspace' if window else 'SWA pool'}"
                      f" of {top} rows", "outside the pool")
            if have != exp:
                whose = "an idle row" if b is None else f"request {b}'s node {x}"
                wrong(f"{whose} is written at SWA slot {have}, its own is {exp}", "column")
        obs.classes.add(f"swa store: {s.run}")
    for run, why in t.absent_runs.items():
        obs.classes.add(f"swa store: {run} absent from this SGLang ({why})")
    sub_check_done(obs, sub)
