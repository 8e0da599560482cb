"""How data-parallel replicas agree: a strategy chosen by `parallel.dp_mode`.

`sync` (here) averages every step's gradients: DDP or FSDP wrap the model and reduce
during backward, or the engine all-reduces after it where DDP cannot follow (pipeline
schedules, tensor-parallel DTensors). The experimental strategies (local SGD, async
replicas) live in workers/engine/experimental/ and are named here only: `strategy_class`
imports the one a job asks for, on first use, so the core never imports them.

A strategy owns the state it checkpoints (`optimizer_state`), and says where replicas
hold the same parameters (`meeting_every`: snapshots and stops only there).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from shardline.workers.contract.local_sgd import DataParallelMode
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.checkpoint.state import OptimizerState, TensorState
from shardline.workers.engine.data.batch import Loader
from shardline.workers.engine.data_parallel import all_reduce_grads
from shardline.workers.engine.grad_compression import GradTraffic
from shardline.workers.engine.optimizer import Optimizers
from shardline.workers.engine.parallel import ParallelDims
from shardline.workers.engine.parts import ModelParts, grad_reduce_dtype
from shardline.workers.engine.step_clock import StepClock

if TYPE_CHECKING:
    from shardline.workers.engine.hooks import TrainerHooks
    from shardline.workers.engine.metrics import MetricsProcessor
    from shardline.workers.engine.step_outcome import StopVote

# mode -> "module:Class", imported when a job asks for it.
STRATEGIES: dict[DataParallelMode, str] = {
    DataParallelMode.sync: "shardline.workers.engine.dp_strategy:SyncStrategy",
    DataParallelMode.local_sgd: "shardline.workers.engine.experimental.local_sgd:LocalSgdStrategy",
    DataParallelMode.asynchronous: "shardline.workers.engine.experimental.async_dp:AsyncStrategy",
}


class TrainerView(Protocol):
    """What a strategy may use of the trainer it serves (workers/engine/trainer.py)."""

    spec: JobSpec
    dims: ParallelDims
    dp_mesh: DeviceMesh
    device: torch.device
    parts: ModelParts
    params: list[nn.Parameter]
    optimizers: Optimizers
    loader: Loader
    clock: StepClock
    traffic: GradTraffic
    metrics: MetricsProcessor
    hooks: TrainerHooks
    vote: StopVote
    step: int

    def train_step(self) -> dict[str, Any]: ...
    def forward_backward(self, batch: Any) -> torch.Tensor: ...
    def lr_at(self, step: int) -> float: ...


class DataParallelStrategy:
    """The sync defaults; an experimental strategy overrides what it does differently."""

    # Whether DDP or FSDP wrap the model (replicas that exchange what they trained
    # themselves, and count its bytes themselves, are left unwrapped).
    wraps_model: ClassVar[bool] = True

    def __init__(self, trainer: TrainerView) -> None:
        self.trainer = trainer

    @property
    def meeting_every(self) -> int:
        """Steps between the points where every replica holds the same parameters,
        where snapshots may be taken."""
        return 1

    @property
    def steps_per_advance(self) -> int:
        """Steps one `advance` trains at most (what one save call's time covers)."""
        return 1

    def optimizer_state(self) -> TensorState:
        return OptimizerState(self.trainer.optimizers)

    def start(self, step: int) -> None:
        """Training (re)starts after `step`, the model restored or fresh."""

    def advance(self) -> dict[str, Any]:
        """Train up to the next point the loop looks in at; returns its step's metrics."""
        return self.trainer.train_step()

    def after_backward(self) -> None:
        """This rank's gradients are computed: make them the replicas' average where the
        wrapper did not."""

    @property
    def clips_alone(self) -> bool:
        """Whether each replica clips its own gradients (no norm over the world)."""
        return False

    def after_optimizer_step(self, step: int) -> bool:
        """After the optimizer stepped `step`; returns whether the replicas met (agreed
        their parameters) here."""
        return False

    def votes_at(self, step: int, met: bool) -> bool | None:
        """Whether the ranks vote after `step` beyond the steps that must (None: the
        ledger's cadence decides)."""
        return None

    def may_stop_after(self, step: int) -> bool:
        """Whether an agreed stop may take effect after `step`."""
        return True

    def state_tensors(self) -> list[torch.Tensor]:
        """What the strategy holds beyond the optimizers (memory accounting)."""
        return []

    def logged(self, step: int) -> dict[str, Any]:
        """The strategy's own figures for a logged step."""
        return {}

    def close(self) -> None:
        """Training ended here (any stop): end what the strategy runs beside it."""

    def abandon(self) -> None:
        """The world failed: free what the strategy holds for it."""


class SyncStrategy(DataParallelStrategy):
    """Every step's gradients averaged over the replicas."""

    def __init__(self, trainer: TrainerView) -> None:
        super().__init__(trainer)
        self.reduce_dtype = grad_reduce_dtype(trainer.spec)

    def after_backward(self) -> None:
        trainer = self.trainer
        if trainer.dims.syncs_grads_after_backward:
            with trainer.clock.part("comm"):
                all_reduce_grads(trainer.params, trainer.dp_mesh, self.reduce_dtype)


def strategy_class(mode: DataParallelMode) -> type[DataParallelStrategy]:
    """The strategy of `parallel.dp_mode`, imported on first use."""
    module, _, name = STRATEGIES[mode].partition(":")
    cls: type[DataParallelStrategy] = getattr(importlib.import_module(module), name)
    return cls
