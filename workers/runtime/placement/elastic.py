"""Elastic re-planning: the layouts a job may shrink to when it cannot get all its ranks.

Only the data-parallel degree changes (tp and pp stay, so every tensor-parallel group and
pipeline keeps its shape); the global batch stays, so each data-parallel rank accumulates
more micro-batches. The batch of a step depends only on (seed, step), so a shrunk job
trains on exactly the data it would have seen, and its losses continue unchanged.
"""

from __future__ import annotations

from pydantic import ValidationError

from workers.contract.spec import JobSpec


def with_dp(spec: JobSpec, dp: int) -> JobSpec:
    """`spec` with `dp` data-parallel ranks (validated: raises ValueError if it cannot)."""
    data = spec.model_dump(mode="json")
    data["parallel"]["dp"] = dp
    try:
        return JobSpec.model_validate(data)
    except ValidationError as err:
        raise ValueError(f"cannot run {spec.name} at dp={dp}: {err}") from err


def smaller_layouts(spec: JobSpec, full_dp: int) -> list[int]:
    """The dp degrees below the current one the job may shrink to, largest first: down to
    `fault_tolerance.elastic.min_dp`, each one that keeps the global batch whole."""
    elastic = spec.fault_tolerance.elastic
    if elastic is None:
        return []
    found = []
    for dp in range(min(spec.parallel.dp, full_dp) - 1, elastic.min_dp - 1, -1):
        try:
            with_dp(spec, dp)
        except ValueError:
            continue
        found.append(dp)
    return found
