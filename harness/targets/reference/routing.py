"""The embedded model of SGLang's routers: dispatch by forward mode, the mask from the verify child."""

from __future__ import annotations

from harness.model.routing import ROUTERS, Child, Routing, verify_child


class RouterModel:
    """The embedded model of a router: dispatch by forward mode, mask from the verify child."""

    def __init__(self, router: str, spec_mode: str, children: dict[str, Child], context_len: int):
        self.router, self.spec_mode, self.children = router, spec_mode, children
        # The children here never need CPU sequence lengths; the Dots wrapper
        # always does, and two-batch overlap splits batches on the CPU lengths.
        self.needs_cpu_seq_lens = router in ("dots-swa", "tbo")
        if router == "hybrid":
            # the hybrid reports the model's context length itself
            self.max_context_len = context_len
        elif router == "dots-swa":
            self.max_context_len = None  # it has no such attribute
        else:
            self.max_context_len = children[ROUTERS[router][0]].max_context_len

    def serving(self, forward_mode: str) -> str:
        """Role of the child a forward of ``forward_mode`` (decode, extend, target_verify) runs on."""
        roles = ROUTERS[self.router]
        if self.router == "hybrid":
            if forward_mode == "decode":
                return "decode"
            if forward_mode == "target_verify":
                return "decode" if self.spec_mode == "decode" else "prefill"
            return "prefill"
        return roles[0]

    @property
    def verify_mask(self):
        return self.children[self.serving("target_verify")].verify_mask


def model_route(router: str, spec_mode: str, children: dict[str, Child], context_len: int) -> Routing:
    model = RouterModel(router, spec_mode, children, context_len)
    return Routing(router, spec_mode, model, model.verify_mask, model.max_context_len,
                   model.serving("target_verify"), model.needs_cpu_seq_lens,
                   # every wrapper resolves to the child that runs TARGET_VERIFY
                   verify_child(router, spec_mode))
