"""Joining and leaving a torch.distributed world, the same way under any launcher."""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


def pick_device(local_rank: int) -> torch.device:
    """The rank's GPU where there is one, else the CPU."""
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    # With GPUs, gloo still serves the few CPU-side collectives (e.g. object gathers).
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def init_world(
    *,
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    device: torch.device,
    timeout_s: float = 300.0,
) -> None:
    """Join the world's process group; fails after `timeout_s` if peers never arrive."""
    dist.init_process_group(
        backend=backend_for(device),
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    log.info(
        "rank %d/%d joined via %s:%d on %s", rank, world_size, master_addr, master_port, device
    )


def leave_world() -> None:
    """After success: wait for every rank, then tear the process group down."""
    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def abandon_world() -> None:
    """After a failure: tear down without a barrier (peers may be stuck or gone), so the
    original error is reported at once instead of a collective timeout."""
    if dist.is_initialized():
        dist.destroy_process_group()


def limit_cpu_threads(ranks_on_this_host: int) -> None:
    """Share the host's cores between ranks instead of letting each grab all of them."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks_on_this_host))
