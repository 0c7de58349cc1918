"""Routers: attention backends that hand one child's verify mask to the call sites.

A server whose attention is split across backends builds a router over them
(docs/architecture.md, the mask's path): ``HybridAttnBackend`` over a prefill and a decode
child, ``TboAttnBackend`` over a primary and two overlap children,
``HybridLinearAttnBackend`` over a full-attention and a linear-attention child,
and Dots' ``DotsSWAMLAAttnBackend`` around one FlashAttention backend.
The call site asks the router for ``verify_mask`` and, when it must size a
FULL_MASK fallback without the batch's exact length sum, for
``max_context_len``. The scheduler drops that sum only for a backend that says
it does not need CPU sequence lengths (``needs_cpu_seq_lens`` False), so a
router that keeps them needs to report no context. Two things must hold: the mask handed out is the one of the
child that runs TARGET_VERIFY (the one that reads it), and the context the
router reports covers every request the server admits (#32690 added the
missing report).

This module is the meaning (which child serves TARGET_VERIFY) and the embedded
model of a router; the ``sglang`` target builds SGLang's real classes instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Router kind -> the roles of its children, in the order the router takes them.
ROUTERS: dict[str, tuple[str, ...]] = {
    "hybrid": ("prefill", "decode"),
    "tbo": ("primary", "tbo-child-0", "tbo-child-1"),
    "hybrid-linear": ("full", "linear"),
    "dots-swa": ("wrapped",),
}

#: ``--speculative-attention-mode``: which of a hybrid's children runs verification.
SPEC_MODES: tuple[str, ...] = ("prefill", "decode")


def verify_child(router: str, spec_mode: str) -> str:
    """The role of the child that runs TARGET_VERIFY attention, as the routers of SGLang 0.5.23 choose it."""
    if router not in ROUTERS:
        raise ValueError(f"unknown router {router!r} (known: {', '.join(ROUTERS)})")
    if spec_mode not in SPEC_MODES:
        raise ValueError(f"speculative_attention_mode must be one of {', '.join(SPEC_MODES)}, got {spec_mode!r}")
    if router == "hybrid":
        return "decode" if spec_mode == "decode" else "prefill"
    if router == "tbo":
        return "primary"  # the overlap children only split eager prefill
    if router == "dots-swa":
        return "wrapped"
    return "full"  # linear-attention layers read no tree mask


def verify_runners(router: str, spec_mode: str) -> tuple[str, ...]:
    """The roles of every child whose attention runs in a TARGET_VERIFY forward: the verify
    child, and a hybrid-linear router's linear child too (its layers run in the same forward,
    reading the tree links it keeps itself, not the mask). Each must get the cuda-graph
    replay's fix-up of its verify buffers, and its cuda-graph state at capture."""
    role = verify_child(router, spec_mode)
    return (role, "linear") if router == "hybrid-linear" else (role,)


def verify_leaves(router: str, spec_mode: str, children: dict) -> tuple[str, ...]:
    """``verify_runners`` down to the leaves (qualified roles) under a router over ``children``."""
    out: list[str] = []
    for role in verify_runners(router, spec_mode):
        child = children[role]
        out.extend(verify_leaves(child.router, spec_mode, child.children) if isinstance(child, Nest)
                   else (child.role,))
    return tuple(out)



def graph_runners(router: str, spec_mode: str) -> tuple[str, ...]:
    """The roles of every child whose attention runs in some captured cuda graph: the decode
    graphs and the TARGET_VERIFY ones. Only these may get cuda-graph state at capture: the state
    of a mask-reading child includes a verify mask preallocated for the captured max batch, so
    one set up for graphs it never replays holds that buffer for nothing. A hybrid's prefill
    child runs in a graph only when it runs verification; TBO's overlap children may be split
    into the decode graphs, and both of a hybrid-linear router's children run in every forward."""
    if router == "hybrid":
        return ("decode", "prefill") if spec_mode == "prefill" else ("decode",)
    verify_child(router, spec_mode)  # validates the router and the mode
    return ROUTERS[router]


def graph_leaves(router: str, spec_mode: str, children: dict) -> tuple[str, ...]:
    """``graph_runners`` down to the leaves (qualified roles) under a router over ``children``."""
    out: list[str] = []
    for role in graph_runners(router, spec_mode):
        child = children[role]
        out.extend(graph_leaves(child.router, spec_mode, child.children) if isinstance(child, Nest)
                   else (child.role,))
    return tuple(out)

#: Routers that hand a cuda-graph replay's verify-buffer fix-up (after the draft, on the plan
#: stream) on to their children. TBO keeps the attention-backend base's, which raises
#: NotImplementedError: a plan-stream server over TBO stops loudly rather than replay stale buffers.
FIXUP_ROUTERS: tuple[str, ...] = ("hybrid", "hybrid-linear", "dots-swa")

#: What a router is handed to fix a replay's verify buffers up (``cuda_graph_bs``), and to set up
#: its cuda-graph state (``max_bs``, ``max_num_tokens``): distinct numbers, so a swapped or
#: dropped argument shows in what the children record.
FIXUP_GRAPH_BS = 5
CAPTURE = (6, 24)


class _FixupSpec:
    def __repr__(self) -> str:
        return "the spec_info handed to the router"


#: The ``spec_info`` handed to a router's fix-up: each child must be handed this very object.
FIXUP_SPEC = _FixupSpec()


@dataclass
class Child:
    """One backend under a router: the mask it allocated and the context it was sized for.

    ``max_context_len=None``: the child has no such attribute (SGLang's linear
    attention backends do not).
    """

    role: str
    verify_mask: Any
    max_context_len: int | None
    #: the attention backend the child stands for (its class name); None: a generic one
    backend: str | None = None


