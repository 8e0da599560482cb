"""The training loop: one object that owns the model, optimizer, schedule, scaler and data.

It runs inside an already-initialised torch.distributed world (any launcher: a Ray worker,
torchrun, or `shardline train`), and holds every piece of training state as a named
attribute so checkpointing can save and restore all of it.
"""

from __future__ import annotations

import logging
import math
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from workers.contract.local_sgd import DataParallelMode
from workers.contract.spec import JobSpec, Precision, spec_hash
from workers.engine.accounting import MEMORY_KINDS, memory_held, peak_flops
from workers.engine.async_dp import AsyncReplica
from workers.engine.checkpoint.manager import CheckpointManager
from workers.engine.checkpoint.state import ModelAndOptimizer, RngState
from workers.engine.checkpoint.tier import CommitSink, EventSink
from workers.engine.data import build_loader
from workers.engine.data_parallel import all_reduce_grads
from workers.engine.dtensor import plain
from workers.engine.grad_clip import clip_grad_norm, settle_partial_grads
from workers.engine.grad_compression import grad_traffic
from workers.engine.hf_weights import load_init_from
from workers.engine.local_sgd import OuterStep
from workers.engine.loss import cross_entropy, loss_context
from workers.engine.model import ModelArgs
from workers.engine.nonfinite import NonFiniteLoss
from workers.engine.optimizer import Optimizers
from workers.engine.parallel import ParallelDims
from workers.engine.parts import build_model_parts, grad_reduce_dtype
from workers.engine.pipeline import build_schedule
from workers.engine.precision import DynamicLossScaler, autocast, finite_or_none
from workers.engine.schedule import lr_at
from workers.engine.step_clock import PARTS, PIPELINE, StepClock
from workers.engine.step_outcome import SaveRequest, StepLedger, StopRequest, StopVote
from workers.storage.layout import CheckpointLocations
from workers.storage.skipped_batches import SkippedBatches

log = logging.getLogger(__name__)

