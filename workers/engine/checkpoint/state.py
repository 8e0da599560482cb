"""The stateful parts of a rank's training that a checkpoint holds.

Tensors go to DCP, keyed by the model's own names in every layout (`model.<name>`,
`optim.<name>.<key>`), so any layout restores any other's checkpoint; small parts (the
loss scaler, the RNG) go into the manifest as JSON, so a restore never unpickles.

Under local SGD (workers/engine/local_sgd.py) the replicas' optimizer states differ:
replica 0's is `optim.*` as in any layout, replica r's is `replica<r>.optim.*`, and the
outer momentum is `outer.<name>.momentum`. A local SGD replica that a local SGD checkpoint
had restores its own; any other replica (one it did not have, or a job or checkpoint of
another mode) restores replica 0's, and the outer momentum starts from zero where the
checkpoint has none.

Under async data parallelism (workers/engine/async_dp.py) the optimizer state lives in
the parameter-server shards: each rank saves and loads the `optim.*` keys of the
parameters it serves, so together the ranks hold every key once, as any layout does.
"""

from __future__ import annotations

import base64
from typing import Any, Protocol

import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from workers.engine.async_dp import ParameterShard
from workers.engine.local_sgd import OuterStep
from workers.engine.optimizer import Optimizers
from workers.engine.parts import ModelParts


class TensorState(Protocol):
    """A part saved as tensors; DCP loads into `state_dict()`'s own tensors in place."""

    def state_dict(self) -> dict[str, torch.Tensor]: ...
    def load_template(self, manifest: dict[str, Any]) -> dict[str, torch.Tensor]: ...
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...


class JsonState(Protocol):
    """A small part saved as JSON in the manifest (the loss scaler has this shape)."""

    def state_dict(self) -> Any: ...
    def load_state_dict(self, state: Any) -> None: ...


class ModelAndOptimizer:
    """Model and optimizer tensors: the parameters' and the optimizer's own (DTensor
    shards where sharded)."""

    def __init__(
        self,
        parts: ModelParts,
        optimizers: Optimizers,
        *,
        outer: OuterStep | None = None,
        replica: int = 0,
        shard: ParameterShard | None = None,
    ) -> None:
        self.parts = parts
        self.optimizers = optimizers
        self.outer = outer  # local SGD's outer step, if the job runs it
        self.replica = replica  # this rank's data-parallel replica
        self.shard = shard  # async: the parameters this rank serves, with their AdamW

    def state_dict(self) -> dict[str, torch.Tensor]:
        own = self.replica if self.outer is not None else 0
        return self._state(optim_replica=own, outer=self.outer is not None)

    def load_template(self, manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
        """What to load from a checkpoint with this manifest: under local SGD on both
        sides, this replica's own optimizer state where the checkpoint has it; else
        replica 0's (a job whose replicas step together must start them the same)."""
        parallel = manifest.get("spec", {}).get("parallel", {})
        both = parallel.get("dp_mode") == "local_sgd" and self.outer is not None
        own = self.replica if both and self.replica < parallel.get("dp", 1) else 0
        return self._state(optim_replica=own, outer=both)

    def _state(self, *, optim_replica: int, outer: bool) -> dict[str, torch.Tensor]:
        state: dict[str, torch.Tensor] = {}
        for module in self.parts.modules:
            for name, value in get_model_state_dict(module).items():
                assert isinstance(value, torch.Tensor), name  # the model holds only tensors
                state[f"model.{name}"] = value
        prefix = f"replica{optim_replica}.optim." if optim_replica else "optim."
        optim = self.shard if self.shard is not None else self.optimizers
        for name, value in optim.state_dict().items():
            state[f"{prefix}{name}"] = value
        if outer and self.outer is not None:
            state.update(self.outer.state_dict())
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Make the modules and optimizers hold what was loaded into `state`."""
        for module in self.parts.modules:
            own: dict[str, Any] = {
                name: state[f"model.{name}"] for name in get_model_state_dict(module)
            }
            set_model_state_dict(module, own)
        self.optimizers.after_params_loaded()
        if self.outer is not None:
            self.outer.after_params_loaded()


class RngState:
    """torch's CPU generator, as base64 text."""

    def state_dict(self) -> str:
        return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")

    def load_state_dict(self, state: str) -> None:
        rng = bytearray(base64.b64decode(state))
        torch.set_rng_state(torch.frombuffer(rng, dtype=torch.uint8).clone())
