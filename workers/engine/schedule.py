"""Learning-rate schedule: linear warmup, then cosine decay to min_lr at the last step."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """The learning rate used for optimizer step `step` (1-based)."""
    if warmup_steps and step <= warmup_steps:
        return lr * step / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / decay_steps, 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    lr: float,
    min_lr: float,
    warmup_steps: int,
    total_steps: int,
) -> LambdaLR:
    """A LambdaLR (so its position is part of optimizer checkpoints) following `lr_at`.

    LambdaLR's epoch counter starts at 0 for the first step, hence the +1.
    """
    return LambdaLR(
        optimizer,
        lambda epoch: (
            lr_at(
                epoch + 1, lr=lr, min_lr=min_lr, warmup_steps=warmup_steps, total_steps=total_steps
            )
            / lr
        ),
    )