#: Attention backends whose own verify path runs DFlash's verify (one causal block
#: over a request's draft) without a custom mask. DFlash's policy must say "no
#: custom mask" exactly for these; any other backend reads the draft's visibility
#: only from the custom mask, so without one it attends past what the draft allows.
CAUSAL_VERIFY_BACKENDS = frozenset({"TritonAttnBackend", "FlashInferAttnBackend", "FlashAttentionBackend"})


def dflash_needs_custom_mask(backend: str | None) -> bool:
    """Whether DFlash's verify on ``backend`` (None: a generic backend) needs a custom mask."""
    return backend not in CAUSAL_VERIFY_BACKENDS


@dataclass
class Nest:
    """A router standing where a child would: ``router`` over ``children``, itself a child of another.

    Leaf roles are qualified by the path down to them (``primary/prefill``) so a
    nested router's leaves are told apart by name.
    """

    role: str
    router: str
    children: dict


#: Routers over routers, as (outer, inner): the outer router's children are each an
#: inner router (a linear-attention child stays a leaf). SGLang 0.5.23 builds TBO
#: over whatever one backend creator returns (a hybrid, or a model wrapper around
#: one) and wraps a hybrid in a model wrapper; nothing in the routers' code stops a
#: hybrid from taking a hybrid as a child, so that nesting is checked too.
NESTINGS: tuple[tuple[str, str], ...] = (
    ("tbo", "hybrid"), ("tbo", "hybrid-linear"), ("tbo", "dots-swa"),
    ("hybrid-linear", "hybrid"), ("dots-swa", "hybrid"), ("hybrid", "hybrid"),
)


def nested_children(outer: str, inner: str, leaf) -> dict:
    """The outer router's children, each an inner router over leaves ``leaf(qualified_role, slot)``.

    Slots number the leaves in order, so within one nesting every leaf's mask differs.
    """
    out, slot = {}, 0
    for role in ROUTERS[outer]:
        if role == "linear":
            out[role] = leaf(role, slot)
            slot += 1
            continue
        kids = {}
        for sub in ROUTERS[inner]:
            kids[sub] = leaf(f"{role}/{sub}", slot)
            slot += 1
        out[role] = Nest(role, inner, kids)
    return out


def nested_verify_leaf(outer: str, inner: str, spec_mode: str) -> str:
    """The qualified role of the leaf that runs TARGET_VERIFY: the verify child of the verify child."""
    role = verify_child(outer, spec_mode)
    return role if role == "linear" else f"{role}/{verify_child(inner, spec_mode)}"


def leaves(children: dict) -> dict:
    """Every leaf ``Child`` under ``children``, by qualified role."""
    out = {}
    for child in children.values():
        if isinstance(child, Nest):
            out.update(leaves(child.children))
        else:
            out[child.role] = child
    return out


@dataclass
class Routing:
    """What a router answers, and the object a call site gets as its attention backend."""

    router: str
    spec_mode: str
    #: handed to the call site as ``model_runner.attn_backend``
    backend: Any
    verify_mask: Any
    max_context_len: Any
    #: role of the child the router dispatched a TARGET_VERIFY forward to; None: not observed,
    #: or no child was asked (``verify_served`` tells the two apart)
    serves_verify: str | None
    #: True: the scheduler always hands the call site the batch's exact length
    #: sum, so ``max_context_len`` is never read
    needs_cpu_seq_lens: bool = False
    #: role of the child DFlash's verify-mask policy resolves the router to (the
    #: backend whose name decides whether a custom mask is built); the router's own
    #: class name when it stops at the router; None: not observed
    dflash_resolves: str | None = None
    #: whether DFlash's policy builds a custom mask for the backend it resolves to; None: not observed
    dflash_custom_mask: bool | None = None
    #: every leaf a TARGET_VERIFY forward reached, in order; None: not observed
    verify_served: tuple[str, ...] | None = None
    #: (leaf, spec_info, cuda_graph_bs) for every leaf a replay's verify-buffer fix-up reached, in
    #: order (handed ``FIXUP_SPEC`` and ``FIXUP_GRAPH_BS``); None: not observed
    fixups: tuple | None = None
    #: (leaf, max_bs, max_num_tokens) for every leaf the router's cuda-graph set-up reached (handed
    #: ``CAPTURE``); None: not observed
    graph_states: tuple | None = None


def tbo_verify_split(bs: int) -> int:
    """How many of a TARGET_VERIFY batch's requests TBO's first overlap child takes at replay.

    Every request of a verify batch carries the same number of draft tokens, so
    the balanced split halves the requests: the first ``bs // 2`` to child 0
    (none for one request), the rest to child 1, in batch order.
    """
    return bs // 2


@dataclass
class ReplayView:
    """What one backend is handed to set up a cuda-graph replay: the per-request
    fields (one entry per request) and the per-token ones (``d`` per request)."""

    batch_size: int
    req_pool_indices: list
    seq_lens: list
    seq_lens_cpu: list
    seq_lens_sum: int | None
    input_ids: list
    out_cache_loc: list
    #: the draft tokens and the FULL_MASK custom mask of the view's own split of the verify input
    draft_token: list
    custom_mask: list



def check_args(router: str, spec_mode: str, children: dict[str, Child]) -> None:
    """Both targets refuse a router built over the wrong children, in one clear line."""
    verify_child(router, spec_mode)
    want = set(ROUTERS[router])
    if set(children) != want:
        raise ValueError(f"router {router} takes children {sorted(want)}, got {sorted(children)}")
    for child in children.values():
        if isinstance(child, Nest):
            check_args(child.router, spec_mode, child.children)
