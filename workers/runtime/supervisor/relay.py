"""The supervisor's relay of progress to the control plane: a sequence-numbered buffer of
states, events, metrics, checkpoints and the summary, each entry once, with the metrics
that never reached the database replayed from rank 0's metrics file."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

from shardline.workers.contract.events import RESTORED_METRICS, Event, EventKind
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.progress import (
    CheckpointEntry,
    EventEntry,
    MetricsEntry,
    ProgressBuffer,
    StateEntry,
    SummaryEntry,
)
from shardline.workers.contract.status import StepMetrics, WorkerStatus

log = logging.getLogger(__name__)


class ProgressRelay:
    def __init__(self, job_id: str, metrics_file: Path, log_every: int, reported_step: int) -> None:
        self.job_id = job_id
        self.metrics_file = metrics_file
        self.log_every = log_every
        self.buffer = ProgressBuffer()
        # Metrics up to here are recorded or buffered; a restart must not resend them. A
        # supervisor replacing a lost one starts from what the database holds.
        self.reported_step = reported_step
        self.front_step = 0  # the furthest step any rank reported
        self.step_time_s: float | None = None  # the latest logged step time

    def state(self, state: JobState, reason: str) -> None:
        self.buffer.append(StateEntry(state=state.value, reason=reason))

    def event(self, event: Event) -> None:
        log.info("job %s: %s", self.job_id, event.message)
        self.buffer.append(EventEntry(message=event.message, data=event.stored_data()))

    def placed(self, rank_nodes: list[str]) -> None:
        nodes = sorted(set(rank_nodes))
        where = [nodes.index(node) for node in rank_nodes]  # each rank's, as an index: small
        message = f"placement group ready: {len(where)} ranks on {len(nodes)} node(s)"
        self.event(Event(EventKind.PLACEMENT, message, {"nodes": nodes, "ranks": where}))

    def started(self, verb: str, world_size: int, warm_spares: bool, pooled: int = 0) -> None:
        said = f"workers {verb}" + (" on warm spares" if warm_spares else "")
        if pooled:
            said += f", {pooled} of {world_size} from the warm pool"
        data = {"world_size": world_size, "warm_spares": warm_spares, "pooled_ranks": pooled}
        self.event(Event(EventKind.WORKERS_STARTED, said, data))

    def collect(self, statuses: list[WorkerStatus]) -> Event | None:
        """Buffer what the ranks produced since the last poll, each entry once; returns
        the restore event among them, if a world restored a checkpoint."""
        restored = None
        for status in statuses:
            self.front_step = max(self.front_step, status.step)
            for event in status.events:
                logged = None
                if event.kind == EventKind.RESTORED:
                    data = dict(event.data)
                    logged = data.pop(RESTORED_METRICS, None)
                    event = restored = replace(event, data=data)
                self.event(event)
                if logged is not None:
                    # The restored step's metrics, saved with it: where rank 0 died after
                    # the save committed and before it logged them, nobody else has them
                    # (the metrics file was replayed before this world started).
                    self._metrics(logged)
            for m in status.metrics:
                self.step_time_s = m.get("step_time_s", self.step_time_s)
                if m["step"] > self.reported_step + self.log_every:
                    # A gap: a rank 0 whose polls never arrived logged those steps (a
                    # world restored past them). Its metrics file has them.
                    self.replay(before=m["step"])
                self._metrics(m)
            for commit in status.checkpoints:
                self.buffer.append(CheckpointEntry(commit=commit))
        return restored

    def replay(self, before: int | None = None) -> None:
        """Buffer what rank 0 logged after `reported_step` (and before `before`) but nobody
        passed on: metrics a killed rank 0 held since the last poll, or a lost
        predecessor's. The workers about to start resume from the newest checkpoint, which
        may be past those steps."""
        for metrics in logged_metrics_after(self.metrics_file, self.reported_step):
            if before is None or metrics["step"] < before:
                self._metrics(metrics)

    def _metrics(self, metrics: StepMetrics) -> None:
        if metrics["step"] > self.reported_step:  # a restarted rank 0 logs steps again
            self.buffer.append(MetricsEntry(step=metrics["step"], values=metrics))
            self.reported_step = metrics["step"]

    def summary(self, statuses: list[WorkerStatus]) -> None:
        found = next((s.summary for s in statuses if s.summary), None)
        self.buffer.append(SummaryEntry(summary=found))


def logged_metrics_after(metrics_file: Path, step: int) -> list[StepMetrics]:
    """The metrics rank 0 logged for steps after `step`, in the order they were logged."""
    if not metrics_file.is_file():
        return []
    found: list[StepMetrics] = []
    for line in metrics_file.read_text(encoding="utf-8").splitlines():
        try:
            metrics = json.loads(line)
        except json.JSONDecodeError:  # a line cut short when its writer died
            continue
        if metrics["step"] > step:
            found.append(metrics)
    return found
