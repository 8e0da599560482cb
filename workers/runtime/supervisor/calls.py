"""What the control plane calls on a job's supervisor (the Ray actor's methods). They
answer at once from the actor's threads; the state machine (machine.py) acts on the
requests in its own loop."""

from __future__ import annotations

import threading

from workers.contract.events import Event, EventKind
from workers.contract.faults import FaultKind
from workers.contract.lifecycle import JobState
from workers.contract.progress import ProgressBuffer, ProgressRead
from workers.runtime.supervisor.handling import FailureHandling
from workers.runtime.supervisor.recovery import Recoveries
from workers.runtime.supervisor.relay import ProgressRelay
from workers.runtime.supervisor.workers import FaultRefused, Workers


class ControlPlaneCalls:
    # Set by the supervisor (machine.py) that these are the calls of.
    job_id: str
    state: JobState
    workers: Workers
    relay: ProgressRelay
    handling: FailureHandling
    recoveries: Recoveries
    finished_training: bool
    _cancel: threading.Event
    _pause: threading.Event
    _thread: threading.Thread | None

    def run(self) -> JobState:  # the state machine's loop
        raise NotImplementedError

    @property
    def buffer(self) -> ProgressBuffer:
        return self.relay.buffer

    @property
    def failures(self) -> int:
        return self.handling.failures

    def start(self) -> None:
        """Run the state machine in the background (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.run, name=f"supervise-{self.job_id}", daemon=True
            )
            self._thread.start()

    def read(self, after_seq: int) -> ProgressRead:
        """Buffered entries after `after_seq`, and the state now."""
        return {
            "entries": self.buffer.after(after_seq),
            "state": self.state.value,
            "last_seq": self.buffer.last_seq,
        }

    def cancel(self) -> None:
        self._cancel.set()
        self.handling.wake.set()

    def pause(self) -> None:
        """Checkpoint, free the workers and the placement group, end PAUSED."""
        self._pause.set()
        self.handling.wake.set()

    def inject_fault(self, kind: str, rank: int) -> None:
        """Chaos testing: have rank `rank` fail as `kind` says (workers/runtime/faults.py)."""
        fault = FaultKind(kind)
        self._running().inject_fault(rank, fault.value)
        message = f"fault injected: {self.recoveries.inject(fault.value, rank)}"
        self.relay.event(Event(EventKind.FAULT_INJECTED, message, {"fault": kind, "rank": rank}))

    def profile(self, profile_id: str, steps: int) -> int:
        """Have every rank record its next `steps` steps (workers/runtime/profiling.py)."""
        ranks = self._running().profile(profile_id, steps)
        said = f"profile {profile_id}: recording the next {steps} steps of {ranks} rank(s)"
        self.relay.event(Event(EventKind.PROFILE, said, {"profile": profile_id, "ranks": ranks}))
        return ranks

    def _running(self) -> Workers:  # to ask something of a RUNNING job's workers
        if self.state != JobState.RUNNING or self._cancel.is_set() or self._pause.is_set():
            raise FaultRefused(f"the job's supervisor is {self.state.value}, not RUNNING")
        if self.finished_training:  # still RUNNING while its end is recorded
            raise FaultRefused("the job has finished training: its workers are gone")
        return self.workers
