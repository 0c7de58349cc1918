"""What one verify step produces, in the shape every target returns it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.shadow import Violation


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
