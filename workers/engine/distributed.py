"""Joining and leaving a torch.distributed world, the same way under any launcher."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import struct
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
    own_addr: str | None = None,
) -> None:
    """Join the world's process group; fails after `timeout_s` if peers never arrive.

    Every socket this rank listens on is bound to its own address (`own_addr`; rank 0's
    is `master_addr`), never to every interface: torch's rendezvous store answers anyone
    who connects, with no authentication."""
    _bind_collectives_to(own_addr or (master_addr if rank == 0 else None))
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group(
        backend=backend_for(device),
        store=_rendezvous_store(rank, world_size, master_addr, master_port, timeout),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    log.info(
        "rank %d/%d joined via %s:%d on %s", rank, world_size, master_addr, master_port, device
    )


def _rendezvous_store(
    rank: int, world_size: int, master_addr: str, master_port: int, timeout: timedelta
) -> dist.TCPStore:
    """The world's key-value store. Rank 0 serves it on a socket it binds to master_addr
    itself: given only a port (as `init_method="tcp://..."` does), torch listens on all
    interfaces."""
    # Under torchrun its agent already serves the store there: every rank is a client.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    if rank != 0 or agent_store:
        return dist.TCPStore(master_addr, master_port, world_size, False, timeout)
    family = socket.AF_INET6 if ":" in master_addr else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((master_addr, master_port))
        listener.listen(max(128, world_size))
    except OSError:
        listener.close()
        raise
    # The store owns the socket from here: detach() hands over the descriptor.
    return dist.TCPStore(
        master_addr, master_port, world_size, True, timeout, master_listen_fd=listener.detach()
    )


def _bind_collectives_to(address: str | None) -> None:
    """Have gloo (and, on loopback, NCCL's bootstrap) listen on `address`'s interface,
    unless the operator chose one (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME). NCCL is left to
    pick its own interface elsewhere: between nodes it wants the fastest, not Ray's."""
    if address is None:
        return
    interface = interface_of(address)
    if interface is None:
        return
    os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    if ipaddress.ip_address(address).is_loopback:
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)


def interface_of(address: str) -> str | None:
    """The network interface holding IPv4 `address` (any loopback address: the loopback
    interface), or None: not an IPv4 address, no such interface, or not Linux."""
    try:
        wanted = ipaddress.ip_address(address)
    except ValueError:
        return None  # a host name
    if wanted.version != 4:
        return None
    try:
        import fcntl
    except ImportError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                request = struct.pack("256s", name.encode()[:15])
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:
                continue  # an interface with no IPv4 address
            have = ipaddress.ip_address(answer[20:24])
            if have == wanted or (wanted.is_loopback and have.is_loopback):
                return name
    return None


_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


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
