"""Mixed precision: autocast for compute, fp32 master weights, and fp16 loss scaling.

Parameters and gradients stay fp32 in every mode, so gradient reduction is fp32; autocast
runs matmuls in bf16 or fp16. The loss scaler is ours rather than torch.amp.GradScaler
because with sharded gradients (ZeRO-2/3, and later tp/pp) each rank sees only part of the
gradient: the inf/nan verdict must be agreed by all ranks or they would diverge.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from shardline.workers.contract.sections import Precision
from shardline.workers.engine.dtensor import local_part

AUTOCAST_DTYPES = {Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}


@contextlib.contextmanager
def autocast(precision: Precision, device: torch.device) -> Iterator[None]:
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def local_grads(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """This rank's part of every gradient (the local shard of a DTensor)."""
    return [local_part(p.grad) for p in params if p.grad is not None]


class DynamicLossScaler:
    """Scale the loss up so fp16 gradients do not underflow; back off on inf/nan.

    A step whose gradients hold an inf or nan anywhere in the world is skipped, the scale is
    halved and the skip counted. After `growth_interval` clean steps the scale doubles.
    """

    def __init__(
        self,
        enabled: bool,
        init_scale: float = 2.0**16,
        growth_interval: int = 200,
        min_scale: float = 1.0,
    ) -> None:
        self.enabled = enabled
        self.scale = init_scale if enabled else 1.0
        self.growth_interval = growth_interval
        self.min_scale = min_scale
        self.clean_steps = 0
        self.skipped_steps = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    def unscale_and_check(self, params: Iterable[torch.Tensor]) -> bool:
        """Divide gradients by the scale; True if any rank found an inf or nan."""
        if not self.enabled:
            return False
        grads = local_grads(params)
        device = grads[0].device if grads else torch.device("cpu")
        finite = torch.stack([g.isfinite().all() for g in grads]).all() if grads else None
        found = torch.zeros(1, device=device) if finite is None else (~finite).float().view(1)
        if dist.is_initialized():
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        if found.item() > 0:
            return True
        torch._foreach_mul_(grads, 1.0 / self.scale)
        return False

    def update(self, found_inf: bool) -> None:
        if not self.enabled:
            return
        if found_inf:
            self.scale = max(self.scale / 2.0, self.min_scale)
            self.clean_steps = 0
            self.skipped_steps += 1
            return
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval:
            self.scale *= 2.0
            self.clean_steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "clean_steps": self.clean_steps,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.clean_steps = int(state["clean_steps"])
        self.skipped_steps = int(state["skipped_steps"])


def finite_or_none(value: float) -> float | None:
    """JSON has no inf or nan: report those as null."""
    return value if math.isfinite(value) else None
