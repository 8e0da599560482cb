"""The step's loss and the decision to stop, agreed by every rank in one collective, on
the steps that need it; between them the vote adds no collective and no host read.

A stop request (a pause, a grow-back) reaches each rank on its own: a Ray call lands on
one rank a moment before the next. Were each rank to stop when it alone saw the request,
one would leave the loop after step N while another went on into step N+1 and waited
there forever for the first, which meanwhile waited in its stop checkpoint for the second.
So the ranks vote, and every rank stops after the same step, and saves if any rank was
asked to.

A vote is a collective and a host read, which a plain PyTorch loop does not pay every
step. So the ranks vote only where they must agree anyway: a logged step (its loss is
averaged over the world), a step that saves (no checkpoint may hold a state trained past a
non-finite loss), a known stop step (`shardline train --stop-after-step`), and otherwise
every `every` steps, so that a stop comes within about `STOP_WITHIN_S`. Rank 0 proposes
`every` from the time its steps took since the last vote; the proposal travels in the
vote, so every rank applies the same one (steps that slow down after a fast stretch can
hold a stop for up to `MAX_EVERY` of them). Between votes each rank keeps the first step
whose loss was not finite on the device (a few scalar ops, no sync); the vote finds it on
any rank.

What else a step reads back or reduces is the layout's, not the vote's: clipping's norm
is read on the host every step, and all-reduced over the world where gradients are
sharded (FSDP, tensor or pipeline parallel); fp16's loss scaler agrees its overflow flag.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from shardline.workers.engine.nonfinite import NonFiniteLoss

# Asked as a voting step N ends (N given), before the ranks agree: True stops after step N.
# Only voting steps ask, so a request must stay true once made (a flag, `step >= N`).
StopRequest = Callable[[int], bool]
SaveRequest = Callable[[], bool]

# A stop request is acted on within about this long (one vote interval of steps).
STOP_WITHIN_S = 0.5
MAX_EVERY = 100  # steps between votes at most, however fast a step


@dataclass
class StopVote:
    """This rank's requests, and what all ranks agreed (sticky once agreed).
    `stop_after`: a step every rank knows to stop after, with a checkpoint."""

    should_stop: StopRequest | None = None
    save_on_stop: SaveRequest | None = None
    stop_after: int | None = None
    stop: bool = False
    save: bool = False

    def ask(
        self,
        should_stop: StopRequest | None,
        save_on_stop: SaveRequest | None,
        stop_after: int | None,
    ) -> None:
        """A run starts: who asks this rank to stop, nothing agreed yet."""
        self.should_stop, self.save_on_stop, self.stop_after = should_stop, save_on_stop, stop_after
        self.stop = self.save = False

    def own(self, step: int) -> tuple[float, float]:
        """This rank's vote as `step` ends: (stop, save), each 0 or 1."""
        if self.stop_after is not None and step >= self.stop_after:
            return 1.0, 1.0
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
    agreed stop and save in `vote` (an async round's meeting: no ledger between).

    `loss_copies` is how many ranks contribute the loss summed: the last
    pipeline stage's dp x tp ranks (tensor-parallel peers each hold the same value); ranks
    without the loss contribute 0.
    """
    loss, _ = _sum_votes(local_loss, vote, step, [])
    return loss / loss_copies


def _sum_votes(
    local_loss: torch.Tensor, vote: StopVote, step: int, more: list[torch.Tensor]
) -> tuple[float, list[float]]:
    """One all-reduce (sum) of `[loss, stop, save, *more]`; records the agreed stop and
    save in `vote` and returns (the loss's sum, the sums of more)."""
    stop, save = vote.own(step)
    device = local_loss.device
    values = torch.cat(
        [
            local_loss.detach().double().reshape(1),
            torch.tensor([stop, save], dtype=torch.float64, device=device),
            *(t.double().reshape(1) for t in more),
        ]
    )
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(values)
    loss, stops, saves, *rest = values.tolist()
    vote.stop = vote.stop or stops > 0
    vote.save = vote.save or saves > 0
    return loss, rest


class StepLedger:
    """What a rank keeps on the device between votes, and when the next vote is."""

    def __init__(self, device: torch.device, vote: StopVote, *, loss_copies: int) -> None:
        self.vote = vote
        self.loss_copies = loss_copies
        self.every = 1  # until rank 0 has timed some steps
        self.next_vote = 1
        self._first_bad = torch.zeros((), dtype=torch.int64, device=device)  # 0: none
        self._bad_loss = torch.zeros((), dtype=torch.float32, device=device)
        self._mark: tuple[int, float] | None = None  # (step, clock) at the last vote

    def start_at(self, step: int) -> None:
        """Training (re)starts after `step`: its first step votes, at the first cadence,
        and nothing of an earlier run is kept."""
        self.every = 1
        self.next_vote = step + 1
        self._mark = None
        self._first_bad.zero_()
        self._bad_loss.zero_()

    def note(self, step: int, local_loss: torch.Tensor) -> None:
        """Step `step`'s loss on this rank: kept where it is the first not finite."""
        loss = local_loss.detach().float().reshape(())
        first = (self._first_bad == 0) & ~torch.isfinite(loss)
        self._first_bad = torch.where(first, step, self._first_bad)
        self._bad_loss = torch.where(first, loss, self._bad_loss)

    def due(self, step: int) -> bool:
        """Whether `step` votes on the cadence (the trainer adds the steps that must)."""
        return step >= self.next_vote or step == self.vote.stop_after

    def settle(self, step: int, local_loss: torch.Tensor, batch_of: Callable[[int], int]) -> float:
        """The vote after `step`: returns the world's mean loss of the step; raises
        NonFiniteLoss (on every rank alike) where any rank saw one since the last vote."""
        bad = (self._first_bad > 0).double()
        proposal = torch.tensor(float(self._proposal(step)), dtype=torch.float64)
        loss, (bads, every) = _sum_votes(
            local_loss, self.vote, step, [bad, proposal.to(bad.device)]
        )
        if bads > 0:
            self._raise_first_bad(batch_of)
        self.every = max(1, int(every))
        self.next_vote = step + self.every
        return loss / self.loss_copies

    def _proposal(self, step: int) -> int:
        """Rank 0's steps to the next vote, from the mean step since the last one; the
        other ranks propose 0 (the vote's sum is rank 0's)."""
        now = time.perf_counter()
        mark, self._mark = self._mark, (step, now)
        if dist.is_initialized() and dist.get_rank() != 0:
            return 0
        if mark is None or step <= mark[0]:
            return self.every
        step_s = (now - mark[1]) / (step - mark[0])
        return max(1, min(MAX_EVERY, math.floor(STOP_WITHIN_S / step_s))) if step_s > 0 else 1

    def _raise_first_bad(self, batch_of: Callable[[int], int]) -> None:
        """The earliest step any rank saw a non-finite loss at, agreed by a second
        all-reduce (min), taken only on this rare path."""
        never = torch.iinfo(torch.int64).max
        first = torch.where(self._first_bad > 0, self._first_bad, never).reshape(1)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(first, op=dist.ReduceOp.MIN)
        step = int(first.item())
        # The loss where it was seen at that step (a rank without the loss, under pipeline
        # parallelism, would otherwise say nan for an inf): summed from the ranks that saw
        # it, over how many did.
        mine = self._first_bad == step
        seen = torch.stack([torch.where(mine, self._bad_loss, 0.0).double(), mine.double()])
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(seen)
        total, ranks = seen.tolist()
        raise NonFiniteLoss(step, total / ranks if ranks else math.nan, batch_of(step))
