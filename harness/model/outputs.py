"""What one verify step produces, in the shape every target returns it."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import torch


class Violation(msgspec.Struct, frozen=True):
    """Cells written outside a buffer, as offsets relative to the buffer's first cell."""

    buffer: str
    side: str  # "front", "back", or "beyond" (past the redzone as well)
    start: int
    stop: int
    cells: int
    numel: int
    request: int | None = None
    #: the request of the last escaped cell: with ``request``, which requests' cells escaped (a
    #: request's block is contiguous, so the first and last name every class in between)
    last_request: int | None = None

    def describe(self) -> str:
        who = "" if self.request is None else f", request {self.request}" if self.last_request in (
            None, self.request) else f", requests {self.request} to {self.last_request}"
        return (f"{self.buffer}: {self.cells} cell(s) written at offsets [{self.start}, {self.stop}) "
                f"outside its {self.numel} cells ({self.side} redzone{who})")


@dataclass
class StepOutput:
    """The verify input a target built for one batch.

    ``tree_mask`` is the whole buffer the kernel wrote: for a reused buffer that
    is the max_bs allocation, of which only the batch's logical region matters.
    """

    tree_mask: torch.Tensor
    positions: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    reused: bool
    violations: list[Violation] = field(default_factory=list)
    #: the verify input's tokens, node by node (each request's verified token, then its
    #: selected draft tokens in tree order); None: the target does not report them
    draft_token: torch.Tensor | None = None

    def as_cpu(self) -> "StepOutput":
        """Snapshot to host memory: a reused buffer is overwritten by the next step."""
        return StepOutput(
            self.tree_mask.detach().to("cpu", copy=True),
            self.positions.detach().to("cpu", copy=True),
            self.retrieve_index.detach().to("cpu", copy=True),
            self.retrieve_next_token.detach().to("cpu", copy=True),
            self.retrieve_next_sibling.detach().to("cpu", copy=True),
            self.reused,
            list(self.violations),
            None if self.draft_token is None else self.draft_token.detach().to("cpu", copy=True),
        )


@dataclass
class Expected:
    """The oracle's answer: ``compared`` marks the tree_mask cells with a defined value."""

    tree_mask: torch.Tensor
    compared: torch.Tensor
    positions: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    #: (bs * d,): node x of request b carries its verified token (x = 0) or its selected candidate's
    draft_token: torch.Tensor | None = None
