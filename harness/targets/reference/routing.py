"""The embedded model of SGLang's routers, and of DFlash's verify-mask policy over them.

A model of the routers' code, not of the fact ``routing`` checks them against
(``vmfuzz.harness.model.routing.verify_child``): each router here is an object over
its children that, like SGLang's, dispatches a forward by its forward mode,
answers ``verify_mask`` and ``max_context_len`` its own way and derives
``needs_cpu_seq_lens`` from its children. What the router dispatches a
TARGET_VERIFY forward to is observed by running one, and so are the children a
cuda-graph set-up and a replay's verify-buffer fix-up reach; DFlash's policy is
a separate function that unwraps routers by their own rules.
"""

from __future__ import annotations

from vmfuzz.harness.model.layouts import TreeMaskMode, request_extents
from vmfuzz.harness.model.routing import (CAPTURE, CAUSAL_VERIFY_BACKENDS, FIXUP_GRAPH_BS, FIXUP_ROUTERS, FIXUP_SPEC, Child,
                                   Nest, ReplayView, Routing)


class _ChildBackend:
    """A child attention backend: the mask it allocated, the context it was sized for."""

    needs_cpu_seq_lens = False

    def __init__(self, child: Child, served: list[str], graphs: dict):
        self.role, self.verify_mask, self._served = child.role, child.verify_mask, served
        self.backend, self._graphs = child.backend, graphs
        if child.max_context_len is not None:  # linear-attention backends carry none
            self.max_context_len = child.max_context_len

    def forward(self, forward_mode: str) -> None:
        self._served.append(self.role)

    def fixup(self, spec_info, cuda_graph_bs) -> None:
        self._graphs["fixups"].append((self.role, spec_info, cuda_graph_bs))

    def init_graph(self, max_bs: int, max_num_tokens: int) -> None:
        self._graphs["graph_states"].append((self.role, max_bs, max_num_tokens))


class _Hybrid:
    """Prefill and decode children; ``speculative_attention_mode`` picks the verify one."""

    def __init__(self, kids: dict, spec_mode: str, context_len: int):
        self.prefill, self.decode = kids["prefill"], kids["decode"]
        self.verify_on_decode = spec_mode == "decode"
        self.max_context_len = context_len  # the model config's, not a child's
        self.needs_cpu_seq_lens = self.decode.needs_cpu_seq_lens or (
            not self.verify_on_decode and self.prefill.needs_cpu_seq_lens)

    def select(self, forward_mode: str):
        if forward_mode in ("decode", "idle"):
            return self.decode
        if forward_mode == "target_verify":
            return self.decode if self.verify_on_decode else self.prefill
        return self.prefill

    def forward(self, forward_mode: str) -> None:
        self.select(forward_mode).forward(forward_mode)

    def fixup(self, spec_info, cuda_graph_bs) -> None:
        self.select("target_verify").fixup(spec_info, cuda_graph_bs)

    def init_graph(self, max_bs: int, max_num_tokens: int) -> None:
        self.decode.init_graph(max_bs, max_num_tokens)
        if not self.verify_on_decode:  # verification on prefill captures that child too
            self.prefill.init_graph(max_bs, max_num_tokens)

    @property
    def verify_mask(self):
        return self.select("target_verify").verify_mask


class _Tbo:
    """A primary over the whole batch and overlap children that split eager prefill."""

    needs_cpu_seq_lens = True  # the attention-backend default: it does not say otherwise

    def __init__(self, kids: dict):
        self.primary, self.children = kids["primary"], [kids["tbo-child-0"], kids["tbo-child-1"]]

    def __getattr__(self, name):  # everything else is the primary's
        if name == "primary":
            raise AttributeError(name)
        return getattr(self.primary, name)

    def forward(self, forward_mode: str) -> None:
        self.primary.forward(forward_mode)  # a verify forward is one batch: no split

    def init_graph(self, max_bs: int, max_num_tokens: int) -> None:
        for backend in (self.primary, *self.children):
            backend.init_graph(max_bs, max_num_tokens)

    @property
    def verify_mask(self):
        return self.primary.verify_mask


class _HybridLinear:
    """Full-attention layers on one child, linear-attention layers on the other."""

    def __init__(self, kids: dict):
        self.full_attn_backend, self.linear_attn_backend = kids["full"], kids["linear"]
        self.max_context_len = getattr(self.full_attn_backend, "max_context_len", None)
        self.needs_cpu_seq_lens = (self.full_attn_backend.needs_cpu_seq_lens
                                   or self.linear_attn_backend.needs_cpu_seq_lens)

    def forward(self, forward_mode: str, full_attention_layer: bool = True) -> None:
        (self.full_attn_backend if full_attention_layer else self.linear_attn_backend).forward(forward_mode)

    def fixup(self, spec_info, cuda_graph_bs) -> None:
        for backend in (self.full_attn_backend, self.linear_attn_backend):
            backend.fixup(spec_info, cuda_graph_bs)

    def init_graph(self, max_bs: int, max_num_tokens: int) -> None:
        for backend in (self.full_attn_backend, self.linear_attn_backend):
            backend.init_graph(max_bs, max_num_tokens)

    @property
    def verify_mask(self):
        return self.full_attn_backend.verify_mask


