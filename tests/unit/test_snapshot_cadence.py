"""How often in-memory snapshots are taken by default: as often as costs at most 2% of the
step time, from the measured cost (workers/engine/checkpoint/cadence.py)."""

from __future__ import annotations

import itertools

from shardline.workers.engine.checkpoint.cadence import FIRST_AFTER, FIRST_GUESS, SnapshotCadence


def drive(cadence: SnapshotCadence, steps: int, plain_s: float, snapshot_s: float) -> list[int]:
    """Run the manager's protocol for `steps` steps: plain steps take `plain_s`, the step
    after a snapshot `snapshot_s`; rank 0's proposal is agreed at each snapshot."""
    taken, last = [], None
    for step in range(1, steps + 1):
        cadence.joined()
        cadence.step_timed(step, snapshot_s if last == "snapshot" else plain_s, last)
        last = None
        if cadence.due(step):
            cadence.taken(step)
            cadence.proposed = cadence.proposal()  # what the save's thread agrees
            taken.append(step)
            last = "snapshot"
    return taken


def test_a_snapshot_that_costs_a_tenth_of_a_step_is_taken_every_five_steps() -> None:
    cadence = SnapshotCadence("auto", 0)
    taken = drive(cadence, 40, plain_s=1.0, snapshot_s=1.1)
    # The first after the first steps, then the first guess (agreed before the first
    # snapshot's cost was known), then every 0.1/(0.02*1.0).
    assert taken[:2] == [FIRST_AFTER, FIRST_AFTER + FIRST_GUESS]
    assert all(b - a == 5 for a, b in itertools.pairwise(taken[1:])), taken
    assert abs((cadence.cost_s or 0) - 0.1) < 1e-9


def test_a_free_snapshot_is_taken_every_step_and_a_dear_one_rarely() -> None:
    cheap = drive(SnapshotCadence("auto", 0), 30, plain_s=1.0, snapshot_s=0.9)
    assert cheap[-3:] == [28, 29, 30]
    dear = SnapshotCadence("auto", 0)
    drive(dear, 30, plain_s=0.01, snapshot_s=10.0)
    assert dear.proposal() == 1000  # at most: a snapshot still comes eventually


def test_local_sgd_snapshots_fall_on_syncs() -> None:
    cadence = SnapshotCadence("auto", 0, multiple_of=4)
    taken = drive(cadence, 60, plain_s=1.0, snapshot_s=1.1)
    assert taken and all(step % 4 == 0 for step in taken), taken


def test_a_fixed_interval_is_kept_and_zero_is_off() -> None:
    assert drive(SnapshotCadence(3, 0), 10, 1.0, 5.0) == [3, 6, 9]
    assert drive(SnapshotCadence(0, 0), 10, 1.0, 5.0) == []


def test_one_noisy_step_does_not_make_snapshots_free() -> None:
    cadence = SnapshotCadence("auto", 0)
    for step in range(1, 9):
        cadence.step_timed(step, 1.0, None)
    cadence.step_timed(9, 1.1, "snapshot")  # costs 0.1
    cadence.step_timed(10, 0.95, "snapshot")  # a fast step: reads as free
    assert cadence.proposal() == 3  # the mean of 0.1 and 0: not every step


def test_a_save_that_failed_before_agreeing_keeps_the_interval() -> None:
    cadence = SnapshotCadence("auto", 0)
    assert cadence.due(FIRST_AFTER)
    cadence.taken(FIRST_AFTER)  # its thread died before the broadcast: nothing proposed
    cadence.joined()
    assert not cadence.due(FIRST_AFTER + 1)
    assert cadence.due(FIRST_AFTER + FIRST_GUESS)


def test_a_restored_run_waits_a_few_steps_for_its_first_snapshot() -> None:
    cadence = SnapshotCadence("auto", 0)
    cadence.restart_at(50)
    assert not cadence.due(51) and cadence.due(50 + FIRST_AFTER)


def test_async_meetings_are_timed_as_rounds_and_their_interval_counted_in_steps() -> None:
    """Under async the trainer saves once a round of 10 steps: a snapshot costing a tenth
    of a round is one round's 2% budget 5 times over, so it is taken every 5 rounds (50
    steps), not every 5 steps rounded up to a round (every round, 5x the budget)."""
    cadence = SnapshotCadence("auto", 0, multiple_of=10, steps_per_call=10)
    cadence.cost_s = 0.1
    for _ in range(5):
        cadence.step_timed(0, 1.0, None)  # one round: 1 s
    assert cadence.proposal() == 50
