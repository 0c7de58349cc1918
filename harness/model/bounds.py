"""The size ceiling of generated cases: what a search may draw, per target and profile."""

from __future__ import annotations

from dataclasses import dataclass

from vmfuzz.harness.model.config import CALL_SITES


@dataclass(frozen=True)
class Bounds:
    """Size ceiling of generated cases: keeps one example in the millisecond range."""

    max_bs: int = 8
    max_context_len: int = 64
    num_draft_tokens: int = 8
    topk: int = 4
    spec_steps: int = 4
    overshoot: int = 8
    #: the call sites cases are drawn through (a target without one of SGLang's narrows it)
    call_sites: tuple[str, ...] = CALL_SITES
