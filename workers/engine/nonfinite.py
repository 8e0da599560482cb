"""A step whose loss is not finite: what the trainer raises so the job can roll back."""

from __future__ import annotations


class NonFiniteLoss(ArithmeticError):
    """The loss of `step` (which trained batch `batch`) is NaN or infinite.

    Every rank raises it at the same vote (workers/engine/step_outcome.py), for the
    earliest step any rank saw a non-finite loss at since the last vote; no save comes
    between. The optimizer steps have been taken, so the model cannot simply carry on:
    the job rolls back
    to its newest snapshot and skips the batch (workers/supervisor_recovery.py).
    """

    def __init__(self, step: int, loss: float, batch: int) -> None:
        super().__init__(f"the loss of step {step} (batch {batch}) is not finite ({loss})")
        self.step, self.loss, self.batch = step, loss, batch
