"""DiLoCo's outer step: replicas that trained alone for `sync_every` steps agree again.

Each replica keeps the parameters of the last sync (the anchor). At a sync the replicas
average their delta (anchor - parameters: how far each moved, DiLoCo's "outer gradient")
over the data-parallel group in one flat all-reduce, optionally in bf16, and
`torch.optim.SGD` (Nesterov) steps the anchors by it; every replica then starts the next
round from the new anchors. Between syncs nothing crosses the data-parallel group but the
loss of a logged step. The bytes of each sync go into the job's `GradTraffic`, so
`grad_bytes` compares this mode with sync on the same terms.

A checkpoint is taken only at a sync (the spec refuses other intervals), where the anchors
equal the parameters: what it needs of this step is the outer momentum, the same on every
replica, saved as `outer.<name>.momentum`. Each replica's inner optimizer state differs
and is saved under its own keys (`LocalSgdState`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardline.workers.contract.local_sgd import (
    DataParallelMode,
    DeltaDtype,
    LocalSgd,
    is_sync_step,
)
from shardline.workers.engine.checkpoint.state import TensorState
from shardline.workers.engine.dp_strategy import DataParallelStrategy, TrainerView
from shardline.workers.engine.grad_compression import GradTraffic
from shardline.workers.engine.optimizer import Optimizers, model_name

log = logging.getLogger(__name__)


class OuterStep:
    """The anchors, the outer optimizer over them, and the sync of one replica."""

    def __init__(
        self,
        modules: list[nn.Module],
        config: LocalSgd,
        *,
        group: dist.ProcessGroup,
        replicas: int,
        total_steps: int,
        traffic: GradTraffic,
    ) -> None:
        self.config = config
        self.group = group
        self.replicas = replicas
        self.total_steps = total_steps
        self.traffic = traffic
        self.names: list[str] = []
        self.params: list[torch.Tensor] = []
        for module in modules:
            for name, p in module.named_parameters():
                if p.requires_grad:
                    self.names.append(model_name(name))
                    self.params.append(p)
        with torch.no_grad():
            self.anchors = [p.detach().clone().requires_grad_(True) for p in self.params]
        # Nesterov needs momentum; outer_momentum 0 is plain averaging (lr 1) or its damped kin.
        self.optimizer = torch.optim.SGD(
            self.anchors,
            lr=config.outer_lr,
            momentum=config.outer_momentum,
            nesterov=config.outer_momentum > 0,
        )
        # Made now, not at the first sync, so a restore has tensors to load into. A zero
        # buffer steps exactly as SGD's own first step (which copies the gradient).
        for anchor in self.anchors:
            self.optimizer.state[anchor]["momentum_buffer"] = torch.zeros_like(anchor)
        self.wire_dtype = torch.bfloat16 if config.delta_dtype == DeltaDtype.bf16 else None
        log.info(
            "local SGD over %d replicas: a sync every %d steps (outer lr %g, momentum %g, "
            "delta in %s)",
            replicas,
            config.sync_every,
            config.outer_lr,
            config.outer_momentum,
            config.delta_dtype.value,
        )

    def due(self, step: int) -> bool:
        return is_sync_step(step, sync_every=self.config.sync_every, total_steps=self.total_steps)

    def syncs_by(self, step: int) -> int:
        """Outer steps taken up to and including `step` (a function of the step alone, so a
        restored run counts the ones before its restore too)."""
        every = self.config.sync_every
        return step // every + (1 if step == self.total_steps and step % every else 0)

    @torch.no_grad()
    def sync(self) -> None:
        """Average the replicas' deltas, step the anchors, start every replica from them."""
        deltas = torch._foreach_sub(self.anchors, self.params)
        flat = torch.cat([d.reshape(-1) for d in deltas])
        sent = flat if self.wire_dtype is None else flat.to(self.wire_dtype)
        dist.all_reduce(sent, group=self.group)
        self.traffic.add(sent.numel() * sent.element_size())
        if sent is not flat:
            flat.copy_(sent)
        flat /= self.replicas
        offset = 0
        for anchor in self.anchors:
            anchor.grad = flat[offset : offset + anchor.numel()].view_as(anchor)
            offset += anchor.numel()
        self.optimizer.step()
        for anchor in self.anchors:
            anchor.grad = None
        torch._foreach_copy_(self.params, self.anchors)

    # -- checkpoints -------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The outer momentum, by the model's own names (the same on every replica)."""
        return {
            f"outer.{name}.momentum": self.optimizer.state[anchor]["momentum_buffer"]
            for name, anchor in zip(self.names, self.anchors, strict=True)
        }

    @torch.no_grad()
    def after_params_loaded(self) -> None:
        """A restore (always of a sync) set the parameters: they are the anchors."""
        torch._foreach_copy_(self.anchors, [p.detach() for p in self.params])

    def state_tensors(self) -> list[torch.Tensor]:
        """What this mode holds beyond the inner optimizer (for memory accounting)."""
        momenta = [self.optimizer.state[a]["momentum_buffer"] for a in self.anchors]
        return [*self.anchors, *momenta]


