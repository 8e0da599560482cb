"""The data-parallel strategies are named by `parallel.dp_mode`; the experimental ones are
imported only when a job asks for one."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shardline.workers.contract.local_sgd import DataParallelMode
from shardline.workers.engine.dp_strategy import STRATEGIES, SyncStrategy, strategy_class


@pytest.mark.parametrize("mode", list(DataParallelMode))
def test_every_mode_has_a_strategy(mode: DataParallelMode) -> None:
    cls = strategy_class(mode)
    assert cls.__name__ == STRATEGIES[mode].rpartition(":")[2]
    # Sync wraps the model for DDP/FSDP; the experimental ones exchange what they trained.
    assert cls.wraps_model == (mode == DataParallelMode.sync)


def test_sync_is_the_core_s_own() -> None:
    assert strategy_class(DataParallelMode.sync) is SyncStrategy


def test_a_sync_job_never_imports_the_experimental_strategies() -> None:
    probe = (
        "import sys\n"
        "from shardline.workers.contract.local_sgd import DataParallelMode\n"
        "import shardline.workers.engine.trainer\n"
        "from shardline.workers.engine.dp_strategy import strategy_class\n"
        "strategy_class(DataParallelMode.sync)\n"
        "inside = 'shardline.workers.engine.experimental'\n"
        "print(sorted(m for m in sys.modules if m.startswith(inside)))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
