"""A one-rank gloo world inside the test process, for tests that drive a Trainer directly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from shardline.workers.engine.distributed import init_world, leave_world
from shardline.workers.contract.net import free_port


@pytest.fixture
def one_rank_world() -> Iterator[torch.device]:
    device = torch.device("cpu")
    init_world(
        rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(), device=device
    )
    try:
        yield device
    finally:
        leave_world()
