"""Measure the rates the cost model needs, on this machine, for one spec's model.

- flops_per_s: the spec's model (two of its layers, with its width, vocabulary and
  micro-batch), forward and backward on one micro-batch, in the spec's precision (on a
  CPU on one thread: one core's rate);
- memory_bytes_per_s: an in-place add over 256 MiB (read and written);
- bandwidth and latency: all-reduces of 4 KiB and 16 MiB among as many local processes
  as the plan's ranks (at most 8; gloo on a CPU; a GPU machine keeps the defaults);
- activation_scale: the bytes the first step kept beyond the gradients (resident-set
  peak on a CPU, the allocator's peak on a GPU), over the activations the cost model counts;
- runtime_bytes: a rank process's resident set (CPU) before any model, or the default
  (GPU: the CUDA context is not in the allocator's count);
- cores: the CPUs this process may run on.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from shardline.workers.contract.cost_model import flops_per_token, micro_batch_activation_bytes
from shardline.workers.contract.net import free_port
from shardline.workers.contract.rates import (
    DEFAULT_RATES,
    INTER,
    INTRA,
    MAX_CALIBRATION_RANKS,
    Rates,
)
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.distributed import init_world, leave_world, pick_device
from shardline.workers.engine.launch import rank_processes
from shardline.workers.engine.models.family import load_family
from shardline.workers.engine.models.registry import family_of
from shardline.workers.engine.precision import AUTOCAST_DTYPES

CALIBRATION_LAYERS = 2
SMALL, LARGE = 4 << 10, 16 << 20  # all-reduce sizes: latency, then bandwidth
MAX_ACTIVATION_SCALE = 8.0


def device_kind(device: torch.device) -> str:
    """The DEFAULT_RATES key for this device (unknown GPUs start from the H100's)."""
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower()
    return next((kind for kind in ("h200", "h100", "a100") if kind in name), "h100")


def seconds_per_call(
    run: Callable[[], object], repeats: int, device: torch.device, warmup: int = 1
) -> float:
    """Mean seconds of `run()` after `warmup` calls (allocation, kernels chosen), the
    device synchronised only before and after the timed calls."""
    for _ in range(warmup):
        run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / repeats


def _resident_bytes(field: str) -> int:
    """VmRSS (now) or VmHWM (the peak since the last reset) of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak(device: torch.device) -> int:
    """Start counting the peak from now; returns the bytes held now."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return int(torch.cuda.memory_allocated(device))
    with contextlib.suppress(OSError):  # no /proc: the lifetime peak is read instead
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to VmRSS
    return _resident_bytes("VmRSS")


def _peak(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return _resident_bytes("VmHWM")


def model_rate(spec: JobSpec, device: torch.device) -> tuple[float, float]:
    """Training FLOP/s of the spec's model shape on one micro-batch, and how many bytes
    the first step kept per byte of activations the cost model counts for it."""
    resolved = {**spec.model.resolved(), "n_layers": CALIBRATION_LAYERS}
    torch.manual_seed(0)
    family = load_family(family_of(spec.model))
    with torch.device(device):
        model = family.build(family.args(resolved))
    rows = torch.randint(
        0, resolved["vocab_size"], (spec.train.micro_batch_size, resolved["seq_len"] + 1)
    ).to(device)
    dtype = AUTOCAST_DTYPES.get(spec.precision)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(rows[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), rows[:, 1:].flatten())
        loss.backward()

    before = _reset_peak(device)
    step()
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    kept = max(_peak(device) - before - grads, 0)
    counted = micro_batch_activation_bytes(
        spec.model_copy(
            update={"model": spec.model.model_copy(update={"n_layers": CALIBRATION_LAYERS})}
        )
    )
    scale = min(max(kept / counted, 1.0), MAX_ACTIVATION_SCALE)
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)  # one core's rate: the cost model shares cores over ranks
    try:
        seconds = seconds_per_call(step, 3, device)
    finally:
        torch.set_num_threads(threads)
    return flops_per_token(resolved) * rows[:, :-1].numel() / seconds, scale


def memory_rate(device: torch.device) -> float:
    x = torch.zeros(64 << 20, dtype=torch.float32, device=device)
    return 2 * x.numel() * 4 / seconds_per_call(lambda: x.add_(1.0), 5, device)


def _all_reduce_rank(rank: int, world: int, port: int, out: object) -> None:
    init_world(
        rank=rank,
        world_size=world,
        master_addr="127.0.0.1",
        master_port=port,
        device=torch.device("cpu"),
    )
    try:
        times = []
        for size in (SMALL, LARGE):
            tensor = torch.zeros(size // 4)
            times.append(
                seconds_per_call(partial(dist.all_reduce, tensor), 10, torch.device("cpu"))
            )
        # A training rank's process also holds the engine's modules (FSDP, DCP, pipelining).
        import shardline.workers.engine.warm  # noqa: F401

        if rank == 0:  # with its resident set: a rank's runtime, before any model
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            out.put((times, rss))  # type: ignore[attr-defined]
    finally:
        leave_world()


def link_rates(world: int) -> tuple[float, float, int]:
    """(latency s, bus bytes/s) of a gloo all-reduce between `world` local processes, and
    the resident bytes of such a rank process. More ranks than cores wait for each other to
    be scheduled: that is part of each collective's cost there, so it is measured as such."""
    ctx = rank_processes()
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_all_reduce_rank, args=(r, world, port, out)) for r in range(world)]
    for p in procs:
        p.start()
    (small, large), rss = out.get(timeout=120)
    for p in procs:
        p.join(timeout=30)
    # A ring all-reduce moves 2 (n - 1) / n of the bytes over each link.
    return small, 2 * (world - 1) / world * LARGE / max(large - small, 1e-9), rss


def calibrate(spec: JobSpec, ranks: int = 2) -> Rates:
    """This machine's rates for `spec`'s model on `ranks` ranks (collectives timed among
    that many processes, at most MAX_CALIBRATION_RANKS), from the device kind's defaults."""
    device = pick_device(0)
    base = DEFAULT_RATES[device_kind(device)]
    flops, activation_scale = model_rate(spec, device)
    rates = replace(
        base,
        flops_per_s=flops,
        memory_bytes_per_s=memory_rate(device),
        activation_scale=activation_scale,
    )
    if device.type == "cpu":
        latency, bandwidth, rss = link_rates(min(max(ranks, 2), MAX_CALIBRATION_RANKS))
        rates = replace(
            rates,
            latency_s=latency,
            bandwidth={INTRA: bandwidth, INTER: base.bandwidth[INTER]},
            runtime_bytes=rss,
            cores=float(len(os.sched_getaffinity(0))),
        )
    return rates
