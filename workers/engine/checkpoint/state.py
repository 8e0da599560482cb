"""The stateful parts of a rank's training that a checkpoint holds.

Tensors go to DCP, keyed by the model's own names in every layout (`model.<name>`,
`optim.<name>.<key>`), so any layout restores any other's checkpoint; small parts (the
loss scaler, the RNG, the data loader's position) go into the manifest as JSON, so a
restore never unpickles.

The optimizer's part is the data-parallel strategy's to say (it owns the state it
checkpoints): synchronous replicas hold one optimizer state (`OptimizerState`); an
experimental strategy hands its own `TensorState` in (per-replica keys, parameter-server
shards). Nothing here knows which.
"""

from __future__ import annotations

import base64
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from shardline.workers.engine.optimizer import Optimizers


class TensorState(Protocol):
    """A part saved as tensors; DCP loads into `load_template()`'s own tensors in place,
    and `load_state_dict` then makes the part hold them."""

    def state_dict(self) -> dict[str, torch.Tensor]: ...
    def load_template(self, manifest: dict[str, Any]) -> dict[str, torch.Tensor]: ...
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...


class JsonState(Protocol):
    """A small part saved as JSON in the manifest (the loss scaler has this shape)."""

    def state_dict(self) -> Any: ...
    def load_state_dict(self, state: Any) -> None: ...


class OptimizerState:
    """The optimizers' state as `optim.<parameter name>.<key>` (DTensor shards where
    sharded): one state every replica steps alike."""

    def __init__(self, optimizers: Optimizers) -> None:
        self.optimizers = optimizers

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {f"optim.{name}": value for name, value in self.optimizers.state_dict().items()}

    def load_template(self, manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """The parameters changed under the optimizers: resync what they keep of them."""
        self.optimizers.after_params_loaded()


class ModelAndOptimizer:
    """The model's tensors (the parameters' own, DTensor shards where sharded) of every
    module this rank holds (one, or a pipeline stage each), and the optimizer part the
    data-parallel strategy gives."""

    def __init__(self, modules: list[nn.Module], optimizer: TensorState) -> None:
        self.modules = modules
        self.optimizer = optimizer

    def _model(self) -> dict[str, torch.Tensor]:
        state: dict[str, torch.Tensor] = {}
        for module in self.modules:
            for name, value in get_model_state_dict(module).items():
                assert isinstance(value, torch.Tensor), name  # the model holds only tensors
                state[f"model.{name}"] = value
        return state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**self._model(), **self.optimizer.state_dict()}

    def load_template(self, manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
        """What to load from a checkpoint with this manifest."""
        return {**self._model(), **self.optimizer.load_template(manifest)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Make the modules, then the optimizer part, hold what was loaded into `state`."""
        for module in self.modules:
            own: dict[str, Any] = {
                name: state[f"model.{name}"] for name in get_model_state_dict(module)
            }
            set_model_state_dict(module, own)
        self.optimizer.load_state_dict(state)


class RngState:
    """torch's CPU generator, as base64 text."""

    def state_dict(self) -> str:
        return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")

    def load_state_dict(self, state: str) -> None:
        rng = bytearray(base64.b64decode(state))
        torch.set_rng_state(torch.frombuffer(rng, dtype=torch.uint8).clone())