class _DotsSwa:
    """Dots' wrapper around one backend; it keeps CPU sequence lengths and reports no context."""

    needs_cpu_seq_lens = True

    def __init__(self, kids: dict):
        self.backend = kids["wrapped"]

    def forward(self, forward_mode: str) -> None:
        self.backend.forward(forward_mode)

    def fixup(self, spec_info, cuda_graph_bs) -> None:
        self.backend.fixup(spec_info, cuda_graph_bs)

    def init_graph(self, max_bs: int, max_num_tokens: int) -> None:
        self.backend.init_graph(max_bs, max_num_tokens)

    @property
    def verify_mask(self):
        return self.backend.verify_mask


def dflash_policy_resolves(backend) -> tuple[str, bool]:
    """The backend DFlash's verify-mask policy names: it looks through a hybrid (its
    TARGET_VERIFY choice), a TBO wrapper (its primary), Dots' wrapper (what it wraps)
    and anything with a ``full_attn_backend``, at most four levels; a child is named
    by its role, anything it stops at by its class name.

    The fixed design: every wrapper resolves to the backend that runs TARGET_VERIFY
    (SGLang's own policy stops at Dots' wrapper: a known finding, ``known/``). It
    builds a custom mask unless the backend it lands on verifies causally."""
    for _ in range(4):
        if isinstance(backend, _Hybrid):
            backend = backend.select("target_verify")
        elif isinstance(backend, _Tbo):
            backend = backend.primary
        elif isinstance(backend, _DotsSwa):
            backend = backend.backend
        elif getattr(backend, "full_attn_backend", None) is not None:
            backend = backend.full_attn_backend
        else:
            break
    if isinstance(backend, _ChildBackend):
        return backend.role, backend.backend not in CAUSAL_VERIFY_BACKENDS
    return type(backend).__name__, True


def _build(router: str, spec_mode: str, kids: dict, context_len: int):
    if router == "hybrid":
        return _Hybrid(kids, spec_mode, context_len)
    if router == "tbo":
        return _Tbo(kids)
    if router == "hybrid-linear":
        return _HybridLinear(kids)
    if router == "dots-swa":
        return _DotsSwa(kids)
    raise ValueError(f"unknown router {router!r}")


def model_route(router: str, spec_mode: str, children: dict, context_len: int) -> Routing:
    """The router of kind ``router`` over ``children`` (routers themselves where a child is a
    ``Nest``): what it hands out, reports and dispatches to."""
    served: list[str] = []
    graphs: dict = {"fixups": [], "graph_states": []}
    backend = _build(router, spec_mode, _kids(spec_mode, children, context_len, served, graphs), context_len)
    backend.forward("target_verify")
    backend.init_graph(*CAPTURE)
    if router in FIXUP_ROUTERS:  # TBO has no fix-up of its own to hand on
        backend.fixup(FIXUP_SPEC, FIXUP_GRAPH_BS)
    return Routing(router, spec_mode, backend, backend.verify_mask, getattr(backend, "max_context_len", None),
                   served[0] if served else None, bool(backend.needs_cpu_seq_lens),
                   *dflash_policy_resolves(backend), tuple(served),
                   fixups=tuple(graphs["fixups"]) if router in FIXUP_ROUTERS else None,
                   graph_states=tuple(graphs["graph_states"]))


def model_tbo_replay(d: int, seq_lens) -> tuple[ReplayView, list]:
    """TBO setting up a TARGET_VERIFY replay: the parent's view, and each overlap child's
    (None: not asked). Like SGLang's, it splits the requests at half the batch's token
    count over the tokens per request, and asks no child with no requests."""
    bs = len(seq_lens)
    blocks = request_extents(TreeMaskMode.FULL_MASK, seq_lens, d)
    mask = list(range(10_000, 10_000 + (blocks[-1].stop if blocks else 0)))

    def view(lo: int, hi: int) -> ReplayView:
        cells = mask[blocks[lo].start:blocks[hi - 1].stop] if hi > lo else []
        toks = range(lo * d, hi * d)
        return ReplayView(hi - lo, [10 + b for b in range(lo, hi)], list(seq_lens[lo:hi]), list(seq_lens[lo:hi]),
                          sum(seq_lens[lo:hi]), [100 + t for t in toks], [500 + t for t in toks],
                          [1000 + t for t in toks], cells)

    split = (bs * d // d) // 2 if d else 0
    return view(0, bs), [view(lo, hi) if hi > lo else None for lo, hi in ((0, split), (split, bs))]


def _kids(spec_mode: str, children: dict, context_len: int, served: list, graphs: dict) -> dict:
    return {role: _build(child.router, spec_mode, _kids(spec_mode, child.children, context_len, served, graphs),
                         context_len)
            if isinstance(child, Nest) else _ChildBackend(child, served, graphs)
            for role, child in children.items()}
