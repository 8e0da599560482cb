"""What a job asks of the cluster, computed once: one rank's bundle and the whole job.

The scheduler admits by it, the API checks quotas with it, the Ray runtime refuses jobs
that can never fit by it, and the worker group reserves its placement group with it.
No torch, no Ray.

CPU and GPU are what the placement group reserves. Host memory is admitted against too
(where the cluster reports it, as Ray does) but not reserved: it is an estimate of what the
job's processes will hold, warm spares included, so that the scheduler does not start a job
whose processes the nodes cannot hold.
"""

from __future__ import annotations

from typing import Any

from shardline.workers.contract.spec import JobSpec

RESOURCE_NAMES = ("CPU", "GPU", "memory")
# Admitted against only where the cluster reports it: a cluster that reports no memory
# (no runtime, a test's made-up cluster) holds nothing back for it.
MEASURED_ONLY = ("memory",)
Resources = dict[str, float]

# Resident memory of one rank's process before its model: Python, torch, gloo and Ray's
# worker (bench/exports_and_cancel.py: a tiny dp=2 rank 412 MiB resident, 283 unique; its
# warm spare 283 and 177), rounded up for bigger models' activations and buffers.
PROCESS_BYTES = 512 << 20
# fp32 weights, gradients and two Adam moments: what training holds per parameter.
TRAINING_BYTES_PER_PARAM = 16


def warm_spares_wanted(spec: JobSpec) -> bool:
    """Whether the job's next attempt is started ahead (workers/runtime/spares.py): asked
    for, on CPU ranks (a spare holds no GPU), and only where a restart may follow."""
    ft = spec.fault_tolerance
    return ft.warm_spares and ft.max_failures > 0 and spec.resources.gpus_per_worker == 0


def snapshots_wanted(spec: JobSpec) -> bool:
    """Whether the job takes in-memory snapshots: every N steps where asked, and by
    default ("auto") wherever a restart may follow."""
    every = spec.checkpoint.memory_every_steps
    if every == "auto":
        return spec.fault_tolerance.max_failures > 0
    return every > 0


def host_memory(spec: JobSpec, ranks: int | None = None) -> float:
    """Bytes of host memory the job's processes hold at least: each rank's process and
    its warm spare, and on CPU ranks the training state (sharding spreads it over ranks
    but does not shrink it), twice where in-memory snapshots keep a copy. `ranks`: on
    that many ranks instead of the spec's world."""
    world = spec.parallel.world_size if ranks is None else ranks
    processes = world * (2 if warm_spares_wanted(spec) else 1)
    state = 0
    if spec.resources.gpus_per_worker == 0:
        state = spec.model.parameter_count() * TRAINING_BYTES_PER_PARAM
        if snapshots_wanted(spec):
            state *= 2
    return float(processes * PROCESS_BYTES + state)


def bundle_resources(spec: JobSpec) -> Resources:
    """What one rank reserves (its placement-group bundle)."""
    res = {"CPU": spec.resources.cpus_per_worker}
    if spec.resources.gpus_per_worker > 0:
        res["GPU"] = spec.resources.gpus_per_worker
    return res


def job_demand(spec: JobSpec) -> Resources:
    """Total resources of a job: every rank's bundle, and the host memory it will hold."""
    demand = _total(spec.parallel.world_size, bundle_resources(spec))
    demand["memory"] = host_memory(spec)
    return demand


def elastic_min_ranks(spec: JobSpec) -> int | None:
    """The fewest ranks an elastic job goes on with: `min_dp` replicas of the model
    parallel group it asked for (None if it is not elastic)."""
    elastic = spec.fault_tolerance.elastic
    if elastic is None:
        return None
    return elastic.min_dp * spec.parallel.tp * spec.parallel.pp


def admission_demand(spec: JobSpec) -> Resources:
    """What a queued job needs free to be admitted: its whole demand, or an elastic job's
    on its fewest ranks (it starts on what there is and grows when capacity comes)."""
    ranks = elastic_min_ranks(spec)
    if ranks is None or ranks >= spec.parallel.world_size:
        return job_demand(spec)
    demand = _total(ranks, bundle_resources(spec))
    demand["memory"] = host_memory(spec, ranks)
    return demand


