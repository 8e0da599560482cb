"""Learning-rate schedule: linear warmup, then cosine decay to min_lr at the last step.

A function of the step alone: the trainer sets it before every optimizer step, so a resumed
run needs nothing but the step to continue the schedule.
"""

from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """The learning rate used for optimizer step `step` (1-based)."""
    if warmup_steps and step <= warmup_steps:
        return lr * step / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / decay_steps, 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
