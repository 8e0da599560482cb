"""The Ray runtime: the control plane's connection to the cluster, its scheduler and
reconciler loops, and the supervisors they start, read and remove."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

import ray
from ray.util import placement_group_table

from shardline.service.cluster_view import nodes_view
from shardline.service.config import Settings
from shardline.service.models import Job
from shardline.service.quotas import resource_limits
from shardline.service.rates import RatesBook
from shardline.service.reconciler import Reconciler
from shardline.service.runtime import ClusterInfo, FaultNotDelivered
from shardline.service.scheduler import Scheduler, host_memory_refusal
from shardline.service.store import JobStore
from shardline.service.warm_pool import idle_pool_bytes, start_warm_pool
from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.demand import (
    RESOURCE_NAMES,
    bundle_resources,
    cluster_refusal,
    core_share_refusal,
    counted,
    describe,
)
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.progress import ProgressRead
from shardline.workers.contract.rates import Rates
from shardline.workers.contract.spec import JobSpec
from shardline.workers.runtime import cluster_rates
from shardline.workers.runtime.actors import SupervisorActor
from shardline.workers.runtime.calibration import calibrate_here
from shardline.workers.runtime.names import CORES_LABEL, HEAD_RESOURCE, NAMESPACE, supervisor_name

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 10.0
CALIBRATE_TIMEOUT_S = 600.0


class RaySupervisors:
    """Finding, starting, reading and removing supervisors by their actor names."""

    def __init__(self, settings: Settings, access: DataAccess | None = None) -> None:
        self.settings = settings
        # Every actor a supervisor starts inherits its runtime_env, so each worker reads
        # the data roots from its environment when it opens a file.
        # So do their limits on each call to object storage.
        env = {**(access or DataAccess()).env_vars(), **settings.storage_limits.env_vars()}
        self.runtime_env = {"env_vars": env}
        # Named-actor lookups go to the GCS; the reconciler asks several times per tick.
        # A handle is dropped when its actor fails a call or is removed.
        self._handles: dict[str, Any] = {}

    def _handle(self, job_id: str) -> Any | None:
        if job_id not in self._handles:
            try:
                self._handles[job_id] = ray.get_actor(supervisor_name(job_id), namespace=NAMESPACE)
            except ValueError:
                return None
        return self._handles[job_id]

    def exists(self, job_id: str) -> bool:
        return self._handle(job_id) is not None

    def launch(self, job: Job) -> None:
        """Create the job's detached supervisor (or reuse it) and start its loop."""
        handle: Any = self._handle(job.id)
        if handle is None:
            # Validated when it was submitted; read back, it crosses Ray as the object.
            spec = JobSpec.model_validate(job.spec)
            handle = SupervisorActor.options(
                name=supervisor_name(job.id),
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                runtime_env=self.runtime_env,
                # On the head node (the one node every deployment keeps), not on a worker
                # node that a preemption or a node loss takes along with the job's ranks.
                # By its node resource, as Ray pins its own services: a hard node affinity
                # slowed the job's start and kept its warm spares from being used, a soft
                # one still put it on the node being drained.
                resources={HEAD_RESOURCE: 0.001},
            ).remote(
                self.settings.job_layout(job.id),
                spec,
                # What the database holds: a replacement supervisor replays the rest, and
                # goes on counting the job's failures from there.
                recorded_step=job.current_step,
                failures=job.failures,
                # A job RESTARTING with no supervisor lost it: the new one times the recovery.
                recovering=job.state == JobState.RESTARTING,
            )
        ray.get(handle.start.remote(), timeout=60)

    def read(self, job_id: str, after_seq: int) -> ProgressRead | None:
        handle = self._handle(job_id)
        if handle is None:
            return None
        try:
            return ray.get(handle.read.remote(after_seq), timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as err:
            log.warning("job %s: supervisor did not answer (%s)", job_id, type(err).__name__)
            if isinstance(err, ray.exceptions.RayActorError):
                self._handles.pop(job_id, None)  # look it up afresh: it may be gone
            return None

    def cancel(self, job_id: str) -> None:
        handle = self._handle(job_id)
        if handle is not None:
            handle.cancel.remote()

    def pause(self, job_id: str) -> None:
        handle = self._handle(job_id)
        if handle is not None:
            handle.pause.remote()

    def inject_fault(self, job_id: str, kind: str, rank: int) -> None:
        self._deliver(job_id, "the fault", "inject_fault", kind, rank)

    def profile(self, job_id: str, profile_id: str, steps: int) -> int:
        return int(self._deliver(job_id, "the profile", "profile", profile_id, steps))

    def _deliver(self, job_id: str, what: str, method: str, *args: Any) -> Any:
        """Call a RUNNING job's supervisor and wait: FaultNotDelivered if it did not take it."""
        handle = self._handle(job_id)
        if handle is None:
            raise FaultNotDelivered(f"job {job_id} has no supervisor running")
        try:
            return ray.get(getattr(handle, method).remote(*args), timeout=CALL_TIMEOUT_S * 4)
        except ray.exceptions.RayTaskError as err:  # refused there (not RUNNING, ...)
            raise FaultNotDelivered(str(err.cause if err.cause else err)) from None
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as err:
            raise FaultNotDelivered(
                f"job {job_id}'s supervisor did not take {what} ({type(err).__name__})"
            ) from None

    def remove(self, job_id: str) -> None:
        """Kill the supervisor (its workers and placement group are already gone)."""
        handle = self._handle(job_id)
        self._handles.pop(job_id, None)
        if handle is not None:
            ray.kill(handle, no_restart=True)
            log.info("job %s: supervisor removed", job_id)


# How long a stopping control plane waits for the jobs being cancelled to end: within the
# 30 s Kubernetes and systemd give a process by default, with room for uvicorn's own drain.
CANCEL_GRACE_S = 20.0


class RayRuntime:
    def __init__(self, settings: Settings, store: JobStore, address: str) -> None:
        self.settings = settings
        self.store = store
        self.address = address
        self.supervisors = RaySupervisors(
            settings,
            DataAccess.of(settings.data_roots, settings.private_dirs),
        )
        self.scheduler = Scheduler(
            store,
            cluster_total=self._admission_total,
            launch=self._launch,
            discard=self.supervisors.remove,
            quota_limits=resource_limits(settings),
        )
        self.reconciler = Reconciler(store, self.supervisors, on_freed=self.scheduler.wake)

    def start(self) -> None:
        if not ray.is_initialized():
            # ray.init replaces the SIGTERM handler (in C++ and in Python) with one that
            # aborts the process; the server's own handler shuts down gracefully instead
            # (what `docker stop`, systemd and Kubernetes rely on), so put it back.
            in_main = threading.current_thread() is threading.main_thread()
            previous = signal.getsignal(signal.SIGTERM) if in_main else None
            self._connect()
            if in_main and previous is not None:
                signal.signal(signal.SIGTERM, previous)
        log.info("connected to Ray at %s: %s", self.address, self._total())
        for row in RatesBook(self.store.db).stored():  # what supervisors re-plan with
            self.share_rates(row.kind, Rates.from_json(row.rates))
        self.reconciler.start()
        self.scheduler.start()
        start_warm_pool(self.settings, self.supervisors.runtime_env)

    def _connect(self) -> None:
        """ray.init, tried again until ray_connect_timeout_s: a head that is still starting
        refuses connections, and a Ray Client's per-client server can fail to start once
        on a loaded head; a server that exits then leaves compose to restart it blind."""
        deadline = time.monotonic() + self.settings.ray_connect_timeout_s
        attempt = 0
        while True:
            attempt += 1
            try:
                ray.init(
                    address=self.address,
                    namespace=NAMESPACE,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                )
                return
            except (ConnectionError, TimeoutError) as exc:
                ray.shutdown()  # a half-made client context would refuse the next init
                wait = min(2.0**attempt, 10.0)
                if time.monotonic() + wait > deadline:
                    raise
                log.warning(
                    "Ray at %s did not answer (attempt %d: %s); trying again in %.0f s",
                    self.address,
                    attempt,
                    (str(exc).strip().splitlines() or [type(exc).__name__])[-1],
                    wait,
                )
                time.sleep(wait)

    def stop(self) -> None:
        self.scheduler.stop()  # no job starts from here on
        self._finish_cancels(CANCEL_GRACE_S)
        self.reconciler.stop()
        # Supervisors are detached: they keep training while the control plane is away.
        ray.shutdown()

    def _finish_cancels(self, grace_s: float) -> None:
        """Give the jobs being cancelled up to `grace_s` to end and be recorded: a cancel is
        what a user asked last, and a job left CANCELLING would keep its supervisor and
        (for a local head) the head itself running until the next serve."""
        deadline = time.monotonic() + grace_s
        while True:
            try:
                cancelling = [
                    j.id for j in self.store.active_jobs() if j.state == JobState.CANCELLING
                ]
            except Exception as err:  # the database is away: nothing can be recorded
                log.warning("could not finish the cancels before stopping: %s", err)
                return
            if not cancelling:
                return
            if time.monotonic() > deadline:
                log.warning(
                    "job(s) %s still cancelling after %.0f s; the next `shardline serve` "
                    "finishes the cancel",
                    ", ".join(cancelling),
                    grace_s,
                )
                return
            self.reconciler.wake()
            time.sleep(0.2)

    def inject_fault(self, job_id: str, kind: str, rank: int) -> None:
        self.supervisors.inject_fault(job_id, kind, rank)

    def profile(self, job_id: str, profile_id: str, steps: int) -> int:
        return self.supervisors.profile(job_id, profile_id, steps)

    def queue_changed(self) -> None:
        self.scheduler.wake()

    def share_rates(self, kind: str, rates: Rates) -> None:
        cluster_rates.publish(kind, rates)

    def calibrate(self, spec: JobSpec, ranks: int) -> Rates:
        # On a node with the job's devices, like one of its ranks; a CPU core's share only
        # (it measures one core, and its all-reduce processes are its own children).
        gpus = spec.resources.gpus_per_worker
        task = ray.remote(num_cpus=1, num_gpus=gpus)(calibrate_here)
        answer = task.options(runtime_env=self.supervisors.runtime_env).remote(spec, ranks)
        try:
            return Rates.from_json(ray.get(answer, timeout=CALIBRATE_TIMEOUT_S))
        except ray.exceptions.GetTimeoutError:
            ray.cancel(answer, force=True)  # or it goes on beside the next calibration
            raise TimeoutError(
                f"the calibration task did not end within {CALIBRATE_TIMEOUT_S:.0f} s"
            ) from None

    def _launch(self, job: Job) -> None:
        self.supervisors.launch(job)

    def _total(self) -> dict[str, float]:
        res = ray.cluster_resources()
        return {k: float(res.get(k, 0.0)) for k in RESOURCE_NAMES if counted(k, res)}

    def _admission_total(self) -> dict[str, float]:
        """What the scheduler admits against: the cluster's resources, less the host
        memory of the warm pool's idle processes (no job's, but held all the same)."""
        total = self._total()
        if "memory" in total:
            total["memory"] = max(0.0, total["memory"] - idle_pool_bytes())
        return total

    def cluster(self) -> ClusterInfo:
        available = ray.available_resources()
        return ClusterInfo(
            runtime="ray",
            connected=True,
            message=f"Ray at {self.address}",
            resources=self._total(),
            available={k: float(available.get(k, 0.0)) for k in RESOURCE_NAMES},
            nodes=nodes_view(ray.nodes(), placement_group_table()),
        )

    def refusal(self, spec: JobSpec) -> str | None:
        total = self._total()
        too_big = host_memory_refusal(spec, total.get("GPU", 0.0))
        if too_big is not None:
            return too_big
        never = cluster_refusal(spec, total)
        if never is not None:
            return never
        bundle = bundle_resources(spec)
        alive = [n for n in ray.nodes() if n.get("Alive")]
        crowded = core_share_refusal(
            spec, sum(node_cores(n) for n in alive), self.settings.min_core_share
        )
        if crowded is not None:
            return crowded
        nodes = [n["Resources"] for n in alive]
        if not any(all(bundle.get(k, 0) <= n.get(k, 0) for k in bundle) for n in nodes):
            return (
                f"one rank needs {describe(bundle)} but no node has that much; lower "
                "resources.cpus_per_worker or resources.gpus_per_worker"
            )
        return None


def node_cores(node: dict[str, Any]) -> float:
    """A Ray node's real CPU cores: its CORES_LABEL where its `ray start` set one (the
    embedded head does: it declares more logical CPUs than the host has cores), else its
    logical CPUs, which Ray sets to the cores unless told otherwise."""
    label = (node.get("Labels") or {}).get(CORES_LABEL)
    cpus = float(node.get("Resources", {}).get("CPU", 0.0))
    try:
        return float(label) if label else cpus
    except ValueError:
        return cpus
