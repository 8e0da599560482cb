"""The step's loss and the decision to stop, agreed by every rank in one collective.

A stop request (a pause, a grow-back, `shardline train --stop-after-step`) reaches each
rank on its own: a Ray call lands on one rank a moment before the next. Were each rank to
stop when it alone saw the request, one would leave the loop after step N while another
went on into step N+1 and waited there forever for the first, which meanwhile waited in
its stop checkpoint for the second. So each rank votes as its step ends and the votes
travel in the all-reduce that already averages the step's loss: every rank then stops
after the same step, and saves if any rank was asked to, at no extra collective.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

# Asked as step N ends (N given), before the ranks agree: True stops after step N.
StopRequest = Callable[[int], bool]
SaveRequest = Callable[[], bool]


@dataclass
class StopVote:
    """This rank's requests, and what all ranks agreed (sticky once agreed)."""

    should_stop: StopRequest | None = None
    save_on_stop: SaveRequest | None = None
    stop: bool = False
    save: bool = False

    def own(self, step: int) -> tuple[float, float]:
        """This rank's vote as `step` ends: (stop, save), each 0 or 1."""
        stop = self.should_stop is not None and self.should_stop(step)
        save = stop and self.save_on_stop is not None and self.save_on_stop()
        return float(stop), float(save)


def agree(
    local_loss: torch.Tensor,
    vote: StopVote,
    step: int,
    *,
    loss_copies: int,
) -> float:
    """Sum `[loss, stop, save]` over the world; returns the mean loss and records the
    agreed stop and save in `vote`.

    `loss_copies` is how many ranks contribute the loss summed: the last
    pipeline stage's dp x tp ranks (tensor-parallel peers each hold the same value); ranks
    without the loss contribute 0.
    """
    stop, save = vote.own(step)
    values = torch.cat(
        [
            local_loss.detach().double().reshape(1),
            torch.tensor([stop, save], dtype=torch.float64).to(local_loss.device),
        ]
    )
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(values)
    loss, stops, saves = values.tolist()
    vote.stop = vote.stop or stops > 0
    vote.save = vote.save or saves > 0
    return loss / loss_copies
