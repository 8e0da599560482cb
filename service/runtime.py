"""What the control plane asks of whatever runs jobs (the Ray runtime, or none)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from shardline.service.cluster_view import NodeInfo
from shardline.service.scheduler import host_memory_refusal
from shardline.workers.contract.rates import Rates
from shardline.workers.contract.spec import JobSpec


@dataclass(frozen=True)
class ClusterInfo:
    runtime: str
    connected: bool
    message: str
    resources: dict[str, float] = field(default_factory=dict)
    available: dict[str, float] = field(default_factory=dict)
    nodes: list[NodeInfo] = field(default_factory=list)


class FaultNotDelivered(RuntimeError):
    """A chaos-test fault or a profile could not reach the job (not running there); the
    API says 409."""


class NotOnCluster(RuntimeError):
    """What needs a cluster was asked of a server without one."""


class Runtime(Protocol):
    def cluster(self) -> ClusterInfo: ...

    def refusal(self, spec: JobSpec) -> str | None:
        """Why this job can never run on the cluster, or None if it could."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def inject_fault(self, job_id: str, kind: str, rank: int) -> None:
        """Have one rank of a running job fail as `kind` says (workers/runtime/faults.py)."""
        ...

    def profile(self, job_id: str, profile_id: str, steps: int) -> int:
        """Have every rank of a running job record its next `steps` steps with
        torch.profiler into the job's profiles/<profile_id> (FaultNotDelivered if not);
        how many ranks were asked (fewer than the spec's in a shrunk elastic job)."""
        ...

    def calibrate(self, spec: JobSpec, ranks: int) -> Rates:
        """The cost model's rates measured on a cluster node for `spec`'s model, its
        collectives among `ranks` processes (NotOnCluster without a cluster)."""
        ...

    def share_rates(self, kind: str, rates: Rates) -> None:
        """Let the cluster's supervisors plan with these calibrated rates (elastic re-plans)."""
        ...

    def queue_changed(self) -> None:
        """A job was queued or resumed: look for room now, not at the next scheduling
        tick (a submitted job starts up to a tick sooner)."""
        ...


class NoRuntime:
    """No cluster attached: jobs are stored and stay QUEUED."""

    def cluster(self) -> ClusterInfo:
        return ClusterInfo(
            runtime="none",
            connected=False,
            message="no runtime is attached to this server: submitted jobs stay QUEUED",
        )

    def refusal(self, spec: JobSpec) -> str | None:
        # No cluster to measure, but no cluster trains this on CPU ranks either.
        return host_memory_refusal(spec)

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def inject_fault(self, job_id: str, kind: str, rank: int) -> None:
        raise FaultNotDelivered("no runtime is attached to this server: no job runs")

    def profile(self, job_id: str, profile_id: str, steps: int) -> int:
        raise FaultNotDelivered("no runtime is attached to this server: no job runs")

    def calibrate(self, spec: JobSpec, ranks: int) -> Rates:
        raise NotOnCluster("no runtime is attached to this server: nothing to measure")

    def share_rates(self, kind: str, rates: Rates) -> None:
        return None

    def queue_changed(self) -> None:
        return None
