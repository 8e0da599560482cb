"""What a job's timeline says, as typed events: the engine, the workers and the supervisor
emit them, the supervisor and the store read their kind and data, never their text.

Each event's data also carries `"kind"` (its EventKind value) when it is stored, so a
reader of the events API can tell them apart the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class EventKind(StrEnum):
    # The control plane, at submit:
    PLANNED = "planned"  # parallel: auto chose a layout: parallel, runner_up, ranks, reason
    FIRST_STEP = "first_step"  # the job's first step, seconds after submit: seconds
    PRIORITY = "priority"  # a user changed a job's priority: from, to, by
    # The engine, on rank 0:
    # data: step, path, tier ("memory" or "storage"), and RESTORED_METRICS where the
    # checkpoint's step was a logged one; the relay takes those out (they are not stored)
    RESTORED = "restored"
    CHECKPOINT_SKIPPED = "checkpoint_skipped"  # a candidate failed to verify: step, problem
    CHECKPOINT_COMMITTED = "checkpoint_committed"  # step, path, bytes, save_s, blocking_s
    SAVE_FAILED = "save_failed"  # an async save failed (training goes on): step
    # the first snapshot of a run: folders (the ranks writing into each node's host
    # memory), bytes (what each holds: its own ranks' files and a peer node's copy)
    SNAPSHOT_MEMORY = "snapshot_memory"
    # The supervisor:
    PLACEMENT = "placement"  # placement group ready: nodes, ranks (each one's index in nodes)
    WAITING = "waiting"  # the job waits for capacity: world_size
    WORKERS_STARTED = "workers_started"  # world_size, warm_spares, pooled_ranks
    FAILURE = "failure"  # a real failure, counted against max_failures: retry, failures
    NONFINITE = "nonfinite"  # a non-finite loss: step, batch, skipped
    RECOVERY = "recovery"  # a recovery ended: mttr_s, steps_lost, seconds_lost, ...
    ELASTIC = "elastic"  # a re-plan or grow-back: dp_from, dp_to (a re-plan: from, to, train)
    NODE = "node"  # a failing node left out of the next placement (or kept): node
    PREEMPTION = "preemption"  # nodes of the job are being preempted: nodes, deadline_s
    FAULT_INJECTED = "fault_injected"  # fault, rank
    PROFILE = "profile"  # a profile on demand began: profile, steps


# The restored step's metrics, as saved with its checkpoint: a save can commit before rank
# 0 hands them on, and a world restored from it never logs that step again.
RESTORED_METRICS = "logged"


@dataclass(frozen=True)
class Event:
    kind: EventKind
    message: str
    data: dict[str, Any] = field(default_factory=dict)

    def stored_data(self) -> dict[str, Any]:
        """The data as the timeline stores it: with its kind."""
        return {**self.data, "kind": self.kind.value}
