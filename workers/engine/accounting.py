"""What a rank holds in memory, and how close it runs to the hardware's peak."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from shardline.workers.contract.memory_model import KINDS
from shardline.workers.engine.dtensor import local_part
from shardline.workers.engine.optimizer import Optimizers

# bf16 dense peak FLOP/s per device (vendor datasheets, without sparsity).
BF16_PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "L4": 121e12,
}


# What memory_held counts, in its order: the memory model's kinds.
MEMORY_KINDS = KINDS


def _bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def memory_held(
    params: Iterable[torch.Tensor],
    optimizers: Optimizers,
    more_optim: Iterable[torch.Tensor] = (),
) -> dict[str, int]:
    """Bytes this rank holds in parameters, gradients and optimizer state right now
    (`more_optim`: state beside the optimizers', local SGD's anchors and momentum)."""
    params = list(params)
    return {
        "params": _bytes(local_part(p) for p in params),
        "grads": _bytes(local_part(p.grad) for p in params if p.grad is not None),
        "optim": _bytes(optimizers.state_tensors()) + _bytes(more_optim),
    }


def peak_flops(device: torch.device) -> float | None:
    """The device's bf16 dense peak, or None where MFU means nothing (CPU, unknown GPU)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in BF16_PEAK_FLOPS.items():
        if key in name:
            return flops
    return None