def stored_demand(spec: Any) -> Resources:
    """A started job's resources read from its stored spec as it is, for a spec that no
    longer validates (best effort: zero where it cannot be read)."""
    try:
        par, res = spec.get("parallel", {}), spec.get("resources", {})
        ranks = int(par.get("dp", 1)) * int(par.get("tp", 1)) * int(par.get("pp", 1))
        bundle = {
            "CPU": float(res.get("cpus_per_worker", 1.0)),
            "GPU": float(res.get("gpus_per_worker", 0.0)),
            "memory": float(PROCESS_BYTES),
        }
        return _total(ranks, bundle)
    except (AttributeError, TypeError, ValueError, OverflowError):
        return {k: 0.0 for k in RESOURCE_NAMES}


def _total(ranks: int, bundle: Resources) -> Resources:
    return {k: bundle.get(k, 0.0) * ranks for k in RESOURCE_NAMES}


def describe(resources: Resources, *, memory: bool = False) -> str:
    """ "8 CPU, 4 GPU": the amounts a message names (CPU always, GPU when asked for, host
    memory when `memory`, since it is the one resource estimated rather than reserved)."""
    parts = [
        f"{resources.get(k, 0):g} {k}" for k in ("CPU", "GPU") if resources.get(k, 0) or k == "CPU"
    ]
    if memory:
        parts.append(f"{resources.get('memory', 0) / 2**30:.1f} GiB of host memory")
    return ", ".join(parts)


def counted(name: str, reported: Resources | Any) -> bool:
    """Whether resource `name` is admitted against, given what the cluster `reported`:
    always for CPU and GPU (absent is none), a MEASURED_ONLY one only where reported."""
    return name not in MEASURED_ONLY or name in reported


def short_of(demand: Resources, free: Resources) -> list[str]:
    """The resources `free` has too little of for `demand`."""
    return [
        k for k in RESOURCE_NAMES if counted(k, free) and demand.get(k, 0) > free.get(k, 0) + 1e-9
    ]


def cluster_refusal(spec: JobSpec, total: Resources) -> str | None:
    """Why the whole cluster (`total`) could never hold the job, or None. A GPU job on a
    cluster without GPUs is told so, not handed a count of CPUs."""
    demand, ranks = job_demand(spec), spec.parallel.world_size
    rank_s = f"{ranks} rank{'s' if ranks != 1 else ''}"
    if demand["GPU"] > 0 and total.get("GPU", 0.0) <= 0:
        return (
            f"the job asks for {demand['GPU']:g} GPU (resources.gpus_per_worker="
            f"{spec.resources.gpus_per_worker:g} x {rank_s}) but this "
            "cluster has no GPUs; add GPU nodes, or leave resources.gpus_per_worker out to "
            "train on CPUs"
        )
    short = short_of(demand, total)
    if short == ["memory"]:
        spares = " and as many warm spares" if warm_spares_wanted(spec) else ""
        return (
            f"the job's processes would hold at least {demand['memory'] / 2**30:.1f} GiB of "
            f"host memory ({rank_s}{spares} at {PROCESS_BYTES >> 20} MiB each, and the "
            f"training state on CPU ranks) but the whole cluster has "
            f"{total['memory'] / 2**30:.1f} GiB; use fewer ranks, or turn warm spares off "
            "(fault_tolerance.warm_spares: false)"
        )
    if short:
        mem = "memory" in short
        return (
            f"the job needs {describe(demand, memory=mem)} ({spec.parallel.world_size} ranks "
            f"x {describe(bundle_resources(spec))}) but the whole cluster has "
            f"{describe(total, memory=mem)}; use fewer ranks or smaller resources"
        )
    return None


def core_share_refusal(spec: JobSpec, cores: float, min_share: float) -> str | None:
    """Why the job's ranks cannot each get a useful share of the cluster's `cores` (real
    cores, not Ray's logical CPUs), or None. Below `min_share` of a core, a rank's steps
    and collectives crawl and its heartbeats time out: the job would load the host for
    nothing."""
    ranks = spec.parallel.world_size
    if ranks <= 1 or cores <= 0 or cores / ranks >= min_share - 1e-9:
        return None
    most = max(1, int(cores / min_share + 1e-9))
    return (
        f"the job's {ranks} ranks would share the cluster's {cores:g} CPU cores, "
        f"{cores / ranks:.2f} of a core each; a rank needs at least {min_share:g} of a "
        f"core (SHARDLINE_MIN_CORE_SHARE) to keep up with its collectives: use at most "
        f"{most} ranks (parallel.dp x tp x pp), or add nodes"
    )
