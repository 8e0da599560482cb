"""Reading tensors that may be DTensors (sharded by FSDP or tensor parallelism)."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def local_part(t: torch.Tensor) -> torch.Tensor:
    """This rank's part: the local shard of a DTensor, or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def plain(value: torch.Tensor) -> torch.Tensor:
    """A (replicated) DTensor's value as an ordinary tensor."""
    return value.full_tensor() if isinstance(value, DTensor) else value
