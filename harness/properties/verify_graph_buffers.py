"""graph-buffer-soundness on the target verify runner: its static buffers, as its own set-up sized them.

SGLang's ``DecodeCudaGraphRunner.__init__`` picks the buckets it captures and
sizes its static buffers from the largest of them (``max_bs``) and the tokens
it captures per request. Every bucket B it captures is replayed with B
requests of ``d`` draft tokens each (``d`` = the server's
``speculative_num_draft_tokens``, from the meaning, never from the runner), so
each per-request buffer needs B rows and each per-token buffer ``B·d``. The
runner is built with its capture held back and judged on what ``__init__``
decided (``Sizing``), before any graph runs: a buffer too short for a bucket
would make the capture itself raise on a shape, which is no finding. What
writes past a buffer at capture or replay is the three replay properties'
(their redzone checks), on a captured build of the same runner.

A runner vmfuzz assembled by hand (a release whose ``__init__`` it cannot
drive) has the harness's sizing: not judged, said as a sub-check not driven.
"""

from __future__ import annotations

from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.config import Config
from vmfuzz.harness.properties.graph_shared import built, read_layout
from vmfuzz.harness.properties.kit import Observation, allocated, fail, sub_check_done, sub_check_skipped

BUFFERS = "graph-buffer-soundness"
#: the sub-check a target verify runner's sizing is judged under
VERIFY = "target verify"
#: the runner's static buffers a verify replay of B requests fills, the axis their rows count
#: (-1: the last axis, where a buffer keeps its rows there), and what a row is
ROWS = {"req_pool_indices": (0, "requests"), "seq_lens": (0, "requests"), "seq_lens_cpu": (0, "requests"),
        "input_ids": (0, "tokens"), "positions": (0, "tokens"), "out_cache_loc": (0, "tokens"),
        "input_embeds": (0, "tokens"), "mrope_positions": (-1, "tokens"),
        "next_token_logits_buffer": (0, "tokens"),
        "pp_proxy_tensors.hidden_states": (0, "tokens"), "pp_proxy_tensors.residual": (0, "tokens")}


def needed(config: Config, bs: int) -> dict[str, int]:
    """Rows a replay of ``bs`` requests needs, per kind of row (the meaning: d tokens a request)."""
    return {"requests": bs, "tokens": bs * config.d}


def judge_verify_buffers(target, config: Config, obs: Observation) -> None:
    """Each static buffer of the target verify runner holds what its largest captured bucket needs."""
    make = getattr(target, "graph_session", None)
    if make is None:
        sub_check_skipped(obs, VERIFY, "the target has no target verify graph seam (graph_session)")
        return
    config = read_layout(config)
    heap = ShadowHeap()
    mask = allocated(BUFFERS, target, config, heap)
    server = built(("target verify, set up", config), lambda: make(config, mask, heap, capture=False)).server
    if server.init_not_driven:
        sub_check_skipped(obs, VERIFY, f"the runner was assembled by vmfuzz, its sizing not SGLang's: "
                                       f"{server.init_not_driven}")
        return
    sizing = server.sizing
    B = max(sizing.capture_bs)
    want = needed(config, B)
    judged = 0
    for name, (axis, kind) in ROWS.items():
        shape = sizing.buffers.get(name)
        if not shape:
            continue
        judged += 1
        have = shape[axis]
        if have < want[kind]:
            fail(BUFFERS, f"target verify graphs: {name} holds {have} {kind} (shape {shape}); the graph "
                          f"captured at bs {B} replays {B} requests of {config.d} draft tokens, {want[kind]} "
                          f"{kind} (the runner's set-up: max_bs {sizing.max_bs}, {sizing.captured_req_width} "
                          f"tokens a request, max_num_token {sizing.max_num_token})",
                 effect="overrun", writer="cuda-graph replay", buffer=name, side="above", cell=kind,
                 stage="arithmetic")
    obs.classes.add(f"target verify: {judged} static buffers judged at bs {B}")
    sub_check_done(obs, VERIFY)
