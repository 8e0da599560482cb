"""The supervisor of one job: a state machine that runs, watches and restarts its workers.

A plain class; `workers/actors.py` makes it a detached, named Ray actor. Its loop runs in
a thread, so `read()` and `cancel()` answer at once. Everything the control plane needs
(state changes, events, metrics) goes into a sequence-numbered buffer that the reconciler
reads with "everything after n".
"""

from __future__ import annotations

import logging
import threading
import time
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from workers.failure_policy import FailurePolicy
from workers.progress import ProgressBuffer
from workers.spec import JobSpec

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5
POLL_TIMEOUT_S = 30.0
RESERVE_TIMEOUT_S = 600.0
JOIN_TIMEOUT_S = 300.0
STOP_GRACE_S = 5.0


class SupervisorState(StrEnum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL = {SupervisorState.SUCCEEDED, SupervisorState.FAILED, SupervisorState.CANCELLED}


class Workers(Protocol):
    """What the supervisor needs of its worker group (fakeable in unit tests)."""

    def reserve(self, timeout_s: float) -> list[str]: ...
    def start(self, join_timeout_s: float) -> None: ...
    def poll(self, timeout_s: float) -> list[dict[str, Any]]: ...
    def request_stop(self) -> None: ...
    def kill_workers(self) -> None: ...
    def release(self) -> None: ...


class JobSupervisor:
    def __init__(
        self, job_id: str, spec_json: str, storage_root: str, workers: Workers | None = None
    ) -> None:
        self.job_id = job_id
        self.spec = JobSpec.model_validate_json(spec_json)
        self.job_dir = Path(storage_root) / job_id
        self.job_dir.mkdir(parents=True, exist_ok=True)
        (self.job_dir / "spec.json").write_text(spec_json)
        if workers is None:
            from workers.worker_group import WorkerGroup

            workers = WorkerGroup(job_id, self.spec, str(self.job_dir / "logs"))
        self.workers = workers
        self.policy = FailurePolicy(self.spec.fault_tolerance.max_failures)
        self.buffer = ProgressBuffer()
        self.state = SupervisorState.STARTING
        self.failures = 0
        self.reported_step = 0  # metrics up to here were sent; a restart must not resend
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        # Why the state is about to change, for the event of the transition.
        self._reason = ""

    # -- what the control plane calls --------------------------------------------------

    def start(self) -> None:
        """Run the state machine in the background (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.run, name=f"supervise-{self.job_id}", daemon=True
            )
            self._thread.start()

    def read(self, after_seq: int) -> dict[str, Any]:
        """Buffered entries after `after_seq`, and the state now."""
        return {
            "entries": self.buffer.after(after_seq),
            "state": self.state.value,
            "last_seq": self.buffer.last_seq,
        }

    def cancel(self) -> None:
        self._cancel.set()

    # -- the state machine -------------------------------------------------------------

    def run(self) -> SupervisorState:
        while self.state not in TERMINAL:
            try:
                nxt = self.step()
            except Exception as err:  # a bug or an infrastructure error: do not hang
                log.exception("job %s: supervisor step failed", self.job_id)
                nxt = self._on_failure(f"supervisor error: {type(err).__name__}: {err}")
            if nxt != self.state:
                self._enter(nxt)
            if self.state not in TERMINAL:
                time.sleep(POLL_INTERVAL_S)
        return self.state

    def step(self) -> SupervisorState:
        """Take one step from the current state; returns the next state."""
        if self._cancel.is_set() and self.state not in TERMINAL:
            return self._cancel_now()
        if self.state == SupervisorState.STARTING:
            return self._launch("started")
        if self.state == SupervisorState.RESTARTING:
            return self._launch("restarted")
        return self._watch()

    def _enter(self, state: SupervisorState, reason: str = "") -> None:
        log.info("job %s: %s -> %s", self.job_id, self.state.value, state.value)
        self.state = state
        self.buffer.append("state", state=state.value, reason=reason or self._reason)
        self._reason = ""

    def _event(self, message: str, **data: Any) -> None:
        log.info("job %s: %s", self.job_id, message)
        self.buffer.append("event", message=message, data=data)

    def _launch(self, verb: str) -> SupervisorState:
        nodes = self.workers.reserve(RESERVE_TIMEOUT_S)
        self._event(
            f"placement group ready: {len(nodes)} ranks on {len(set(nodes))} node(s)",
            nodes=sorted(set(nodes)),
        )
        self.workers.start(JOIN_TIMEOUT_S)
        self._event(f"workers {verb}", world_size=len(nodes))
        self._reason = f"{len(nodes)} workers {verb}"
        return SupervisorState.RUNNING

    def _watch(self) -> SupervisorState:
        statuses = self.workers.poll(POLL_TIMEOUT_S)
        for status in statuses:
            for m in status["metrics"]:
                if m["step"] > self.reported_step:
                    self.buffer.append("metrics", step=m["step"], values=m)
                    self.reported_step = m["step"]
        failed = [s for s in statuses if s["phase"] == "failed"]
        if failed:
            return self._on_failure("; ".join(str(s["error"]) for s in failed))
        hung = self._hung_ranks(statuses)
        if hung:
            limit = self.spec.fault_tolerance.hang_timeout_s
            return self._on_failure(f"no progress for {limit:.0f}s on rank(s) {hung}")
        if all(s["phase"] == "done" for s in statuses):
            summary = next((s["summary"] for s in statuses if s["summary"]), None)
            self.buffer.append("summary", summary=summary)
            self.workers.release()
            self._reason = "training finished"
            return SupervisorState.SUCCEEDED
        return SupervisorState.RUNNING

    def _hung_ranks(self, statuses: list[dict[str, Any]]) -> list[int]:
        limit = self.spec.fault_tolerance.hang_timeout_s
        now = time.time()
        hung = [
            s["rank"]
            for s in statuses
            if s["phase"] in ("joining", "training") and now - s["last_progress"] > limit
        ]
        if hung:
            front = max(s["step"] for s in statuses)
            behind = [s["rank"] for s in statuses if s["step"] < front]
            return behind or hung  # name the ranks that were behind where there are some
        return []

    def _on_failure(self, error: str) -> SupervisorState:
        self.failures += 1
        decision = self.policy.decide(self.failures, error)
        self._event(f"failure: {decision.reason}", retry=decision.retry)
        self.workers.kill_workers()
        self._reason = decision.reason
        if not decision.retry:
            self.workers.release()
            return SupervisorState.FAILED
        # No checkpoints yet: a restart trains again from step 0 (metrics already sent
        # are not sent twice).
        time.sleep(decision.backoff_s)
        return SupervisorState.RESTARTING

    def _cancel_now(self) -> SupervisorState:
        self.workers.request_stop()
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            statuses = self.workers.poll(min(POLL_TIMEOUT_S, STOP_GRACE_S))
            if all(s["phase"] in ("stopped", "done", "failed") for s in statuses):
                break
            time.sleep(POLL_INTERVAL_S)
        self.workers.release()
        self._reason = "cancelled on request"
        return SupervisorState.CANCELLED