MetricsSink = Callable[[dict[str, Any]], None]
# Called after backward and before the optimizer step; tests use it to inject faults.
GradHook = Callable[[int, list[nn.Module]], None]


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
        checkpoints: CheckpointLocations | None = None,
        on_event: EventSink | None = None,
        on_checkpoint: CommitSink | None = None,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        self.spec = spec
        self.device = device
        self.on_metrics = on_metrics
        self.on_step = on_step
        self.grad_hook = grad_hook
        self.on_progress = on_progress  # async: each push, between steps that end
        self.dims = ParallelDims.from_spec(spec.parallel, world_size)
        mesh = self.dims.build_mesh(device.type)
        self.dp_mesh, self.pp_mesh = mesh["dp"], mesh["pp"]
        tr = spec.train

        self.parts = build_model_parts(spec, dims=self.dims, mesh=mesh, device=device)
        if spec.model.init_from is not None:
            # Each rank's own shards, before the optimizer copies anything and before a
            # checkpoint (of this job, so newer) is restored over them.
            args = ModelArgs.from_resolved(spec.model.resolved())
            load_init_from(self.parts.modules, Path(spec.model.init_from), args)
        self.tokens_per_step = tr.global_batch_size * spec.model.resolved()["seq_len"]
        state_mesh = mesh["dp", "tp"] if self.dims.tp > 1 else self.dp_mesh
        self.optimizers = Optimizers(
            self.parts.modules,
            zero_stage=self.dims.effective_zero_stage,
            dp_mesh=self.dp_mesh,
            state_mesh=state_mesh,
            lr=tr.lr,
            weight_decay=tr.weight_decay,
            device=device,
            fused=tr.fused_optimizer,
        )
        self.scaler = DynamicLossScaler(enabled=spec.precision == Precision.fp16)
        self.clock = StepClock(device)
        self._params = self.parts.parameters()  # fixed once built: not listed per step
        self.traffic, compression_state = grad_traffic(
            self.parts.modules,
            self._params,
            compression=spec.parallel.grad_compression,
            dims=self.dims,
            micro_batches=spec.accumulation_steps,
            self_counted=spec.parallel.dp_mode != DataParallelMode.sync,
        )
        self.outer: OuterStep | None = None
        if spec.parallel.dp_mode == DataParallelMode.local_sgd:
            self.outer = OuterStep(
                self.parts.modules,
                spec.parallel.local_sgd,
                group=self.dp_mesh.get_group(),
                replicas=self.dims.dp,
                total_steps=tr.steps,
                traffic=self.traffic,
            )
        self._reduce_dtype = grad_reduce_dtype(spec)
        self._logged_local: list[float] = []  # this rank's memory and parts, logged steps
        self.pipeline = None
        if self.dims.pp > 1:
            self.pipeline = build_schedule(
                list(zip(self.parts.stage_ids, self.parts.modules, strict=True)),
                pp_mesh=self.pp_mesh,
                num_stages=self.parts.num_stages,
                n_microbatches=spec.accumulation_steps,
                schedule=spec.parallel.pp_schedule,
                loss_fn=self._pipeline_loss,
                device=device,
                wrap_chunk=self.clock.chunk,
            )
        self.loader = build_loader(
            spec, dp_rank=self.dp_mesh.get_local_rank(), dp_size=self.dims.dp
        )
        self.val_batches = self.loader.val_batches() if self.loader.has_validation else []
        self.peak_flops = peak_flops(device)
        self.layout = f"{self.dims.describe()},{spec.precision.value}"
        # Asynchronous replicas: this rank's parameter-server shard, served from step 0 or
        # the step restored (workers/engine/async_dp.py).
        self.async_dp: AsyncReplica | None = None
        if spec.parallel.dp_mode == DataParallelMode.asynchronous:
            self.async_dp = AsyncReplica(self, self._params)
        on_event = on_event or (lambda event: log.info("%s", event.message))
        where = checkpoints or CheckpointLocations()
        if where.save_url:  # batches this job skipped after a non-finite loss
            self.loader.skipped_batches = tuple(SkippedBatches(where.save_url).batches())
        self.checkpoints = CheckpointManager(
            spec.checkpoint,
            where,
            tensors=ModelAndOptimizer(
                self.parts,
                self.optimizers,
                outer=self.outer,
                replica=self.dp_mesh.get_local_rank(),
                shard=self.async_dp.shard if self.async_dp is not None else None,
            ),
            small={
                "scaler": self.scaler,
                "rng": RngState(),
                **({"powersgd": compression_state} if compression_state else {}),
            },
            info={
                "layout": self.layout,
                "spec": spec.model_dump(mode="json"),
                "spec_hash": spec_hash(spec),
                "versions": {"torch": torch.__version__},
            },
            on_event=on_event,
            on_commit=on_checkpoint,
            snapshot_multiple_of=self._meeting_every(),
            # Async calls save once a round: the snapshot budget is of a round's time.
            steps_per_call=self.spec.train.log_every if self.async_dp is not None else 1,
        )
        self.step = self.checkpoints.load() or 0  # the step restored after, or a fresh start
        if self.async_dp is not None:
            self.async_dp.start(self.step)
        self.vote = StopVote()  # train() fills in who asks to stop
        self.ledger = StepLedger(self.device, self.vote, loss_copies=self.dims.dp * self.dims.tp)
        self.ledger.start_at(self.step)
        self.drained_s = 0.0  # a logged step's wait for the earlier steps' queued work

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

    def _meeting_every(self) -> int:
        """Steps between the points where every replica holds the same parameters, where
        snapshots may be taken: every step, a local SGD sync, an async meeting."""
        par = self.spec.parallel
        if par.dp_mode == DataParallelMode.local_sgd:
            return par.local_sgd.sync_every
        if par.dp_mode == DataParallelMode.asynchronous:
            return self.spec.train.log_every
        return 1

    @property
    def model(self) -> nn.Module:
        """The model, where this rank holds it in one piece (no pipeline)."""
        if len(self.parts.modules) != 1:
            raise AttributeError("with pipeline parallelism use trainer.parts.modules")
        return self.parts.modules[0]

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

    def _pipeline_loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale_loss(cross_entropy(output, targets))

    def forward_backward(self, rows: torch.Tensor) -> torch.Tensor:
        """Forward and backward over this rank's rows; returns their mean loss (unscaled).

        On pipeline ranks without the last stage the returned loss is 0: the loss is
        known only where the logits are.
        """
        micro = self.spec.train.micro_batch_size
        inputs, targets = rows[:, :-1], rows[:, 1:]
        with loss_context(self.dims.tp > 1), autocast(self.spec.precision, self.device):
            if self.pipeline is not None:
                return self._pipeline_run(self.pipeline.step, inputs, targets)
            total = torch.zeros((), device=self.device)
            n = rows.shape[0] // micro
            for i in range(n):
                with self._grad_sync(sync=i == n - 1):
                    chunk = slice(i * micro, (i + 1) * micro)
                    loss = cross_entropy(self.parts.modules[0](inputs[chunk]), targets[chunk]) / n
                    self.scaler.scale_loss(loss).backward()
                total += plain(loss.detach())
            return total

    def _pipeline_run(
        self, run: Callable[..., Any], inputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        losses: list[torch.Tensor] | None = [] if self.parts.has_last_stage else None
        target = targets if self.parts.has_last_stage else None
        if self.parts.has_first_stage:
            run(inputs, target=target, losses=losses)
        else:
            run(target=target, losses=losses)
        if not losses:
            return torch.zeros((), device=self.device)
        return torch.stack([plain(v.detach()).float() for v in losses]).mean() / self.scaler.scale

    def _global_mean(self, local: torch.Tensor) -> float:
        """A loss known on the last pipeline stage, averaged over data-parallel ranks."""
        value = local.detach().clone().float()
        if self.dims.pp > 1:
            dist.all_reduce(value, group=self.pp_mesh.get_group())
        if self.dims.dp > 1:
            dist.all_reduce(value, group=self.dp_mesh.get_group())
            value /= self.dims.dp
        return float(value.item())

    # -- one optimizer step -------------------------------------------------------------

    def train_step(self) -> dict[str, Any]:
        """Run optimizer step `self.step + 1`; returns its metrics."""
        step = self.step + 1
        logged = self._should_log(step)
        clock = self.clock
        clock.arm(logged)
        self.drained_s = 0.0
        if logged and self.device.type == "cuda":  # its time is its own, not queued work's
            # What the steps before still had queued is theirs (the run's summary adds it).
            drain = time.perf_counter()
            torch.cuda.synchronize(self.device)
            self.drained_s = time.perf_counter() - drain
        start = time.perf_counter()
        with clock.part("data"):
            rows = self.loader.train_batch(step).to(self.device)
        with clock.part(PIPELINE if self.pipeline is not None else "compute"):
            local_loss = self.forward_backward(rows)
        if self.dims.syncs_grads_after_backward:
            with clock.part("comm"):
                all_reduce_grads(self._params, self.dp_mesh, self._reduce_dtype)
        if self.grad_hook is not None:
            self.grad_hook(step, self.parts.modules)

        with clock.part("compute"):
            params = self._params
            lr = self.lr_at(step)
            self.optimizers.set_lr(lr)
            if self.dims.tp > 1:  # only tensor parallel leaves partial sums
                settle_partial_grads(params)
            skipped = self.scaler.unscale_and_check(params)
        grad_norm = math.nan
        if not skipped:
            # A local SGD replica clips its own gradients; where every rank holds the
            # same whole gradients, its own norm is the global one: no collective.
            alone = self.outer is not None or self.dims.grads_replicated
            grad_norm = clip_grad_norm(
                params,
                self.spec.train.grad_clip or math.inf,
                stage_ranks=1 if alone else self.dims.dp * self.dims.tp,
                clock=clock,
                over_world=not alone,
            )
            with clock.part("compute"):
                self.optimizers.step()
        syncs = False
        if self.outer is not None and self.outer.due(step):
            syncs = True
            with clock.part("comm"):
                self.outer.sync()
        with clock.part("compute"):
            self.scaler.update(skipped)
            memory = None
            if logged:  # local SGD's anchors and momentum count as optimizer state
                more = self.outer.state_tensors() if self.outer is not None else []
                memory = memory_held(params, self.optimizers, more)
            self.optimizers.zero_grad(set_to_none=True)
        self.ledger.note(step, local_loss)
        loss_value: float | None = None  # known only where the ranks vote
        if self._votes(step, logged, syncs):
            with clock.part("comm"):
                # The loss's mean, the stop vote and any non-finite loss, in one all-reduce.
                loss_value = self.ledger.settle(step, local_loss, self.loader.batch_of)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        step_time = time.perf_counter() - start
        self.step = step
        if memory is not None:  # gathered over the world after the step (see train)
            parts = clock.seconds()
            self._logged_local = [
                *(memory[kind] for kind in MEMORY_KINDS),
                *(parts[part] for part in PARTS),
                step_time,
            ]

        tokens_per_s = self.tokens_per_step / step_time
        metrics: dict[str, Any] = {
            "step": step,
            "loss": loss_value,
            "grad_norm": finite_or_none(grad_norm),
            "lr": lr,
            "tokens_per_s": tokens_per_s,
            "step_time_s": step_time,
            "mfu": self._mfu(tokens_per_s),
        }
        self.traffic.step_done()
        if logged and self.dims.dp > 1:  # the mean over the steps since the last logged one
            metrics["grad_bytes"] = self.traffic.take_per_step()
        if logged and self.outer is not None:
            metrics["outer_steps"] = self.outer.syncs_by(step)
        if self.scaler.enabled:
            metrics.update(
                loss_scale=self.scaler.scale,
                skipped=skipped,
                skipped_steps=self.scaler.skipped_steps,
            )
        return metrics

    def _votes(self, step: int, logged: bool, syncs: bool) -> bool:
        """Whether the ranks agree after `step` (workers/engine/step_outcome.py): where
        it logs, evaluates or saves (no save may hold a state past a non-finite loss), and
        on the ledger's cadence; a local SGD replica only at its syncs (it stops only
        there, and nothing crosses replicas between)."""
        last = step == self.spec.train.steps
        if logged or self._should_eval(step) or self.checkpoints.due(step, last_step=last):
            return True
        if self.outer is not None:
            return syncs or step == self.vote.stop_after
        return self.ledger.due(step)

    def _log(self, metrics: dict[str, Any]) -> None:
        """Hand a logged step's metrics on, with every rank's part of them where the ranks
        can still gather. Where a peer died after this step's checkpoint committed, the
        metrics go on without the ranks' breakdown before the error does: a restore from
        that checkpoint trains on after this step, and would never record it."""
        try:
            self._gather_logged(metrics)
        except Exception:
            if self.on_metrics is not None:
                self.on_metrics(metrics)
            raise
        if self.on_metrics is not None:
            self.on_metrics(metrics)

    def _gather_logged(self, metrics: dict[str, Any]) -> None:
        """A logged step's memory (the most any rank holds, per kind) and every rank's
        breakdown of its step, in one collective after the step's checkpoint."""
        own = self._logged_local
        held = metrics.get("checkpoint_blocking_s", 0.0) + metrics.get("snapshot_blocking_s", 0.0)
        own[len(MEMORY_KINDS) + PARTS.index("checkpoint")] = held
        local = torch.tensor(own, dtype=torch.float64, device=self.device)
        if dist.is_initialized() and self.dims.world_size > 1:
            rows = [torch.empty_like(local) for _ in range(self.dims.world_size)]
            dist.all_gather(rows, local)
        else:
            rows = [local]
        table = torch.stack(rows).tolist()
        n = len(MEMORY_KINDS)
        metrics["mem_bytes"] = {
            kind: int(max(row[i] for row in table)) for i, kind in enumerate(MEMORY_KINDS)
        }
        metrics["breakdown"] = [
            {
                "rank": rank,
                **{f"{part}_s": row[n + i] for i, part in enumerate(PARTS)},
                "step_s": row[-1],
                "mem_bytes": int(sum(row[:n])),  # what this rank holds (the page's ranks)
            }
            for rank, row in enumerate(table)
        ]

    def _max_over_world(self, values: dict[str, int]) -> dict[str, int]:
        """The most any rank holds, per kind (ranks differ under pp and uneven ZeRO-1)."""
        if not dist.is_initialized() or self.dims.world_size == 1:
            return values
        t = torch.tensor(list(values.values()), dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return dict(zip(values, (int(v) for v in t.tolist()), strict=True))

    def _mfu(self, tokens_per_s: float) -> float | None:
        if self.peak_flops is None:
            return None
        return self.parts.flops_per_token * tokens_per_s / (self.peak_flops * self.dims.world_size)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the fixed held-out batches, across the whole world."""
        self.parts.train(False)
        losses = []
        for batch in self.val_batches:
            rows = batch.to(self.device)
            with loss_context(self.dims.tp > 1), autocast(self.spec.precision, self.device):
                if self.pipeline is not None:
                    losses.append(self._pipeline_run(self.pipeline.eval, rows[:, :-1], rows[:, 1:]))
                    continue
                for chunk in rows.split(self.spec.train.micro_batch_size):
                    logits = self.parts.modules[0](chunk[:, :-1])
                    losses.append(plain(cross_entropy(logits, chunk[:, 1:])))
        self.parts.train(True)
        return self._global_mean(torch.stack(losses).mean())

    # -- the loop ----------------------------------------------------------------------

    def _should_log(self, step: int) -> bool:
        tr = self.spec.train
        return step % tr.log_every == 0 or step == tr.steps or step == 1

    def _should_eval(self, step: int) -> bool:
        every = self.spec.train.eval_every
        return bool(self.val_batches) and every > 0 and (step % every == 0 or step == 1)

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
        self.vote = StopVote(should_stop, save_on_stop, stop_after)
        self.ledger = StepLedger(self.device, self.vote, loss_copies=self.dims.dp * self.dims.tp)
        self.ledger.start_at(self.step)
        try:
            return self._train(total)
        except BaseException:
            if self.async_dp is not None:
                self.async_dp.abandon()
            raise

    def _train(self, total: int) -> dict[str, Any]:
        step_times: list[float] = []
        last: dict[str, Any] = {}
        while self.step < total and not self._stops_here():
            metrics = self.train_step() if self.async_dp is None else self._train_round()
            if step_times:  # the earlier step's work this one waited for first (GPU)
                step_times[-1] += self.drained_s
            step_times.append(metrics["step_time_s"])
            if self._should_eval(self.step):
                metrics["val_loss"] = self.evaluate()
            logged = self._should_log(self.step)
            metrics.update(
                self.checkpoints.save(
                    self.step, last_step=self.step == total, logged=metrics if logged else None
                )
            )
            if logged:
                self._log(metrics)
            last = metrics
            if self.on_step is not None:
                self.on_step(self.step)
        if self.vote.save:
            self.checkpoints.save_on_stop(self.step)
        self.checkpoints.wait()
        if self.async_dp is not None:
            self.async_dp.close()
        return self._summary(last, step_times)

    def _train_round(self) -> dict[str, Any]:
        """Async: train up to the next logged step, where the replicas meet."""
        assert self.async_dp is not None
        steps_before = self.step
        every, total = self.spec.train.log_every, self.spec.train.steps
        last = 1 if self.step == 0 else min(total, (self.step // every + 1) * every)
        metrics = self.async_dp.train_round(last, self.vote)
        bad = metrics.pop("nonfinite_step")
        if bad is not None:  # known to every rank at the meeting: all raise
            raise NonFiniteLoss(bad, math.nan, self.loader.batch_of(bad))
        self.step = last
        steps = last - steps_before
        memory = memory_held(self._params, self.optimizers, self.async_dp.shard.tensors())
        # A replica's gradients live from each backward until its push, not at a meeting:
        # count the most it holds.
        memory["grads"] = sum(p.nelement() * p.element_size() for p in self._params)
        parts = self.clock.seconds()
        self._logged_local = [
            *(memory[kind] for kind in MEMORY_KINDS),
            *(parts[part] / steps for part in PARTS),
            metrics["step_time_s"],
        ]
        tokens_per_s = self.tokens_per_step / metrics["step_time_s"]
        metrics.update(
            lr=self.lr_at(last),
            tokens_per_s=tokens_per_s,
            mfu=self._mfu(tokens_per_s),
        )
        return metrics

    def _stops_here(self) -> bool:
        """The ranks agreed to stop, and may stop after this step: any step, or under local
        SGD a sync (a pause or a stop then takes effect at the next sync)."""
        return self.vote.stop and (self.outer is None or self.outer.due(self.step))

    def _peak_memory(self) -> int:
        """The most memory any rank used: allocated GPU memory, or resident set on CPU."""
        if self.device.type == "cuda":
            own = int(torch.cuda.max_memory_allocated(self.device))
        else:
            own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return self._max_over_world({"peak": own})["peak"]

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
            "peak_mem_bytes": self._peak_memory(),
        }
