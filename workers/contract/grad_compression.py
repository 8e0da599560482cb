"""`parallel.grad_compression`: how data-parallel ranks send each other their gradients.

`none` all-reduces them as they are (fp32). `bf16` halves the bytes on every layout.
`powersgd` sends a rank-R approximation of each gradient matrix (PowerSGD, Vogels et al.
2019, with error feedback: what a step's approximation dropped is added to the next
step's gradient), through DDP's communication hook, so only layouts that train under DDP
take it. Pure pydantic: no torch.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Self

from pydantic import Field, model_validator

from shardline.workers.contract.strict import _Strict

POWERSGD_ONLY = ("rank", "warmup_steps")


class GradCompressionKind(StrEnum):
    none = "none"
    bf16 = "bf16"
    powersgd = "powersgd"


class GradCompression(_Strict):
    kind: GradCompressionKind = GradCompressionKind.none
    # PowerSGD: the rank of each matrix's approximation; the bytes sent grow with it.
    rank: Annotated[int, Field(ge=1, le=1024)] = 4
    # PowerSGD: plain all-reduce for the first steps, whose gradients steer the whole run
    # (PyTorch's start_powerSGD_iter; it must be at least 2 with error feedback).
    warmup_steps: Annotated[int, Field(ge=2, le=10_000_000)] = 10

    @model_validator(mode="after")
    def _check(self) -> Self:
        # Compared with the defaults, not with the fields given: a stored spec is read
        # back with every field set.
        defaults = GradCompression.model_fields
        given = [f for f in POWERSGD_ONLY if getattr(self, f) != defaults[f].default]
        if given and self.kind != GradCompressionKind.powersgd:
            raise ValueError(
                f"parallel.grad_compression.{given[0]} applies only to kind 'powersgd' "
                f"(this is kind '{self.kind.value}'); drop it or set kind: powersgd"
            )
        return self
