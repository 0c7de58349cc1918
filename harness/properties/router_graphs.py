"""``routing`` around cuda graphs: a router's graph set-up and its replay fix-up reach the verify children.

Two router calls come before a TARGET_VERIFY cuda-graph replay reads a child's
buffers. At capture, ``init_cuda_graph_state(max_bs, max_num_tokens)`` sets up
(and, for a mask-reading child, allocates) each child's graph state. At replay,
after the draft, ``update_verify_buffers_to_fill_after_draft(spec_info,
cuda_graph_bs)`` recomputes what the plan stream prepared from the draft's
outputs before they were ready. Both must reach every child whose attention runs
in the verify forward (``vmfuzz.harness.model.routing.verify_leaves``: the one that
reads the handed-out mask, and a hybrid-linear router's linear child), with the
router's own arguments. A verify child with no graph state replays over buffers
never sized for the capture; one the fix-up misses (or gets with another batch
size) replays over the plan stream's stale mask and tree links; a fix-up sent to
a child that runs no verify recomputes buffers nothing reads.
"""

from __future__ import annotations

from vmfuzz.harness.model.routing import CAPTURE, FIXUP_GRAPH_BS, FIXUP_SPEC, graph_leaves, verify_leaves
from vmfuzz.harness.properties.kit import Observation, fail

NAME = "routing"


def check_graphs(obs: Observation, where, label: str, children: dict, r) -> None:
    """Judge what the router's cuda-graph set-up and replay fix-up reached (``r.graph_states``,
    ``r.fixups``; None: not observed) against the children that run TARGET_VERIFY."""
    runners = verify_leaves(r.router, r.spec_mode, children)
    if r.fixups is not None:
        _check_fixup(where, runners, r.fixups)
        obs.classes.add(f"{label}: replay fix-up -> {', '.join(runners)}")
    if r.graph_states is not None:
        _check_graph_state(where, runners, r.graph_states)
        _check_graph_state_reach(where, graph_leaves(r.router, r.spec_mode, children), r.graph_states)
        obs.classes.add(f"{label}: cuda-graph state -> {', '.join(runners)}")


def _origin(where, leaf: str) -> dict:
    # both calls are on the cuda-graph path, seen before the replay they prepare
    return {**where.origin, "role": leaf, "stage": "replay", "effect": "wrong", "writer": "router"}


def _check_fixup(where, runners: tuple[str, ...], fixups: tuple) -> None:
    reached = [leaf for leaf, _, _ in fixups]
    said = ", ".join(reached) or "no child"
    for leaf in runners:
        if reached.count(leaf) != 1:
            fail(NAME, f"{where}: a cuda-graph replay's verify-buffer fix-up reaches {said}, but the {leaf} "
                        f"child runs TARGET_VERIFY and must get it once: "
                        + ("its captured buffers replay what the plan stream prepared before the draft "
                           "was done" if leaf not in reached else "it is recomputed more than once"),
                 buffer="verify buffers", cell="replay fix-up", **_origin(where, leaf))
    for leaf, spec_info, bs in fixups:
        if leaf not in runners:
            fail(NAME, f"{where}: a cuda-graph replay's verify-buffer fix-up reaches the {leaf} child, "
                        f"which runs no TARGET_VERIFY (that is {', '.join(runners)})",
                 buffer="verify buffers", cell="replay fix-up", **_origin(where, leaf))
        if spec_info is not FIXUP_SPEC or bs != FIXUP_GRAPH_BS:
            fail(NAME, f"{where}: the router is handed {FIXUP_SPEC!r} and cuda_graph_bs {FIXUP_GRAPH_BS} to "
                        f"fix a replay's verify buffers up, but hands the {leaf} child {spec_info!r} and "
                        f"cuda_graph_bs {bs!r}: it fixes another graph's buffers, or none",
                 buffer="spec_info" if spec_info is not FIXUP_SPEC else "cuda_graph_bs", cell="replay fix-up",
                 **_origin(where, leaf))


def _check_graph_state(where, runners: tuple[str, ...], states: tuple) -> None:
    reached = {leaf for leaf, _, _ in states}
    for leaf in runners:
        if leaf not in reached:
            fail(NAME, f"{where}: the router's cuda-graph set-up (max_bs {CAPTURE[0]}, max_num_tokens "
                        f"{CAPTURE[1]}) reaches {', '.join(sorted(reached)) or 'no child'}, not the "
                        f"{leaf} child, which runs TARGET_VERIFY in the captured graph: its graph state (and "
                        "any mask it reads) is never set up",
                 buffer="cuda-graph state", cell="graph set-up", **_origin(where, leaf))
    for leaf, max_bs, max_num_tokens in states:
        if leaf in runners and (max_bs, max_num_tokens) != CAPTURE:
            fail(NAME, f"{where}: the router's cuda-graph set-up is handed max_bs {CAPTURE[0]} and "
                        f"max_num_tokens {CAPTURE[1]}, but sets the {leaf} child, which runs TARGET_VERIFY, "
                        f"up with {max_bs} and {max_num_tokens}: the captured verify outgrows its buffers",
                 buffer="cuda-graph state", cell="graph set-up", **_origin(where, leaf))


def _check_graph_state_reach(where, graph_runners: tuple[str, ...], states: tuple) -> None:
    """A child that runs in no captured graph (neither decode nor TARGET_VERIFY) gets no graph state:
    set up, it preallocates its graph buffers (a verify mask for the captured max batch among them,
    when it reads one) for graphs that never replay it."""
    for leaf in dict.fromkeys(leaf for leaf, _, _ in states):
        if leaf not in graph_runners:
            fail(NAME, f"{where}: the router's cuda-graph set-up reaches the {leaf} child, which runs in "
                        f"no captured graph (those are {', '.join(graph_runners)}): its graph buffers, a "
                        "verify mask sized for the captured max batch among them, are allocated for graphs "
                        "that never replay it",
                 buffer="cuda-graph state", cell="graph set-up", **_origin(where, leaf))
