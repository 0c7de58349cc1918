"""The deployment file: a server deployment as an operator describes it.

``cuda_graph_max_bs`` is the captured max_bs the verify mask is sized for;
``max_running_requests`` bounds how large an eager batch can get; ``seq_lens``
are lengths observed in one step (optional). A deployment file is what a person
hands ``vmfuzz run --deployment`` or ``vmfuzz minimize``.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from vmfuzz.harness.model.config import Batch, Config, ConfigError
from vmfuzz.harness.model.layouts import TreeMaskMode


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
    #: ``--attention-backend``; the per-phase ones override it ("" = not stated)
    attention_backend: str = ""
    prefill_attention_backend: str = ""
    decode_attention_backend: str = ""
    #: ``--speculative-attention-mode``: which phase's backend runs TARGET_VERIFY
    speculative_attention_mode: str = "prefill"
    #: pipeline-parallel stages (> 1: every stage rebuilds the verify input)
    pp_size: int = 1

    def backends(self) -> tuple[str, str]:
        """(prefill, decode) backend names as SGLang resolves them ("" when not stated)."""
        return (self.prefill_attention_backend or self.attention_backend,
                self.decode_attention_backend or self.attention_backend)

    def verify_backend(self) -> str:
        prefill, decode = self.backends()
        return decode if self.speculative_attention_mode == "decode" else prefill

    def numbers(self):
        from vmfuzz.harness.model.allocation import ServerNumbers
        return ServerNumbers(self.cuda_graph_max_bs, self.context_length, self.num_draft_tokens, self.topk,
                             self.spec_steps)

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


class DeploymentPlan(msgspec.Struct, frozen=True):
    """A deployment as a run consumes it: the file as read, and the configs it makes, built once
    where the file is read, so the search takes typed values and never rebuilds them."""
    file: Deployment
    config: Config
    #: the same server's no-draft verify path (d = 1)
    trivial_config: Config


def load_plan(path: str | Path) -> DeploymentPlan:
    """``load``, with the configs built: what ``run --deployment`` carries in its plan."""
    dep = load(path)
    return DeploymentPlan(dep, dep.config(), dep.trivial_config())


def load(path: str | Path) -> Deployment:
    from vmfuzz.harness.model.validate import load_file
    return load_file(path, "deployment file", loads, DeploymentError)


def loads(data: bytes, path: str | Path = "<deployment>") -> Deployment:
    from vmfuzz.harness.model import limits
    from vmfuzz.harness.model.validate import LimitError, check_config, repeated_key
    key = repeated_key(data)
    if key is not None:
        raise DeploymentError(f"{path}: invalid deployment: key {key!r} appears more than once in one object")
    try:
        dep = msgspec.json.decode(data, type=Deployment)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise DeploymentError(f"{path}: invalid deployment: {exc}") from None
    if dep.max_running_requests < 1:
        raise DeploymentError(f"{path}: max_running_requests must be >= 1")
    try:
        for field, value, cap, name in (
                ("max_running_requests", dep.max_running_requests, limits.MAX_REQUESTS, "MAX_REQUESTS"),
                ("len(seq_lens)", len(dep.seq_lens), limits.MAX_REQUESTS_PER_STEP, "MAX_REQUESTS_PER_STEP")):
            if value > cap:
                raise LimitError(f"{field} = {value} is over {name} ({cap}, harness/model/limits.py)")
        check_config(Config(TreeMaskMode.parse(dep.layout), dep.cuda_graph_max_bs, dep.context_length,
                            dep.num_draft_tokens, dep.topk, dep.spec_steps, dep.is_read), DEPLOYMENT_FIELDS)
        _check_serving_fields(dep, path)
        dep.config()
    except (LimitError, ValueError) as exc:
        raise DeploymentError(f"{path}: {exc}") from None
    return dep


#: how check_config names a deployment's fields in its messages
DEPLOYMENT_FIELDS = {"max_bs": "cuda_graph_max_bs", "max_context_len": "context_length",
                     "num_draft_tokens": "num_draft_tokens", "topk": "topk", "spec_steps": "spec_steps"}


def is_deployment(path_or_data: str | Path | bytes) -> bool:
    """A repro file names a property; a deployment file names a cuda-graph max bs."""
    data = path_or_data
    if not isinstance(data, bytes):
        try:
            data = Path(data).read_bytes()
        except OSError:
            return False
    try:
        # Top-level keys only: a deeply nested value is never walked here.
        keys = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return "cuda_graph_max_bs" in keys


def _check_serving_fields(dep: Deployment, path: Path) -> None:
    from vmfuzz.harness.model.allocation import SERVER_BACKENDS
    from vmfuzz.harness.model.routing import SPEC_MODES

    for field in ("attention_backend", "prefill_attention_backend", "decode_attention_backend"):
        value = getattr(dep, field)
        if value and value not in SERVER_BACKENDS:
            raise DeploymentError(f"{path}: {field} {value!r} is not an SGLang attention backend "
                                  f"(known: {', '.join(SERVER_BACKENDS)})")
    if dep.speculative_attention_mode not in SPEC_MODES:
        raise DeploymentError(f"{path}: speculative_attention_mode must be one of {', '.join(SPEC_MODES)}, "
                              f"got {dep.speculative_attention_mode!r}")
    if dep.pp_size < 1:
        raise DeploymentError(f"{path}: pp_size must be >= 1, got {dep.pp_size}")