class LocalSgdState:
    """A checkpoint's optimizer part under local SGD: replica 0's inner state is
    `optim.*` as in any layout, replica r's is `replica<r>.optim.*`, and the outer
    momentum is `outer.<name>.momentum`. A replica that a local SGD checkpoint had
    restores its own; any other (one it did not have, or a checkpoint of another mode)
    restores replica 0's, and the outer momentum starts from zero where the checkpoint
    has none."""

    def __init__(self, optimizers: Optimizers, outer: OuterStep, replica: int) -> None:
        self.optimizers = optimizers
        self.outer = outer
        self.replica = replica

    def _state(self, replica: int, *, outer: bool) -> dict[str, torch.Tensor]:
        prefix = f"replica{replica}.optim." if replica else "optim."
        state = {f"{prefix}{name}": v for name, v in self.optimizers.state_dict().items()}
        return {**state, **(self.outer.state_dict() if outer else {})}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state(self.replica, outer=True)

    def load_template(self, manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
        """This replica's own optimizer state where a local SGD checkpoint has it; else
        replica 0's (a job whose replicas step together must start them the same)."""
        parallel = manifest.get("spec", {}).get("parallel", {})
        both = parallel.get("dp_mode") == DataParallelMode.local_sgd.value
        own = self.replica if both and self.replica < parallel.get("dp", 1) else 0
        return self._state(own, outer=both)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.optimizers.after_params_loaded()
        self.outer.after_params_loaded()


class LocalSgdStrategy(DataParallelStrategy):
    """Replicas that train alone and meet every `sync_every` steps (and after the last)."""

    wraps_model = False

    def __init__(self, trainer: TrainerView) -> None:
        super().__init__(trainer)
        spec = trainer.spec
        self.outer = OuterStep(
            trainer.parts.modules,
            spec.parallel.local_sgd,
            group=trainer.dp_mesh.get_group(),
            replicas=trainer.dims.dp,
            total_steps=spec.train.steps,
            traffic=trainer.traffic,
        )

    @property
    def meeting_every(self) -> int:
        return self.outer.config.sync_every

    def optimizer_state(self) -> TensorState:
        return LocalSgdState(
            self.trainer.optimizers, self.outer, self.trainer.dp_mesh.get_local_rank()
        )

    @property
    def clips_alone(self) -> bool:
        return True  # a replica clips its own gradients

    def after_optimizer_step(self, step: int) -> bool:
        if not self.outer.due(step):
            return False
        with self.trainer.clock.part("comm"):
            self.outer.sync()
        return True

    def votes_at(self, step: int, met: bool) -> bool | None:
        """Only at syncs: a replica stops only there, and nothing crosses replicas between."""
        return met or step == self.trainer.vote.stop_after

    def may_stop_after(self, step: int) -> bool:
        """A pause or a stop takes effect at the next sync."""
        return self.outer.due(step)

    def state_tensors(self) -> list[torch.Tensor]:
        return self.outer.state_tensors()  # anchors and momentum count as optimizer state

    def logged(self, step: int) -> dict[str, Any]:
        return {"outer_steps": self.outer.syncs_by(step)}
