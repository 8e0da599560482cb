"""Gradient compression for data parallelism, and the count of gradient bytes it sends.

`bf16` and `powersgd` on a DDP model are PyTorch's own communication hooks
(`bf16_compress_hook`, `powerSGD_hook`); the FSDP and after-backward paths take `bf16` as
their reduce dtype (workers/engine/data_parallel.py). Every path counts the payload it
hands to data-parallel gradient collectives into one `GradTraffic`, so `grad_bytes` in the
metrics compares modes on the same terms: the bytes a rank puts into all-reduce or
reduce-scatter per step (what the wire carries is that times the algorithm's factor,
about 2(n-1)/n for a ring).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from shardline.workers.contract.grad_compression import GradCompression, GradCompressionKind
from shardline.workers.engine.dtensor import local_part
from shardline.workers.engine.parallel import ParallelDims

log = logging.getLogger(__name__)


class GradTraffic:
    """Gradient payload bytes this rank handed to data-parallel collectives. A path whose
    bytes are the same every step adds `fixed_per_step`; the hooks add what they send."""

    def __init__(self, fixed_per_step: int = 0) -> None:
        self.fixed_per_step = fixed_per_step
        self._bytes = 0
        self._steps = 0

    def add(self, nbytes: int) -> None:
        self._bytes += nbytes

    def step_done(self) -> None:
        self._bytes += self.fixed_per_step
        self._steps += 1

    def take_per_step(self) -> int:
        """Mean bytes per step since the last take (what a logged step reports)."""
        mean = self._bytes // max(self._steps, 1)
        self._bytes, self._steps = 0, 0
        return mean


class PowerSgdProgress:
    """PowerSGD's step count, saved with checkpoints so a restored job goes on compressing
    instead of running its whole warm-up again. Its error-feedback residuals and
    warm-start matrices are not saved: they restart from zero after a restore (one step's
    dropped remainder is lost)."""

    def __init__(self, state: PowerSGDState) -> None:
        self.state = state

    def state_dict(self) -> dict[str, int]:
        return {"iter": int(self.state.iter)}

    def load_state_dict(self, saved: dict[str, int]) -> None:
        done = int(saved["iter"])
        self.state.iter = done
        # The restored process's first step runs plain: DDP rebuilds its buckets after
        # its first backward, and PowerSGD's per-bucket residuals must be made after that
        # (why PyTorch asks for at least 2 warm-up steps).
        self.state.start_powerSGD_iter = max(self.state.start_powerSGD_iter, done + 1)


def ddp_bytes_per_step(params: list[nn.Parameter]) -> int:
    """What DDP all-reduces in a step: every gradient once, in its own dtype."""
    return sum(p.numel() * p.element_size() for p in params if p.requires_grad)


def fsdp_bytes_per_step(params: list[nn.Parameter], dp: int, reduce_dtype: torch.dtype) -> int:
    """What FSDP reduce-scatters in a step: each gradient whole (its shards times dp)."""
    size = torch.empty((), dtype=reduce_dtype).element_size()
    return sum(local_part(p).numel() * dp * size for p in params if p.requires_grad)


def compress_ddp(
    model: nn.Module, compression: GradCompression, traffic: GradTraffic
) -> PowerSgdProgress | None:
    """Register the compressing hook on a DDP `model`, counting into `traffic`; returns
    the state a checkpoint must hold (PowerSGD's), if any."""
    if not isinstance(model, DistributedDataParallel):
        raise TypeError("DDP communication hooks need a DistributedDataParallel model")
    group = model.process_group
    if compression.kind == GradCompressionKind.bf16:
        model.register_comm_hook(group, _counted_bf16(traffic))
        log.info("gradients all-reduced in bf16 (DDP communication hook)")
        return None
    if compression.kind != GradCompressionKind.powersgd:
        raise ValueError(f"no DDP hook for grad_compression kind {compression.kind.value!r}")
    state = PowerSGDState(
        process_group=group,
        matrix_approximation_rank=compression.rank,
        start_powerSGD_iter=compression.warmup_steps,
        use_error_feedback=True,
        warm_start=True,
    )
    model.register_comm_hook(state, _counted_powersgd(traffic))
    log.info(
        "PowerSGD rank %d after %d plain all-reduce steps (DDP communication hook)",
        compression.rank,
        compression.warmup_steps,
    )
    return PowerSgdProgress(state)


def _counted_bf16(traffic: GradTraffic) -> Any:
    def hook(group: dist.ProcessGroup, bucket: dist.GradBucket) -> torch.futures.Future[Any]:
        traffic.add(bucket.buffer().numel() * 2)
        return default_hooks.bf16_compress_hook(group, bucket)

    return _with_real_annotations(hook)


def _counted_powersgd(traffic: GradTraffic) -> Any:
    previous: list[torch.futures.Future[Any]] = []

    def hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[Any]:
        # One bucket at a time: PowerSGD issues its later collectives from the previous
        # one's callbacks, on another thread, and a process group needs every rank to issue
        # its collectives in one order (with two buckets in flight Gloo saw mismatched
        # sizes). Waiting gives up overlapping one bucket's compression with the next.
        if previous:
            previous.pop().wait()
        # PyTorch keeps a running count of the elements PowerSGD sends (uncompressed
        # tensors whole, P and Q for the rest); during warm-up it sends the bucket.
        plain = state.iter < state.start_powerSGD_iter
        before = state.total_numel_after_compression
        future = powerSGD_hook(state, bucket)
        sent = bucket.buffer().numel() if plain else state.total_numel_after_compression - before
        traffic.add(sent * bucket.buffer().element_size())
        previous.append(future)
        return future

    return _with_real_annotations(hook)


def _with_real_annotations(hook: Any) -> Any:
    """DDP checks a hook's annotations against the classes themselves, and this module's
    postponed annotations are strings."""
    hook.__annotations__ = {
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }
    return hook


def grad_traffic(
    modules: list[nn.Module],
    params: list[nn.Parameter],
    *,
    compression: GradCompression,
    dims: ParallelDims,
    micro_batches: int,
    self_counted: bool = False,
) -> tuple[GradTraffic, PowerSgdProgress | None]:
    """How this rank's gradients travel in `dims`' layout: the count of their bytes, with
    any DDP hook registered, and the compression state a checkpoint holds.
    `micro_batches` is how many this rank runs a step."""
    bf16 = compression.kind == GradCompressionKind.bf16
    if dims.dp == 1 or self_counted:  # local SGD's syncs and async pushes count their own
        return GradTraffic(), None
    if dims.effective_zero_stage >= 2:
        dtype = torch.bfloat16 if bf16 else torch.float32
        # FSDP reduce-scatters after every micro-batch (that keeps gradients sharded);
        # a pipeline schedule syncs only the last one.
        syncs = micro_batches if dims.pp == 1 else 1
        return GradTraffic(fsdp_bytes_per_step(params, dims.dp, dtype) * syncs), None
    if dims.syncs_grads_after_backward:
        size = 2 if bf16 else None
        return GradTraffic(
            sum(
                local_part(p).numel() * (size or p.element_size())
                for p in params
                if p.requires_grad
            )
        ), None
    if compression.kind == GradCompressionKind.none:
        return GradTraffic(ddp_bytes_per_step(params)), None
    traffic = GradTraffic()
    return traffic, compress_ddp(modules[0], compression, traffic)
