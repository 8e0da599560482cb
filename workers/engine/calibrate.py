"""Measure the rates the cost model needs, on this machine, for one spec's model.

- flops_per_s: the spec's model (two of its layers, with its width, vocabulary and
  micro-batch), forward and backward on one micro-batch, in the spec's precision (on a
  CPU on one thread: one core's rate);
- memory_bytes_per_s: an in-place add over 256 MiB (read and written);
- bandwidth and latency: all-reduces of 4 KiB and 16 MiB between two local processes
  (gloo on a CPU; a one-GPU machine keeps the defaults, as NCCL needs two devices);
- runtime_bytes: this process's resident set (CPU) before the model is built, or the
  default (GPU: the CUDA context is not in the allocator's count);
- cores: the CPUs this process may run on.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F

from workers.contract.cost_model import DEFAULT_RATES, INTER, INTRA, Rates, flops_per_token
from workers.contract.net import free_port
from workers.contract.spec import JobSpec
from workers.engine.distributed import init_world, leave_world, pick_device
from workers.engine.launch import rank_processes
from workers.engine.model import ModelArgs, Transformer
from workers.engine.precision import AUTOCAST_DTYPES

CALIBRATION_LAYERS = 2
SMALL, LARGE = 4 << 10, 16 << 20  # all-reduce sizes: latency, then bandwidth


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


def model_rate(spec: JobSpec, device: torch.device) -> float:
    """Training FLOP/s of the spec's model shape on one micro-batch."""
    resolved = {**spec.model.resolved(), "n_layers": CALIBRATION_LAYERS}
    torch.manual_seed(0)
    with torch.device(device):
        model = Transformer(ModelArgs.from_resolved(resolved))
    rows = torch.randint(
        0, resolved["vocab_size"], (spec.train.micro_batch_size, resolved["seq_len"] + 1)
    ).to(device)
    dtype = AUTOCAST_DTYPES.get(spec.precision)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(rows[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), rows[:, 1:].flatten())
        loss.backward()

    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)  # one core's rate: the cost model shares cores over ranks
    try:
        seconds = seconds_per_call(step, 3, device)
    finally:
        torch.set_num_threads(threads)
    return flops_per_token(resolved) * rows[:, :-1].numel() / seconds


def memory_rate(device: torch.device) -> float:
    x = torch.zeros(64 << 20, dtype=torch.float32, device=device)
    return 2 * x.numel() * 4 / seconds_per_call(lambda: x.add_(1.0), 5, device)


def _all_reduce_rank(rank: int, port: int, out: object) -> None:
    init_world(
        rank=rank,
        world_size=2,
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
        if rank == 0:  # with its resident set: a rank's runtime, before any model
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            out.put((times, rss))  # type: ignore[attr-defined]
    finally:
        leave_world()


def link_rates() -> tuple[float, float, int]:
    """(latency s, bus bytes/s) of a gloo all-reduce between two local processes, and the
    resident bytes of such a rank process."""
    ctx = rank_processes()
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_all_reduce_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    (small, large), rss = out.get(timeout=120)
    for p in procs:
        p.join(timeout=30)
    # A ring all-reduce moves 2 (n - 1) / n of the bytes over each link: n = 2 gives 1.
    return small, LARGE / max(large - small, 1e-9), rss


def calibrate(spec: JobSpec) -> Rates:
    """This machine's rates for `spec`'s model, starting from the device kind's defaults."""
    device = pick_device(0)
    base = DEFAULT_RATES[device_kind(device)]
    rates = replace(
        base,
        flops_per_s=model_rate(spec, device),
        memory_bytes_per_s=memory_rate(device),
    )
    if device.type == "cpu":
        latency, bandwidth, rss = link_rates()
        rates = replace(
            rates,
            latency_s=latency,
            bandwidth={INTRA: bandwidth, INTER: base.bandwidth[INTER]},
            runtime_bytes=rss,
            cores=float(len(os.sched_getaffinity(0))),
        )
    return rates
