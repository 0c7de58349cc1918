"""A server deployment as an operator describes it, and the search confined to it.

``cuda_graph_max_bs`` is the captured max_bs the verify mask is sized for;
``max_running_requests`` bounds how large an eager batch can get; ``seq_lens``
are lengths observed in one step (optional). A deployment file is what a person
hands ``vmfuzz run --deployment`` or ``vmfuzz minimize``.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from hypothesis import strategies as st

from harness.config import Batch, Config, ConfigError
from harness.layouts import TreeMaskMode


class DeploymentError(Exception):
    """An unreadable or inconsistent deployment file: exit 2."""


class Deployment(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    cuda_graph_max_bs: int
    max_running_requests: int
    context_length: int
    num_draft_tokens: int
    topk: int
    spec_steps: int
    layout: str = "FULL_MASK"
    is_read: bool = True
    seq_lens: list[int] = []
    name: str = ""

    def config(self) -> Config:
        try:
            return Config(TreeMaskMode.parse(self.layout), self.cuda_graph_max_bs, self.context_length,
                          self.num_draft_tokens, self.topk, self.spec_steps, self.is_read).validate()
        except (ConfigError, ValueError) as exc:
            raise DeploymentError(f"deployment: {exc}") from None

    def trivial_config(self) -> Config:
        """The same server's no-draft verify path (d = 1)."""
        c = self.config()
        return Config(c.mode, c.max_bs, c.max_context_len, 1, 1, 0, c.is_read)

    def observed(self) -> Batch:
        if not self.seq_lens:
            raise DeploymentError("deployment: seq_lens is empty (minimize needs the observed batch)")
        try:
            return Batch(tuple(self.seq_lens)).validate(self.config())
        except ConfigError as exc:
            raise DeploymentError(f"deployment: seq_lens: {exc}") from None

    def label(self) -> str:
        return self.name or (f"{self.layout} cuda-graph max bs {self.cuda_graph_max_bs}, "
                             f"{self.max_running_requests} running requests, context {self.context_length}")


def load(path: str | Path) -> Deployment:
    path = Path(path)
    try:
        dep = msgspec.json.decode(path.read_bytes(), type=Deployment)
    except OSError as exc:
        raise DeploymentError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise DeploymentError(f"{path}: invalid deployment: {exc}") from None
    if dep.max_running_requests < 1:
        raise DeploymentError(f"{path}: max_running_requests must be >= 1")
    dep.config()
    return dep


def is_deployment(path: str | Path) -> bool:
    """A repro file names a property; a deployment file names a cuda-graph max bs."""
    try:
        data = msgspec.json.decode(Path(path).read_bytes())
    except (OSError, msgspec.DecodeError):
        return False
    return isinstance(data, dict) and "cuda_graph_max_bs" in data


def case_strategy(dep: Deployment, *, trivial: bool, steps: bool):
    """Cases this one server can produce: its config, batches of 1..max_running_requests."""
    from strategies import batches

    config = dep.trivial_config() if trivial else dep.config()
    r, m = dep.max_running_requests, config.max_bs
    # The boundary sizes first, so even a short search reaches an eager batch.
    edges = sorted({x for x in (1, m, m + 1, r) if 1 <= x <= r})
    sizes = st.one_of(st.sampled_from(edges), st.integers(1, r))
    one = sizes.flatmap(lambda n: batches(config, bs=n))
    seqs = st.lists(one, min_size=2, max_size=4) if steps else one.map(lambda b: [b])
    return seqs.map(lambda bs: (config, bs))


def capacity_verdict(target, dep: Deployment) -> tuple[bool, str]:
    """Exhaustive over every batch size the server can schedule: can a batch that
    ``fits`` need more cells than the buffer has? Arithmetic only, so it is exact."""
    from harness.layouts import worst_case_size

    config = dep.config()
    mask = target.allocate(config, None)
    cap = mask.buffer.numel()
    for bs in range(1, dep.max_running_requests + 1):
        if target.fits(mask, bs):
            worst = worst_case_size(mask.mode, bs, config.d, config.max_context_len)
            if worst > cap:
                return True, (f"a batch of {bs} requests reuses the {cap}-cell buffer but can need "
                              f"{worst} cells ({worst - cap} past its end)")
    return False, (f"every batch of 1..{dep.max_running_requests} requests that reuses the "
                   f"{cap}-cell buffer fits it at full context")
