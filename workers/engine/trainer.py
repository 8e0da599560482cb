"""The training loop: one object that owns the model, optimizer, schedule, scaler and data.

It runs inside an already-initialised torch.distributed world (any launcher: a Ray worker,
torchrun, or `shardline train`), and holds every piece of training state as a named
attribute so checkpointing can save and restore all of it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from workers.engine.accounting import memory_held, peak_flops
from workers.engine.activation_checkpointing import apply_activation_checkpointing
from workers.engine.data import build_loader
from workers.engine.data_parallel import apply_data_parallel, build_optimizer
from workers.engine.model import ModelArgs, Transformer, count_params, flops_per_token
from workers.engine.parallel import ParallelDims
from workers.engine.precision import DynamicLossScaler, autocast, finite_or_none
from workers.engine.schedule import build_scheduler
from workers.spec import JobSpec, Precision

log = logging.getLogger(__name__)

MetricsSink = Callable[[dict[str, Any]], None]
# Called after backward and before the optimizer step; tests use it to inject faults.
GradHook = Callable[[int, nn.Module], None]


class Trainer:
    """Trains one JobSpec on this rank; every rank of the world builds one."""

    def __init__(
        self,
        spec: JobSpec,
        *,
        world_size: int,
        device: torch.device,
        on_metrics: MetricsSink | None = None,
        on_step: Callable[[int], None] | None = None,
        grad_hook: GradHook | None = None,
    ) -> None:
        self.spec = spec
        self.device = device
        self.on_metrics = on_metrics
        self.on_step = on_step
        self.grad_hook = grad_hook
        self.dims = ParallelDims.from_spec(spec.parallel, world_size)
        if self.dims.tp > 1 or self.dims.pp > 1:
            raise ValueError(
                f"parallel: tp={self.dims.tp}, pp={self.dims.pp}: tensor and pipeline "
                "parallelism are not in this engine yet; use tp=1 and pp=1"
            )
        mesh = self.dims.build_mesh(device.type)
        self.dp_mesh = mesh["dp"]
        tr = spec.train

        # Same seed on every rank: identical initial weights without a broadcast.
        torch.manual_seed(tr.seed)
        args = ModelArgs.from_resolved(spec.model.resolved())
        model = Transformer(args).to(device)
        self.flops_per_token = flops_per_token(args, count_params(model, exclude_embedding=True))
        self.tokens_per_step = tr.global_batch_size * args.seq_len
        zero = self.dims.effective_zero_stage
        # Order matters (torchtitan's): activation checkpointing wraps whole blocks before
        # data parallelism shards them.
        apply_activation_checkpointing(model, mode=tr.activation_checkpointing)
        self.model = apply_data_parallel(
            model, dp_mesh=self.dp_mesh, zero_stage=zero, device=device
        )
        self.optimizer = build_optimizer(
            self.model,
            zero_stage=zero,
            dp_mesh=self.dp_mesh,
            lr=tr.lr,
            weight_decay=tr.weight_decay,
            device=device,
        )
        self.scheduler = build_scheduler(
            self.optimizer,
            lr=tr.lr,
            min_lr=tr.min_lr,
            warmup_steps=tr.warmup_steps,
            total_steps=tr.steps,
        )
        self.scaler = DynamicLossScaler(enabled=spec.precision == Precision.fp16)
        self.loader = build_loader(
            spec, dp_rank=self.dp_mesh.get_local_rank(), dp_size=self.dims.dp
        )
        self.val_batches = self.loader.val_batches() if self.loader.has_validation else []
        self.step = 0
        self.peak_flops = peak_flops(device)
        self.layout = f"{self.dims.describe()},{spec.precision.value}"

    # -- one optimizer step -------------------------------------------------------------

    @contextmanager
    def _grad_sync(self, sync: bool) -> Iterator[None]:
        # DDP all-reduces only on the last micro-batch. FSDP reduce-scatters every
        # micro-batch, which keeps gradients sharded the whole time.
        if not sync and isinstance(self.model, DistributedDataParallel):
            with self.model.no_sync():
                yield
        else:
            yield

    def _loss(self, rows: torch.Tensor) -> torch.Tensor:
        inputs, targets = rows[:, :-1], rows[:, 1:]
        with autocast(self.spec.precision, self.device):
            logits = self.model(inputs)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    def _mean_over_dp(self, value: torch.Tensor) -> float:
        if self.dims.dp > 1:
            value = value.clone()
            dist.all_reduce(value, group=self.dp_mesh.get_group())
            value /= self.dims.dp
        return float(value.item())

    def train_step(self) -> dict[str, Any]:
        """Run optimizer step `self.step + 1`; returns its metrics."""
        step = self.step + 1
        start = time.perf_counter()
        micro_batches = (
            self.loader.train_batch(step).to(self.device).split(self.spec.train.micro_batch_size)
        )
        local_loss = torch.zeros((), device=self.device)
        for i, rows in enumerate(micro_batches):
            with self._grad_sync(sync=i == len(micro_batches) - 1):
                loss = self._loss(rows) / len(micro_batches)
                self.scaler.scale_loss(loss).backward()
            local_loss += loss.detach()
        if self.grad_hook is not None:
            self.grad_hook(step, self.model)

        params = list(self.model.parameters())
        skipped = self.scaler.unscale_and_check(params)
        grad_norm = math.nan
        if not skipped:
            clip = self.spec.train.grad_clip or math.inf
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
            grad_norm = float((norm.full_tensor() if isinstance(norm, DTensor) else norm).item())
            self.optimizer.step()
        self.scaler.update(skipped)
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        memory = memory_held(self.model, self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        loss_value = self._mean_over_dp(local_loss)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        step_time = time.perf_counter() - start
        self.step = step

        tokens_per_s = self.tokens_per_step / step_time
        metrics: dict[str, Any] = {
            "step": step,
            "loss": loss_value,
            "grad_norm": finite_or_none(grad_norm),
            "lr": lr,
            "tokens_per_s": tokens_per_s,
            "step_time_s": step_time,
            "mfu": self._mfu(tokens_per_s),
            "mem_bytes": memory,
        }
        if self.scaler.enabled:
            metrics.update(
                loss_scale=self.scaler.scale,
                skipped=skipped,
                skipped_steps=self.scaler.skipped_steps,
            )
        return metrics

    def _mfu(self, tokens_per_s: float) -> float | None:
        if self.peak_flops is None:
            return None
        return self.flops_per_token * tokens_per_s / (self.peak_flops * self.dims.world_size)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the fixed held-out batches, across all dp ranks."""
        self.model.eval()
        losses = [
            self._loss(rows)
            for batch in self.val_batches
            for rows in batch.to(self.device).split(self.spec.train.micro_batch_size)
        ]
        self.model.train()
        return self._mean_over_dp(torch.stack(losses).mean())

    # -- the loop ----------------------------------------------------------------------

    def _should_log(self, step: int) -> bool:
        tr = self.spec.train
        return step % tr.log_every == 0 or step == tr.steps or step == 1

    def _should_eval(self, step: int) -> bool:
        every = self.spec.train.eval_every
        return bool(self.val_batches) and every > 0 and (step % every == 0 or step == 1)

    def train(self, should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Train to `train.steps` (or until `should_stop()`); returns the run summary."""
        total = self.spec.train.steps
        step_times: list[float] = []
        last: dict[str, Any] = {}
        log.info("training %s for %d steps (%s)", self.spec.name, total, self.layout)
        while self.step < total and not (should_stop and should_stop()):
            metrics = self.train_step()
            step_times.append(metrics["step_time_s"])
            if self._should_eval(self.step):
                metrics["val_loss"] = self.evaluate()
            last = metrics
            if self._should_log(self.step) and self.on_metrics is not None:
                self.on_metrics(metrics)
            if self.on_step is not None:
                self.on_step(self.step)
        return self._summary(last, step_times)

    def _summary(self, last: dict[str, Any], step_times: list[float]) -> dict[str, Any]:
        # The first steps pay for allocation and warm-up; report the steady state.
        steady = step_times[min(2, len(step_times) - 1) :] if step_times else []
        step_time = sum(steady) / len(steady) if steady else None
        tokens_per_s = self.tokens_per_step / step_time if step_time else None
        return {
            "final_loss": last.get("loss"),
            "steps": self.step,
            "tokens_per_s": tokens_per_s,
            "mfu": self._mfu(tokens_per_s) if tokens_per_s else None,
            "step_time_s": step_time,
            "layout": self.layout,
        }
