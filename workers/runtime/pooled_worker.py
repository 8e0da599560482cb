"""A rank's process started before there is a job for it: the warm pool's worker.

It starts at the lowest CPU priority and imports torch and the engine (about 1.5 s of a
CPU rank's start) in a thread, so it can be adopted while it imports. `adopt()` raises it
to normal priority, waits for the imports, and makes it one rank of a job, exactly as a
`TrainingWorker` started for that rank would be; from then on it is one: the worker group
calls the same methods on it and kills it the same way. A job that comes while the pool's
replacements still import (jobs back to back) takes them, and what is left of their
imports runs at the job's priority: before, it started fresh processes beside them.

The pool owns its processes (Ray ends them with it), so a job's supervisor does not: a
rank the supervisor started would die with the supervisor, and an adopted one must too, or
it would train on beside the next supervisor's ranks. So an adopted worker watches the
supervisor that adopted it and ends its process once Ray says that actor died.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from workers.contract.data_access import DataAccess
from workers.runtime import priority
from workers.runtime.worker import TrainingWorker
from workers.storage.layout import CheckpointLocations, JobLayout

log = logging.getLogger(__name__)

# How often an adopted worker asks whether its supervisor is alive, and how long it
# waits for an answer (a busy supervisor answers late; only a death ends the rank).
WATCH_EVERY_S = 2.0
WATCH_TIMEOUT_S = 30.0


class PooledWorker(TrainingWorker):
    def __init__(self) -> None:  # no job yet: TrainingWorker.__init__ runs in adopt()
        self._background = priority.lower()  # the import thread starts at this priority
        self._adopted = False
        self._imports = threading.Thread(target=_import_engine, name="imports", daemon=True)
        self._imports.start()

    def imported(self) -> bool:
        """Whether torch and the engine are imported (the pool's count of ready ones)."""
        return not self._imports.is_alive()

    def adopt(
        self,
        layout: JobLayout,
        rank: int,
        world_size: int,
        spec_json: str,
        checkpoints: CheckpointLocations | None,
        cpus: float,
        supervisor: Any | None,
        access: DataAccess | None = None,
    ) -> int:
        """Become `rank` of the job (at normal priority), reading data by `access`, the
        rules of the supervisor that adopts it (a fresh rank inherits them from its
        environment; this process was started by the pool, whose environment is that of
        whichever control plane created it); returns this process's id."""
        if self._adopted:
            raise RuntimeError("this pooled worker already holds a rank")
        priority.normal()  # every thread, the imports too, if they still run
        self._imports.join()
        if access is not None:
            access.install()
        TrainingWorker.__init__(self, layout, rank, world_size, spec_json, checkpoints, cpus)
        self._adopted = True
        if supervisor is not None:
            threading.Thread(
                target=self._watch, args=(supervisor,), name="watch-supervisor", daemon=True
            ).start()
        log.info("job %s: a pooled worker became rank %d", layout.job_id, rank)
        return os.getpid()

    def _watch(self, supervisor: Any) -> None:
        import ray

        while True:
            time.sleep(WATCH_EVERY_S)
            try:
                ray.get(supervisor.__ray_ready__.remote(), timeout=WATCH_TIMEOUT_S)
            except ray.exceptions.ActorDiedError:
                log.error(
                    "job %s: the supervisor that adopted rank %d is gone; the rank ends, "
                    "as a rank it started would",
                    self.job_id,
                    self.rank,
                )
                os._exit(1)
            except Exception:  # slow, or unreachable for a moment: not a death
                continue


def _import_engine() -> None:
    """What a rank's start spends its time on, done ahead."""
    import torch  # noqa: F401

    import workers.engine.trainer  # noqa: F401
