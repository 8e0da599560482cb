"""The cost model's rates measured on a cluster node: the body of the control plane's
calibration task (POST /v1/cluster/calibrate), which runs where a rank would."""

from __future__ import annotations

from typing import Any

from workers.contract.spec import JobSpec


def calibrate_here(spec_json: str, ranks: int) -> dict[str, Any]:
    """`shardline plan --calibrate`'s measurement on this node, as JSON."""
    from workers.engine.calibrate import calibrate  # torch: only on the node

    return calibrate(JobSpec.model_validate_json(spec_json), ranks).to_json()
