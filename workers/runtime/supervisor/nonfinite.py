"""Deciding what a non-finite loss does: roll back and skip the batch, or fail."""

from __future__ import annotations

from dataclasses import dataclass

from workers.storage.skipped_batches import SkippedBatches


@dataclass(frozen=True)
class SkipDecision:
    skip: bool
    reason: str


class NonFinitePolicy:
    """Skip the offending batch up to `max_skips` times in the job's life. A loss that is
    not finite again at a step whose batch was already skipped comes from the job itself
    (its learning rate, its model), not from one batch: fail at once."""

    def __init__(self, max_skips: int, record: SkippedBatches) -> None:
        self.max_skips = max_skips
        self.record = record

    def decide(self, step: int, batch: int, loss: float) -> SkipDecision:
        """Records the skip when it decides to skip."""
        past = self.record.read()
        what = f"the loss of step {step} is not finite ({loss})"
        if any(entry["step"] == step for entry in past):
            return SkipDecision(
                False,
                f"{what} again after rolling back and skipping its batch: an error of the "
                "job itself, not of one batch (lower train.lr or set train.grad_clip); not "
                "retried",
            )
        if len(past) >= self.max_skips:
            return SkipDecision(
                False,
                f"{what}; {len(past)} batch(es) skipped already, the most "
                f"fault_tolerance.max_nonfinite_skips={self.max_skips} allows",
            )
        self.record.add(step, batch)
        return SkipDecision(
            True,
            f"{what}: rolling back to the newest snapshot and skipping batch {batch} "
            f"(skip {len(past) + 1} of at most {self.max_skips})",
        )
