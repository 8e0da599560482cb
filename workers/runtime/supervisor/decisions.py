"""The supervisor's decisions, apart from its mechanics and with no I/O: whether a failure
is retried (the job's one failure budget), and whether a non-finite loss is rolled back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardline.workers.contract.lifecycle import JobState


@dataclass(frozen=True)
class Next:
    """The state a supervisor's step leads to, and why (its transition's event says it)."""

    state: JobState
    reason: str = ""


@dataclass(frozen=True)
class Decision:
    retry: bool
    reason: str
    backoff_s: float = 0.0


class FailurePolicy:
    """Retry up to `max_failures` real failures in the job's life. The count is the job's,
    stored with it: every supervisor starts from it and the reconciler (a lost supervisor)
    decides by the same policy.

    The backoff grows in crash loops only: failures with no new step trained between them
    (`progressed` false: the world the last recovery started has not trained past its
    restore). A failure after progress is retried at once, or after `base_backoff_s` where
    a node may be lost (`node_suspect`: a rank died and nothing of the job on its node
    answered), however soon after the last one it came. Each failure of a crash loop waits
    twice as long as the one before, up to `max_backoff_s`. A job then loses nothing to
    waiting for failures that are far apart in its training (a node lost today, a rank
    killed an hour later, or a minute later after steps trained). (The second for a node:
    a restart at once after a node is lost can place ranks on the node before Ray has
    declared it dead, and their start then waits out the join timeout: the elastic e2e
    test took 400 s instead of 108 s.)"""

    def __init__(
        self, max_failures: int, base_backoff_s: float = 1.0, max_backoff_s: float = 60.0
    ) -> None:
        self.max_failures = max_failures
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self._streak = 0  # failures in the current crash loop, this one included

    def decide(
        self,
        failures_so_far: int,
        error: str,
        *,
        deterministic: bool = False,
        node_suspect: bool = True,
        progressed: bool = True,
    ) -> Decision:
        """`failures_so_far` counts this failure too. A deterministic failure (the job's own
        spec or data cannot work) would fail the same way again: no retry."""
        if deterministic:
            return Decision(False, f"{error} (an error of the job itself: not retried)")
        if failures_so_far > self.max_failures:
            return Decision(
                False,
                f"{error} (failure {failures_so_far}, more than "
                f"fault_tolerance.max_failures={self.max_failures})",
            )
        backoff = self._backoff(node_suspect, progressed)
        loop = " (a crash loop)" if self._streak > 1 else ""
        when = f"in {backoff:.0f}s{loop}" if backoff else "at once"
        return Decision(
            True,
            f"{error} (failure {failures_so_far} of at most "
            f"{self.max_failures}; restarting {when})",
            backoff,
        )

    def _backoff(self, node_suspect: bool, progressed: bool) -> float:
        self._streak = 1 if progressed else self._streak + 1
        if self._streak == 1 and not node_suspect:
            return 0.0
        return min(self.base_backoff_s * 2 ** (self._streak - 1), self.max_backoff_s)


def why_not_in_place(
    *,
    wanted: bool,
    able: bool,
    gpus: bool,
    lost: list[int],
    world_size: int,
    node_suspect: bool,
    looping: bool,
) -> str | None:
    """Why a failure restarts every rank instead of replacing only the `lost` ones while
    the others keep their processes; None: in place. `looping`: the previous recovery
    went in place and its world trained no step."""
    if not wanted:
        return "fault_tolerance.recover_in_place is off"
    if not able:
        return "this worker group cannot replace ranks one by one"
    if gpus:  # an NCCL collective waits for a dead peer until its timeout (minutes)
        return "a GPU job's ranks cannot leave a failed NCCL world in time"
    if looping:
        return "the last recovery in place trained no step"
    if node_suspect:
        return "a node of the job may be lost, so every rank is placed again"
    if len(set(lost)) >= world_size:
        return "every rank was lost"
    return None


@dataclass(frozen=True)
class SkipDecision:
    skip: bool
    reason: str


class NonFinitePolicy:
    """Skip the offending batch up to `max_skips` times in the job's life. A loss that is
    not finite again at a step whose batch was already skipped comes from the job itself
    (its learning rate, its model), not from one batch: fail at once. Not a failure of the
    infrastructure: it spends max_nonfinite_skips, never max_failures."""

    def __init__(self, max_skips: int) -> None:
        self.max_skips = max_skips

    def decide(
        self, step: int, loss: float, batch: int, past: list[dict[str, Any]]
    ) -> SkipDecision:
        """`past`: the job's skips so far ({"step", "batch"}), oldest first."""
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
        return SkipDecision(
            True,
            f"{what}: rolling back to the newest snapshot and skipping batch {batch} "
            f"(skip {len(past) + 1} of at most {self.max_skips})",
        )
