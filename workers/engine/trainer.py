"""The training loop, in torchtitan's shape: a Trainer built once from typed components
(model parts, optimizers, loss, data loader, data-parallel strategy, checkpoint manager,
metrics processor), whose `train_step` reads top to bottom.

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
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from shardline.workers.contract.spec import JobSpec, Precision, spec_hash
from shardline.workers.engine.accounting import memory_held
from shardline.workers.engine.checkpoint.manager import CheckpointManager
from shardline.workers.engine.checkpoint.state import ModelAndOptimizer, RngState
from shardline.workers.engine.data.loader import Batch, build_loader
from shardline.workers.engine.dp_strategy import strategy_class
from shardline.workers.engine.dtensor import plain
from shardline.workers.engine.grad_clip import clip_grad_norm, settle_partial_grads
from shardline.workers.engine.grad_compression import grad_traffic
from shardline.workers.engine.hf_weights import load_init_from
from shardline.workers.engine.hooks import TrainerHooks
from shardline.workers.engine.loss import loss_context, token_loss
from shardline.workers.engine.metrics import MetricsProcessor, RankReport
from shardline.workers.engine.models.family import load_family
from shardline.workers.engine.models.registry import family_of
from shardline.workers.engine.optimizer import Optimizers
from shardline.workers.engine.parallel import ParallelDims
from shardline.workers.engine.parts import ModelParts, build_model_parts
from shardline.workers.engine.pipeline import build_schedule
from shardline.workers.engine.precision import DynamicLossScaler, autocast
from shardline.workers.engine.schedule import lr_at
from shardline.workers.engine.step_clock import PIPELINE, StepClock
from shardline.workers.engine.step_outcome import SaveRequest, StepLedger, StopRequest, StopVote
from shardline.workers.engine.tied import tied_across_stages
from shardline.workers.storage.layout import CheckpointLocations
from shardline.workers.storage.skipped_batches import SkippedBatches

log = logging.getLogger(__name__)


class Trainer:
    """Trains one JobSpec on this rank; every rank of the world builds one."""

    def __init__(
        self,
        spec: JobSpec,
        *,
        world_size: int,
        device: torch.device,
        hooks: TrainerHooks | None = None,
        checkpoints: CheckpointLocations | None = None,
    ) -> None:
        self.spec, self.device = spec, device
        self.hooks = hooks or TrainerHooks()
        self.dims = ParallelDims.from_spec(spec.parallel, world_size)
        mesh = self.dims.build_mesh(device.type)
        self.dp_mesh, self.pp_mesh = mesh["dp"], mesh["pp"]
        strategy = strategy_class(spec.parallel.dp_mode)
        self.parts = _model_parts(spec, self.dims, mesh, device, strategy.wraps_model)
        self.params = self.parts.parameters()  # fixed once built: not listed per step
        self.tied = tied_across_stages(
            self.parts.modules,
            self.parts.family.tied_parameters(self.parts.args),
            mesh,
            self.dims.pp,
        )
        self.optimizers = _optimizers(spec, self.parts, self.dims, mesh, device)
        self.scaler = DynamicLossScaler(enabled=spec.precision == Precision.fp16)
        self.clock = StepClock(device)
        self.traffic, compression_state = grad_traffic(
            self.parts.modules,
            self.params,
            compression=spec.parallel.grad_compression,
            dims=self.dims,
            micro_batches=spec.accumulation_steps,
            self_counted=not strategy.wraps_model,
        )
        self.pipeline = self._pipeline() if self.dims.pp > 1 else None
        where = checkpoints or CheckpointLocations()
        self.loader = build_loader(
            spec,
            dp_rank=self.dp_mesh.get_local_rank(),
            dp_size=self.dims.dp,
            # Batches this job skipped after a non-finite loss.
            skipped_batches=tuple(SkippedBatches(where.save_url).batches())
            if where.save_url
            else (),
        )
        self.val_batches = self.loader.val_batches() if self.loader.has_validation else []
        # The last step's real input tokens (None where every token is real) and loss targets.
        self._batch_tokens: tuple[int | None, int] = (None, 0)
        self.metrics = MetricsProcessor(
            spec,
            self.dims,
            device,
            flops_per_token=self.parts.flops_per_token,
            on_metrics=self.hooks.on_metrics,
        )
        self.layout = f"{self.dims.describe()},{spec.precision.value}"
        self.vote = StopVote()  # train() says who asks to stop
        self.ledger = StepLedger(device, self.vote, loss_copies=self.dims.dp * self.dims.tp)
        self.step = 0
        self.strategy = strategy(self)
        self.checkpoints = CheckpointManager(
            spec.checkpoint,
            where,
            tensors=ModelAndOptimizer(self.parts.modules, self.strategy.optimizer_state()),
            small={
                "scaler": self.scaler,
                "rng": RngState(),
                "data": self.loader,
                **({"powersgd": compression_state} if compression_state else {}),
            },
            info={
                "layout": self.layout,
                "spec": spec.model_dump(mode="json"),
                "spec_hash": spec_hash(spec),
                "versions": {"torch": torch.__version__},
            },
            on_event=self.hooks.event_sink,
            on_commit=self.hooks.on_checkpoint,
            snapshot_multiple_of=self.strategy.meeting_every,
            steps_per_call=self.strategy.steps_per_advance,
        )
        self.step = self.checkpoints.load() or 0  # the step restored after, or a fresh start
        self.strategy.start(self.step)
        self.ledger.start_at(self.step)
        self.drained_s = 0.0  # a logged step's wait for the earlier steps' queued work

    def _pipeline(self) -> Any:
        return build_schedule(
            list(zip(self.parts.stage_ids, self.parts.modules, strict=True)),
            pp_mesh=self.pp_mesh,
            num_stages=self.parts.num_stages,
            n_microbatches=self.spec.accumulation_steps,
            schedule=self.spec.parallel.pp_schedule,
            loss_fn=self._pipeline_loss,
            device=self.device,
            wrap_chunk=self.clock.chunk,
        )

    def lr_at(self, step: int) -> float:
        """The schedule's learning rate at `step` (a function of the step alone)."""
        tr = self.spec.train
        return lr_at(
            step,
            lr=tr.lr,
            min_lr=tr.min_lr,
            warmup_steps=tr.warmup_steps,
            total_steps=tr.steps,
        )

    @property
    def model(self) -> nn.Module:
        """The model, where this rank holds it in one piece (no pipeline)."""
        if len(self.parts.modules) != 1:
            raise AttributeError("with pipeline parallelism use trainer.parts.modules")
        return self.parts.modules[0]

    # -- one optimizer step -------------------------------------------------------------

    def train_step(self) -> dict[str, Any]:
        """Run optimizer step `self.step + 1`; returns its metrics."""
        step = self.step + 1
        logged = self.metrics.should_log(step)
        self._start_clock(logged)
        start = time.perf_counter()
        with self.clock.part("data"):
            batch = self.loader.train_batch(step).to(self.device)
        self._batch_tokens = batch.global_tokens, batch.global_loss_tokens
        with self.clock.part(PIPELINE if self.pipeline is not None else "compute"):
            local_loss = self.forward_backward(batch)
        self.strategy.after_backward()
        self.hooks.backward_done(step, self.parts.modules)
        lr = self.lr_at(step)
        grad_norm, skipped = self._optimizer_step(lr)
        met = self.strategy.after_optimizer_step(step)
        memory = self._end_step(skipped, logged)
        self.ledger.note(step, local_loss)
        loss = self._agree(step, local_loss, logged, met)  # known only where ranks vote
        step_s = time.perf_counter() - start
        self.step = step
        if memory is not None:  # gathered over the world after the step's save
            self.metrics.report = RankReport(memory, self.clock.seconds(), step_s)
        return self._step_metrics(step, loss, grad_norm, lr, step_s, skipped, logged)

    def _start_clock(self, logged: bool) -> None:
        self.clock.arm(logged)
        self.drained_s = 0.0
        if logged and self.device.type == "cuda":  # its time is its own, not queued work's
            # What the steps before still had queued is theirs (the run's summary adds it).
            drain = time.perf_counter()
            torch.cuda.synchronize(self.device)
            self.drained_s = time.perf_counter() - drain

    def _optimizer_step(self, lr: float) -> tuple[float, bool]:
        """Clip and step; returns the gradient norm and whether fp16 skipped the step."""
        with self.clock.part("compute"):
            self.optimizers.set_lr(lr)
            if self.dims.tp > 1:  # only tensor parallel leaves partial sums
                settle_partial_grads(self.params)
        if self.tied is not None:
            with self.clock.part("comm"):
                self.tied.sync_grads()
        with self.clock.part("compute"):
            skipped = self.scaler.unscale_and_check(self.params)
        if skipped:
            return math.nan, True
        # Where every rank holds the same whole gradients, or each replica clips its own,
        # this rank's norm is the one to clip by: no collective.
        alone = self.strategy.clips_alone or self.dims.grads_replicated
        grad_norm = clip_grad_norm(
            self.params,
            self.spec.train.grad_clip or math.inf,
            stage_ranks=1 if alone else self.dims.dp * self.dims.tp,
            clock=self.clock,
            over_world=not alone,
            not_counted=self.tied.copies if self.tied is not None else (),
        )
        with self.clock.part("compute"):
            self.optimizers.step()
        return grad_norm, False

    def _end_step(self, skipped: bool, logged: bool) -> dict[str, int] | None:
        """Update the loss scale and drop the gradients; returns what this rank holds
        where the step is logged."""
        with self.clock.part("compute"):
            self.scaler.update(skipped)
            memory = None
            if logged:
                memory = memory_held(self.params, self.optimizers, self.strategy.state_tensors())
            self.optimizers.zero_grad(set_to_none=True)
        return memory

    def _agree(self, step: int, local_loss: torch.Tensor, logged: bool, met: bool) -> float | None:
        """The world's mean loss of `step`, where the ranks vote after it (the loss's mean,
        the stop vote and any non-finite loss, in one all-reduce); else None."""
        if not self._votes(step, logged, met):
            return None
        with self.clock.part("comm"):
            loss = self.ledger.settle(step, local_loss, self.loader.batch_of)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return loss

    def _votes(self, step: int, logged: bool, met: bool) -> bool:
        """Whether the ranks agree after `step` (workers/engine/step_outcome.py): where
        it logs, evaluates or saves (no save may hold a state past a non-finite loss), and
        else where the strategy says, or on the ledger's cadence."""
        last = step == self.spec.train.steps
        if logged or self._should_eval(step) or self.checkpoints.due(step, last_step=last):
            return True
        own = self.strategy.votes_at(step, met)
        return self.ledger.due(step) if own is None else own

    def _step_metrics(
        self,
        step: int,
        loss: float | None,
        grad_norm: float,
        lr: float,
        step_s: float,
        skipped: bool,
        logged: bool,
    ) -> dict[str, Any]:
        metrics = self.metrics.step_metrics(
            step, loss=loss, grad_norm=grad_norm, lr=lr, step_s=step_s
        )
        self.traffic.step_done()
        if logged and self.dims.dp > 1:  # the mean over the steps since the last logged one
            metrics["grad_bytes"] = self.traffic.take_per_step()
        if logged:
            metrics.update(self.strategy.logged(step))
            tokens, loss_tokens = self._batch_tokens
            if tokens is not None:  # records: padding and prompts are not trained on
                metrics.update(tokens=tokens, loss_tokens=loss_tokens)
        if self.scaler.enabled:
            metrics.update(
                loss_scale=self.scaler.scale,
                skipped=skipped,
                skipped_steps=self.scaler.skipped_steps,
            )
        return metrics

    # -- forward and backward ----------------------------------------------------------

    @contextmanager
    def _grad_sync(self, sync: bool) -> Iterator[None]:
        # DDP all-reduces only on the last micro-batch. FSDP reduce-scatters every
        # micro-batch, which keeps gradients sharded the whole time. (Pipeline stages
        # handle this themselves.)
        model = self.parts.modules[0]
        if not sync and isinstance(model, DistributedDataParallel):
            with model.no_sync():
                yield
        else:
            yield

    def forward_backward(self, batch: Batch) -> torch.Tensor:
        """Forward and backward over this rank's rows; returns their share of the global
        batch's mean loss (unscaled).

        Each micro-batch's loss is its sum over the targets the loss counts, divided by
        the global batch's count of them per rank and micro-batch, then by the number of
        micro-batches: the global average whatever the split (ranks' gradients are
        averaged, a pipeline schedule divides by its micro-batches). On pipeline ranks
        without the last stage the returned loss is 0: the loss is known only where the
        logits are.
        """
        micro = self.spec.train.micro_batch_size
        n = batch.tokens.shape[0] // micro
        self._micro_tokens = batch.global_loss_tokens / self.dims.dp / n
        inputs, targets, documents = batch.inputs, batch.targets, batch.documents
        with loss_context(self.dims.tp > 1), autocast(self.spec.precision, self.device):
            if self.pipeline is not None:
                return self._pipeline_run(self.pipeline.step, inputs, targets, documents)
            total = torch.zeros((), device=self.device)
            model = self.parts.modules[0]
            for i in range(n):
                with self._grad_sync(sync=i == n - 1):
                    chunk = slice(i * micro, (i + 1) * micro)
                    logits = (
                        model(inputs[chunk])
                        if documents is None
                        else model(inputs[chunk], documents=documents[chunk])
                    )
                    loss_sum, _ = token_loss(logits, targets[chunk])
                    loss = loss_sum / self._micro_tokens / n
                    self.scaler.scale_loss(loss).backward()
                total += plain(loss.detach())
            return total

    def _pipeline_loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss_sum, _ = token_loss(output, targets)
        return self.scaler.scale_loss(loss_sum / self._micro_tokens)

    def _pipeline_run(
        self,
        run: Callable[..., Any],
        inputs: torch.Tensor,
        targets: torch.Tensor,
        documents: torch.Tensor | None = None,
    ) -> torch.Tensor:
        losses: list[torch.Tensor] | None = [] if self.parts.has_last_stage else None
        target = targets if self.parts.has_last_stage else None
        # Every stage's attention needs the documents: keyword arguments reach them all.
        extra = {} if documents is None else {"documents": documents}
        if self.parts.has_first_stage:
            run(inputs, target=target, losses=losses, **extra)
        else:
            run(target=target, losses=losses, **extra)
        if not losses:
            return torch.zeros((), device=self.device)
        return torch.stack([plain(v.detach()).float() for v in losses]).mean() / self.scaler.scale

    # -- validation --------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the fixed held-out batches, across the whole world."""
        self.parts.train(False)
        losses = []
        micro = self.spec.train.micro_batch_size
        for batch in self.val_batches:
            batch = batch.to(self.device)
            rows = batch.tokens
            with loss_context(self.dims.tp > 1), autocast(self.spec.precision, self.device):
                if self.pipeline is not None:
                    self._micro_tokens = (
                        batch.global_loss_tokens / self.dims.dp / (rows.shape[0] // micro)
                    )
                    losses.append(
                        self._pipeline_run(
                            self.pipeline.eval, batch.inputs, batch.targets, batch.documents
                        )
                    )
                    continue
                if batch.documents is not None:
                    # Token-weighted: rows hold different numbers of counted targets.
                    losses.append(self._packed_loss(batch))
                    continue
                for chunk in rows.split(micro):
                    loss_sum, count = token_loss(self.parts.modules[0](chunk[:, :-1]), chunk[:, 1:])
                    losses.append(plain(loss_sum / count))
        self.parts.train(True)
        return self._global_mean(torch.stack(losses).mean())

    def _packed_loss(self, batch: Batch) -> torch.Tensor:
        """This rank's share of a batch's mean loss over its counted targets."""
        assert batch.documents is not None
        micro = self.spec.train.micro_batch_size
        total = torch.zeros((), device=self.device)
        inputs, targets = batch.inputs, batch.targets
        for i in range(0, inputs.shape[0], micro):
            chunk = slice(i, i + micro)
            logits = self.parts.modules[0](inputs[chunk], documents=batch.documents[chunk])
            total += plain(token_loss(logits, targets[chunk])[0])
        return total / (batch.global_loss_tokens / self.dims.dp)

    def _global_mean(self, local: torch.Tensor) -> float:
        """A loss known on the last pipeline stage, averaged over data-parallel ranks."""
        value = local.detach().clone().float()
        if self.dims.pp > 1:
            dist.all_reduce(value, group=self.pp_mesh.get_group())
        if self.dims.dp > 1:
            dist.all_reduce(value, group=self.dp_mesh.get_group())
            value /= self.dims.dp
        return float(value.item())

    def _should_eval(self, step: int) -> bool:
        every = self.spec.train.eval_every
        return bool(self.val_batches) and every > 0 and (step % every == 0 or step == 1)

    # -- the loop ----------------------------------------------------------------------

    def save_checkpoint(self) -> float:
        """Checkpoint the state after `self.step` now; returns the seconds training was held."""
        return self.checkpoints.save_now(self.step)

    def train(
        self,
        should_stop: StopRequest | None = None,
        *,
        save_on_stop: SaveRequest | None = None,
        stop_after: int | None = None,
    ) -> dict[str, Any]:
        """Train to `train.steps`, or until the ranks agree to stop (any rank's
        `should_stop(step)` as a voting step ends, which must stay true once it is; then a
        checkpoint if any rank's `save_on_stop()` says so: workers/engine/step_outcome.py),
        or after `stop_after` with a checkpoint; returns the run summary."""
        total = self.spec.train.steps
        log.info(
            "training %s for %d steps (%s) from step %d",
            self.spec.name,
            total,
            self.layout,
            self.step,
        )
        self.vote.ask(should_stop, save_on_stop, stop_after)
        self.ledger.start_at(self.step)
        try:
            return self._train(total)
        except BaseException:
            self.strategy.abandon()
            raise

    def _train(self, total: int) -> dict[str, Any]:
        step_times: list[float] = []
        last: dict[str, Any] = {}
        while self.step < total and not self._stops_here():
            metrics = self.strategy.advance()
            if step_times:  # the earlier step's work this one waited for first (GPU)
                step_times[-1] += self.drained_s
            step_times.append(metrics["step_time_s"])
            if self._should_eval(self.step):
                metrics["val_loss"] = self.evaluate()
            logged = self.metrics.should_log(self.step)
            metrics.update(
                self.checkpoints.save(
                    self.step, last_step=self.step == total, logged=metrics if logged else None
                )
            )
            if logged:
                self.metrics.log(metrics)
            last = metrics
            self.hooks.step(self.step)
        if self.vote.save:
            self.checkpoints.save_on_stop(self.step)
        self.checkpoints.wait()
        self.strategy.close()
        return self.metrics.summary(last, step_times, steps=self.step, layout=self.layout)

    def _stops_here(self) -> bool:
        """The ranks agreed to stop, and the strategy lets them stop after this step."""
        return self.vote.stop and self.strategy.may_stop_after(self.step)


def _model_parts(
    spec: JobSpec, dims: ParallelDims, mesh: DeviceMesh, device: torch.device, wrap: bool
) -> ModelParts:
    """This rank's part of the job's model, with its weights (`init_from`'s where given)."""
    family = load_family(family_of(spec.model))
    parts = build_model_parts(spec, family, dims=dims, mesh=mesh, device=device, data_parallel=wrap)
    if spec.model.init_from is not None:
        # Each rank's own shards, before the optimizer copies anything and before a
        # checkpoint (of this job, so newer) is restored over them.
        load_init_from(parts.modules, Path(spec.model.init_from), family, parts.args)
    return parts


def _optimizers(
    spec: JobSpec, parts: ModelParts, dims: ParallelDims, mesh: DeviceMesh, device: torch.device
) -> Optimizers:
    """AdamW over this rank's parts; ZeRO-1 state sliced over dp (and tp where it splits)."""
    return Optimizers(
        parts.modules,
        zero_stage=dims.effective_zero_stage,
        dp_mesh=mesh["dp"],
        state_mesh=mesh["dp", "tp"] if dims.tp > 1 else mesh["dp"],
        lr=spec.train.lr,
        weight_decay=spec.train.weight_decay,
        device=device,
        fused=spec.train.fused_optimizer,
    )
