"""What a checkpoint holds of a rank's training: tensors for DCP, small state as JSON."""

from __future__ import annotations

import base64
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from workers.engine.optimizer import Optimizers
from workers.engine.parts import ModelParts
from workers.engine.precision import DynamicLossScaler


def tensor_state(parts: ModelParts, optimizers: Optimizers) -> dict[str, torch.Tensor]:
    """Model and optimizer tensors keyed by the model's own names, in every layout.

    DCP loads into these tensors in place: they are the parameters' and the optimizer's
    own (DTensor shards where sharded).
    """
    state: dict[str, torch.Tensor] = {}
    for module in parts.modules:
        for name, value in get_model_state_dict(module).items():
            assert isinstance(value, torch.Tensor), name  # the model holds only tensors
            state[f"model.{name}"] = value
    for name, value in optimizers.state_dict().items():
        state[f"optim.{name}"] = value
    return state


def apply_tensor_state(
    parts: ModelParts, optimizers: Optimizers, state: dict[str, torch.Tensor]
) -> None:
    """Make the modules and optimizers hold what was loaded into `state`."""
    for module in parts.modules:
        own: dict[str, Any] = {
            name: state[f"model.{name}"] for name in get_model_state_dict(module)
        }
        set_model_state_dict(module, own)
    optimizers.after_params_loaded()


def small_state(step: int, scaler: DynamicLossScaler) -> dict[str, Any]:
    """The trainer's JSON-able state: step, loss scaler, RNG (goes into the manifest)."""
    return {
        "step": step,
        "scaler": scaler.state_dict(),
        "rng": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
    }


def apply_small_state(state: dict[str, Any], scaler: DynamicLossScaler) -> int:
    """Restore the scaler and RNG; returns the step the checkpoint was taken after."""
    scaler.load_state_dict(state["scaler"])
    rng = bytearray(base64.b64decode(state["rng"]))
    torch.set_rng_state(torch.frombuffer(rng, dtype=torch.uint8).clone())
    return int(state["step"])
