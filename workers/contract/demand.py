"""What a job asks of the cluster, computed once: one rank's bundle and the whole job.

The scheduler admits by it, the API checks quotas with it, the Ray runtime refuses jobs
that can never fit by it, and the worker group reserves its placement group with it.
No torch, no Ray.
"""

from __future__ import annotations

from typing import Any

from workers.contract.spec import JobSpec

RESOURCE_NAMES = ("CPU", "GPU")
Resources = dict[str, float]


def bundle_resources(spec: JobSpec) -> Resources:
    """What one rank reserves (its placement-group bundle)."""
    res = {"CPU": spec.resources.cpus_per_worker}
    if spec.resources.gpus_per_worker > 0:
        res["GPU"] = spec.resources.gpus_per_worker
    return res


def job_demand(spec: JobSpec) -> Resources:
    """Total resources of a job's placement group: every rank's bundle."""
    return _total(spec.parallel.world_size, bundle_resources(spec))


def stored_demand(spec: Any) -> Resources:
    """A started job's resources read from its stored spec as it is, for a spec that no
    longer validates (best effort: zero where it cannot be read)."""
    try:
        par, res = spec.get("parallel", {}), spec.get("resources", {})
        ranks = int(par.get("dp", 1)) * int(par.get("tp", 1)) * int(par.get("pp", 1))
        bundle = {
            "CPU": float(res.get("cpus_per_worker", 1.0)),
            "GPU": float(res.get("gpus_per_worker", 0.0)),
        }
        return _total(ranks, bundle)
    except (AttributeError, TypeError, ValueError, OverflowError):
        return {k: 0.0 for k in RESOURCE_NAMES}


def _total(ranks: int, bundle: Resources) -> Resources:
    return {k: bundle.get(k, 0.0) * ranks for k in RESOURCE_NAMES}


def describe(resources: Resources) -> str:
    """ "8 CPU, 4 GPU": the amounts a message names (CPU always, GPU when asked for)."""
    return ", ".join(
        f"{resources.get(k, 0):g} {k}" for k in RESOURCE_NAMES if resources.get(k, 0) or k == "CPU"
    )


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
    if not fits(demand, total):
        return (
            f"the job needs {describe(demand)} ({spec.parallel.world_size} ranks x "
            f"{describe(bundle_resources(spec))}) but the whole cluster has "
            f"{describe(total)}; use fewer ranks or smaller resources"
        )
    return None


def fits(demand: Resources, free: Resources) -> bool:
    return all(demand.get(k, 0) <= free.get(k, 0) + 1e-9 for k in RESOURCE_NAMES)
