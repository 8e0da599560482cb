"""When in-memory snapshots are taken: every N steps as the job asks, or ("auto", the
default) as often as costs at most 2% of the step time, from what snapshots cost here.

The cost of a snapshot is measured where it lands: the step after a snapshot waits for
it to commit, so the time from that step's save call back to the previous one holds the
copy into host buffers, the step, and any wait for the write; less a plain step's time
(the median of recent steps with no save), it is what the snapshot cost training.

A snapshot is a collective, so every rank must take the same steps: rank 0's proposal
travels in each snapshot's own background thread (workers/engine/checkpoint/tier.py) and
every rank applies it once it has joined that thread, before the next step is checked.
No torch here.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Literal

BUDGET = 0.02  # of the step time
# Steps after a (re)start before the first snapshot: enough plain steps before it
# (_MIN_PLAIN; the first step has no mark to time it from) for its cost to be measured.
FIRST_AFTER = 5
FIRST_GUESS = 10  # the interval after the first snapshot, before any cost is known
MAX_EVERY = 1000
_PLAIN_STEPS = 16  # recent steps without a save, for the baseline
_MIN_PLAIN = 4  # plain steps seen before a snapshot's cost is read against them
_COSTS = 3  # recent snapshots' costs, averaged


class SnapshotCadence:
    """Which steps take a snapshot, for one run of the trainer."""

    def __init__(
        self,
        every: int | Literal["auto"],
        start_step: int,
        multiple_of: int = 1,
        steps_per_call: int = 1,
    ) -> None:
        """`multiple_of`: snapshots only at steps that are multiples of it (local SGD's
        syncs, async meetings, where replicas agree); `steps_per_call`: the steps between
        two save calls, which are what is timed (an async round's, not one step's)."""
        self.fixed = None if every == "auto" else every
        self.multiple_of = multiple_of
        self.steps_per_call = steps_per_call
        self.next_due = start_step + FIRST_AFTER
        self.proposed: int | None = None  # agreed in the last snapshot, applied on join
        self._taken_at: int | None = None
        self._plain: deque[float] = deque(maxlen=_PLAIN_STEPS)
        self._costs: deque[float] = deque(maxlen=_COSTS)
        self.cost_s: float | None = None  # the last snapshot's measured cost
        self.interval = FIRST_GUESS

    def restart_at(self, step: int) -> None:
        """The run starts after `step` (restored): the first snapshot comes a few steps on."""
        self.next_due = step + FIRST_AFTER

    def due(self, step: int) -> bool:
        if self.fixed is not None:
            return self.fixed > 0 and step % self.fixed == 0
        return step >= self.next_due and step % self.multiple_of == 0

    def step_timed(self, step: int, seconds: float, after: str | None) -> None:
        """The time from the previous step's save call to this one's (its wait for the
        snapshot included); `after`: what the previous save call did ("snapshot",
        "checkpoint" or None)."""
        if after is None:
            self._plain.append(seconds)
        elif after == "snapshot" and len(self._plain) >= _MIN_PLAIN:
            cost = max(0.0, seconds - statistics.median(self._plain))
            self._costs.append(cost)
            # The mean of the last few: one noisy step would otherwise read as a free
            # snapshot (an interval of 1) or a dear one.
            self.cost_s = statistics.mean(self._costs)

    def proposal(self) -> int:
        """Rank 0's interval from the costs seen so far (the first guess before any)."""
        if self.cost_s is None or not self._plain:
            return FIRST_GUESS
        budget = BUDGET * statistics.median(self._plain)  # of one save call's time
        calls = max(1, math.ceil(self.cost_s / budget - 1e-6)) if budget > 0 else MAX_EVERY
        every = min(calls * self.steps_per_call, MAX_EVERY)
        return math.ceil(every / self.multiple_of) * self.multiple_of

    def taken(self, step: int) -> None:
        self._taken_at = step

    def joined(self) -> None:
        """The last snapshot's thread is done: apply the interval it agreed."""
        if self._taken_at is None:
            return
        if self.proposed is not None:  # else the save failed early: keep the interval
            self.interval = self.proposed
            self.proposed = None
        self.next_due = self._taken_at + self.interval
        self._taken_at = None
