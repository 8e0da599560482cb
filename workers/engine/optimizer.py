"""The optimizers of one rank: one AdamW per model part (pipeline stage), stepped together.

One per part, as torchtitan does, so every piece of optimizer state can be named after the
parameter it belongs to, by the model's own name in every layout: that is what lets a
checkpoint saved in one layout restore into another. The learning rate is set from the
schedule before each step (it is a function of the step alone), so it carries no state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from shardline.workers.engine.dtensor import local_part
from shardline.workers.engine.zero_one import ZeroOneOptimizer

log = logging.getLogger(__name__)

# Name segments that wrappers add and that are not part of the model's own names. Longest
# first: "module." is also the tail of the activation checkpointing wrapper's segment.
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "module.")


def model_name(wrapped_name: str) -> str:
    """A parameter's name in the plain model: without DDP, AC or compile wrapper segments."""
    for prefix in WRAPPER_PREFIXES:
        wrapped_name = wrapped_name.replace(prefix, "")
    return wrapped_name


class PartOptimizer(Protocol):
    @property
    def param_groups(self) -> list[dict[str, Any]]: ...
    @property
    def state(self) -> Any: ...

    def step(self) -> Any: ...
    def zero_grad(self, set_to_none: bool = True) -> None: ...


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    # Norm gains (1-D) are not decayed, as in every Llama recipe.
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


class Optimizers:
    """AdamW over each model part; with zero-1, over this rank's slices of them."""

    def __init__(
        self,
        parts: list[nn.Module],
        *,
        zero_stage: int,
        dp_mesh: DeviceMesh,
        state_mesh: DeviceMesh,
        lr: float,
        weight_decay: float,
        device: torch.device,
        fused: bool = True,
    ) -> None:
        kwargs: dict[str, Any] = {
            "lr": lr,
            "betas": (0.9, 0.95),
            "eps": 1e-8,
            # GPU only: on CPU the for-each update is kept, the one every CPU test
            # and benchmark so far has measured.
            "fused": fused and device.type == "cuda",
        }
        self.parts = parts
        self.optimizers: list[PartOptimizer] = []
        for part in parts:
            groups = _param_groups(part, weight_decay)
            if zero_stage == 1 and dp_mesh.size() > 1:
                self.optimizers.append(
                    ZeroOneOptimizer(
                        groups,
                        dp_mesh=dp_mesh,
                        state_mesh=state_mesh,
                        optimizer_class=torch.optim.AdamW,
                        **kwargs,
                    )
                )
            else:
                self.optimizers.append(torch.optim.AdamW(groups, **kwargs))

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def set_lr(self, lr: float) -> None:
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr

    def state_tensors(self) -> Iterator[torch.Tensor]:
        """This rank's part of every optimizer state tensor (for memory accounting)."""
        for opt in self.optimizers:
            for state in opt.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        yield local_part(value)

    # -- checkpointing -------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every state tensor keyed `<parameter name>.<key>` (DTensors where sharded).

        The values are the optimizer's own tensors, so loading into them restores in place;
        state that does not exist yet (no step taken) is created first.
        """
        out: dict[str, torch.Tensor] = {}
        for part, opt in zip(self.parts, self.optimizers, strict=True):
            ensure_state(opt.inner if isinstance(opt, ZeroOneOptimizer) else opt)
            names = {id(p): model_name(n) for n, p in part.named_parameters()}
            if isinstance(opt, ZeroOneOptimizer):
                out.update(opt.named_state(names))
                continue
            for param, state in opt.state.items():
                for key, value in state.items():
                    out[f"{names[id(param)]}.{key}"] = value
        return out

    def after_params_loaded(self) -> None:
        """Parameters changed under the optimizers (a restore): resync ZeRO-1's slices."""
        for opt in self.optimizers:
            if isinstance(opt, ZeroOneOptimizer):
                opt.refresh_from_params()


@torch.no_grad()
def ensure_state(opt: PartOptimizer) -> None:
    """Create Adam's state by a step that changes nothing (zero gradients, lr 0), then
    set its step count back to 0: the state is exactly that of an optimizer never stepped,
    ready to be loaded into."""
    params = [p for g in opt.param_groups for p in g["params"]]
    if all(p in opt.state for p in params):
        return
    saved_lr = [g["lr"] for g in opt.param_groups]
    grads = {p: p.grad for p in params}
    for group in opt.param_groups:
        group["lr"] = 0.0
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    for group, lr in zip(opt.param_groups, saved_lr, strict=True):
        group["lr"] = lr
    for p in params:
        p.grad = grads[p]
        step = opt.state[p].get("step")
        if isinstance(step, torch.Tensor):
            step.zero_()
