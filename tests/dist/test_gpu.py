"""On a CUDA machine: the engine trains with NCCL in bf16. Skipped where there is no GPU."""

from __future__ import annotations

import math

import pytest
import torch

from tests.dist.runs import run, tiny_spec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none here"),
]


def test_bf16_trains_on_one_gpu_and_reports_mfu() -> None:
    metrics, summary = run(tiny_spec(precision="bf16", train={"steps": 20}))
    assert all(math.isfinite(m["loss"]) for m in metrics)
    assert metrics[-1]["loss"] < 0.7 * metrics[0]["loss"]
    assert summary["layout"].endswith("bf16")
    if "H100" in torch.cuda.get_device_name() or "H200" in torch.cuda.get_device_name():
        assert summary["mfu"] is not None and 0 < summary["mfu"] < 1
