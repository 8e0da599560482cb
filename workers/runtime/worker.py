"""One rank of a job: joins the world, trains in a thread, answers polls at once.

A plain class; `workers/runtime/actors.py` makes it a Ray actor. Training runs in a background
thread so `poll()` and `stop()` are served immediately even mid-step.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import threading
import time
import traceback
from typing import Any

from shardline.workers.contract.events import Event
from shardline.workers.contract.faults import FaultKind
from shardline.workers.contract.progress import CheckpointCommit
from shardline.workers.contract.spec import JobSpec
from shardline.workers.contract.status import (
    NonFiniteStep,
    StepMetrics,
    WorkerPhase,
    WorkerStatus,
)
from shardline.workers.runtime import priority
from shardline.workers.runtime.faults import ArmedFaults
from shardline.workers.runtime.job_errors import is_deterministic
from shardline.workers.runtime.profiling import StepProfiler
from shardline.workers.runtime.rank_process import empty_device_cache, log_to_file, node_address
from shardline.workers.storage.layout import CheckpointLocations, JobLayout

log = logging.getLogger(__name__)


class TrainingWorker:
    def __init__(
        self,
        layout: JobLayout,
        rank: int,
        world_size: int,
        spec: JobSpec,
        checkpoints: CheckpointLocations | None = None,
        cpus: float = 1.0,
        spare: bool = False,
    ) -> None:
        # Ray starts its workers at nice 15, below the raylet, the API and every other
        # process of the node: a rank goes to normal priority where it may, and a warm
        # spare to the lowest, below the ranks that train now, until a restart takes it
        # (`foreground()`; workers/runtime/priority.py).
        self._background = spare and priority.lower()
        if not spare:
            priority.normal()
        self.job_id, self.rank, self.world_size = layout.job_id, rank, world_size
        self.spec = spec  # validated once, when the job was submitted; pickled by Ray
        self.checkpoints = layout.here(checkpoints)
        # Rank 0 also appends its metrics here: a supervisor that replaces a lost one
        # replays what never reached the database.
        self._metrics_file = layout.metrics_file if rank == 0 else None
        self._log_handler = log_to_file(layout.log_file(rank))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._save_on_stop = False
        self._phase = WorkerPhase.IDLE
        self._step = 0
        self._loss: float | None = None
        self._last_progress = time.time()
        self._error: str | None = None
        self._deterministic = False
        self._unsent: list[StepMetrics] = []
        self._events: list[Event] = []
        self._commits: list[CheckpointCommit] = []
        self._summary: dict[str, Any] | None = None
        self._nonfinite: NonFiniteStep | None = None
        self._faults = ArmedFaults()
        self._profiler = StepProfiler(rank)
        self._profiles_dir = layout.profiles_dir
        self._trainer: Any = None
        self._saves: list[threading.Thread] = []  # a failed world's, still being written
        self._thread: threading.Thread | None = None
        import torch

        # Ranks share a node's cores: without this each would start one thread per core.
        torch.set_num_threads(max(1, int(cpus)))
        if spare:  # what a rank imports to join and train, ahead, while it has time
            import shardline.workers.engine.warm  # noqa: F401

    def foreground(self) -> bool:
        """A warm spare taken by a restart: back to normal priority. Whether it answers."""
        if self._background:
            priority.raise_back()
            self._background = False
        return True

    def rendezvous_address(self) -> tuple[str, int]:
        """Called on rank 0: this node's address and a free port for the process group."""
        import ray

        from shardline.workers.contract.net import free_port

        return ray.util.get_node_ip_address(), free_port()

    def start(self, master_addr: str, master_port: int, join_timeout_s: float) -> None:
        """Join the world and train, in the background; returns at once."""
        if self._thread is not None:
            raise RuntimeError("worker already started")
        self._phase = WorkerPhase.JOINING
        self._thread = threading.Thread(
            target=self._run,
            args=(master_addr, master_port, join_timeout_s),
            name=f"train-rank-{self.rank}",
            daemon=True,
        )
        self._thread.start()

    def settle(self, timeout_s: float) -> None:
        """Recovery in place, on a rank that survived: wait (up to `timeout_s`) until its
        training thread has left the failed world and its saves in flight have ended.
        Raises where they have not: a collective of that world still holds them."""
        deadline = time.monotonic() + timeout_s
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise RuntimeError(f"rank {self.rank} is still in the failed world")
        for save in self._saves:  # listed by the thread as it ended: read only now
            save.join(max(deadline - time.monotonic(), 0.0))
            if save.is_alive():
                raise RuntimeError(f"rank {self.rank} still saves for the failed world")
        self._saves = []

    def rejoin(self, master_addr: str, master_port: int, join_timeout_s: float) -> None:
        """Recovery in place: join the new world in this process (torch, the engine and the
        device already loaded) and train again from the newest checkpoint; returns at once."""
        self.settle(0.0)  # nothing of the failed world may run beside the new one
        if self._trainer is not None:  # its world ended here without a failure (and with
            self._leave_failed_world()  # its saves waited for); a failed one is freed already
        with self._lock:
            self._error, self._deterministic = None, False
            self._nonfinite, self._summary = None, None
        self._stop.clear()
        self._save_on_stop = False
        self._faults = ArmedFaults()  # a fault injected into the failed world is spent
        self._thread = None
        self.start(master_addr, master_port, join_timeout_s)

    def _run(self, master_addr: str, master_port: int, join_timeout_s: float) -> None:
        from shardline.workers.engine.distributed import (
            abandon_world,
            init_world,
            leave_world,
            pick_device,
        )
        from shardline.workers.engine.hooks import TrainerHooks
        from shardline.workers.engine.nonfinite import NonFiniteLoss
        from shardline.workers.engine.trainer import Trainer

        building, trainer, failed = True, None, False
        try:
            device = pick_device(0)  # Ray sets CUDA_VISIBLE_DEVICES to this rank's GPUs
            init_world(
                rank=self.rank,
                world_size=self.world_size,
                master_addr=master_addr,
                master_port=master_port,
                device=device,
                timeout_s=join_timeout_s,
                own_addr=node_address(),
            )
            log.info("rank %d trains in process %d", self.rank, os.getpid())
            hooks = TrainerHooks(
                on_metrics=self._on_metrics,
                on_step=self._on_step,
                on_progress=self._heartbeat,
                after_backward=self._faults.during_step,
                on_event=self._on_event,
                on_checkpoint=self._on_checkpoint,
            )
            trainer = Trainer(
                self.spec,
                world_size=self.world_size,
                device=device,
                hooks=hooks,
                checkpoints=self.checkpoints,
            )
            building = False
            self._trainer = trainer
            with self._lock:
                self._phase = WorkerPhase.TRAINING
                self._step = trainer.step
                self._last_progress = time.time()
            summary = trainer.train(
                should_stop=self._should_stop, save_on_stop=lambda: self._save_on_stop
            )
            stopped = self._stop.is_set()  # a pause, a cancel or a planned restart asked
            with self._lock:
                self._summary = summary
                self._step = trainer.step
                self._phase = WorkerPhase.STOPPED if stopped else WorkerPhase.DONE
            if stopped:
                log.info("rank %d stopped after step %d, as asked", self.rank, trainer.step)
            else:
                log.info("rank %d finished training: %s", self.rank, summary_line(summary))
            self._profiler.abandon()  # stopped before a profile's last step: it is not kept
            leave_world()
        except BaseException as err:  # reported through poll(), never lost in a thread
            failed = True
            self._profiler.abandon()
            abandon_world()
            with self._lock:
                self._error = f"{type(err).__name__}: {err}"
                self._deterministic = is_deterministic(err, while_building=building)
                if isinstance(err, NonFiniteLoss):
                    self._nonfinite = NonFiniteStep(err.step, err.batch, err.loss)
                self._phase = WorkerPhase.FAILED
            log.error("rank %d failed:\n%s", self.rank, traceback.format_exc())
        if failed:  # out of the except block: the error's frames no longer hold the trainer
            trainer = None
            self._leave_failed_world()

    def _leave_failed_world(self) -> None:
        """Drop the failed world's model and optimizer (a recovery in place builds new
        ones in this process); saves still in flight are kept, for settle() to wait for."""
        if self._trainer is not None:
            self._saves = self._trainer.checkpoints.in_flight()
        self._trainer = None
        gc.collect()  # FSDP's modules and hooks hold one another in cycles
        empty_device_cache()

    def _should_stop(self, step: int) -> bool:
        return self._stop.is_set()

    def _on_event(self, event: Event) -> None:
        log.info("%s", event.message)
        if self.rank == 0:
            with self._lock:
                self._events.append(event)

    def _on_checkpoint(self, commit: dict[str, Any]) -> None:
        with self._lock:
            self._commits.append(CheckpointCommit.from_summary(commit))

    def _on_step(self, step: int) -> None:
        if self._trainer is not None:  # a hang fault stops here: the step never counts
            self._faults.before_step_done(self._trainer.parts.parameters)
        self._profiler.after_step(step)
        with self._lock:
            self._step = step
            self._last_progress = time.time()

    def _heartbeat(self) -> None:
        """Progress short of a finished step (an async push): not hung."""
        with self._lock:
            self._last_progress = time.time()

    def _on_metrics(self, metrics: dict[str, Any]) -> None:
        metrics["time"] = time.time()  # when the step ended: submit -> first step is timed by it
        if self._metrics_file is not None:  # once per logged step: cheap next to a step
            with self._metrics_file.open("a", encoding="utf-8") as out:
                out.write(json.dumps(metrics) + "\n")
        with self._lock:
            self._loss = metrics["loss"]
            if self.rank == 0:
                self._unsent.append(metrics)
        log.info("step %d loss %.4f", metrics["step"], metrics["loss"])

    def poll(self) -> WorkerStatus:
        """Status now, plus (rank 0) the metrics logged since the previous poll."""
        with self._lock:
            status = WorkerStatus(
                rank=self.rank,
                phase=self._phase,
                step=self._step,
                loss=self._loss,
                last_progress=self._last_progress,
                error=self._error,
                deterministic=self._deterministic,
                metrics=self._unsent,
                events=self._events,
                checkpoints=self._commits,
                summary=self._summary,
                nonfinite=self._nonfinite,
            )
            self._unsent, self._events, self._commits = [], [], []
        return status

    def inject_fault(self, kind: str) -> None:
        """Chaos testing (admins, through the supervisor): see workers/runtime/faults.py."""
        self._faults.inject(FaultKind(kind))

    def profile(self, profile_id: str, steps: int) -> None:
        """Record the next `steps` steps with torch.profiler (workers/runtime/profiling.py)."""
        self._profiler.arm(self._profiles_dir / profile_id, steps)

    def stop(self, save: bool = False) -> None:
        """Finish the current step, then stop (after a checkpoint if `save`)."""
        self._save_on_stop = save
        self._stop.set()


def summary_line(summary: dict[str, Any]) -> str:
    """A finished run's summary as a person reads it in the job's log."""
    said = [f"{summary['steps']} steps"]
    if summary.get("final_loss") is not None:
        said.append(f"final loss {summary['final_loss']:.4f}")
    if summary.get("tokens_per_s"):
        said.append(f"{summary['tokens_per_s']:,.0f} tokens/s")
    said.append(f"layout {summary['layout']}")
    return ", ".join(said)
