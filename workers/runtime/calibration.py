"""The cost model's rates measured on a cluster node: the body of the control plane's
calibration task (POST /v1/cluster/calibrate), which runs where a rank would."""

from __future__ import annotations

import os
from typing import Any

from shardline.workers.contract.spec import JobSpec


def calibrate_here(spec: JobSpec, ranks: int) -> dict[str, Any]:
    """`shardline plan --calibrate`'s measurement on this node, as JSON."""
    if spec.resources.gpus_per_worker == 0:
        # Ray leaves a task without GPUs its node's GPUs visible: measure the CPU, as a
        # CPU job's ranks run (the control plane checks the device it got, too).
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from shardline.workers.engine.calibrate import calibrate  # torch: only on the node

    return calibrate(spec, ranks).to_json()
