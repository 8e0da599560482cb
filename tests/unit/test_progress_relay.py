"""The relay's metrics after a restore: a checkpoint that committed before rank 0 logged
its step carries that step's metrics, and the restore event hands them on, once."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from shardline.workers.contract.events import RESTORED_METRICS, Event, EventKind
from shardline.workers.contract.progress import EventEntry, MetricsEntry
from shardline.workers.contract.status import WorkerPhase, WorkerStatus
from shardline.workers.runtime.supervisor.relay import ProgressRelay


def metrics(step: int) -> dict[str, Any]:
    return {"step": step, "loss": 5.0 - step / 10, "lr": 1e-3}


def restored_world(step: int, then: list[int]) -> WorkerStatus:
    """Rank 0 of a world that restored `step`'s checkpoint and logged `then` since."""
    restored = Event(
        EventKind.RESTORED,
        f"restored checkpoint step {step} (dp2) from storage in 0.10s",
        {"step": step, "path": "/x", "tier": "storage", RESTORED_METRICS: metrics(step)},
    )
    return WorkerStatus(
        rank=0,
        phase=WorkerPhase.TRAINING,
        step=then[-1] if then else step,
        loss=1.0,
        last_progress=time.time(),
        metrics=[metrics(s) for s in then],
        events=[restored],
    )


def relay_after_replay(tmp_path: Path, logged: list[int]) -> ProgressRelay:
    """A relay whose rank 0 wrote `logged` to its metrics file and then died; the new
    world's launch replays the file first, as the supervisor does."""
    file = tmp_path / "metrics.jsonl"
    file.write_text("".join(json.dumps(metrics(s)) + "\n" for s in logged))
    relay = ProgressRelay("job", file, log_every=1, reported_step=0)
    relay.replay()
    return relay


def recorded_steps(relay: ProgressRelay) -> list[int]:
    return [e.step for e in relay.buffer.after(0) if isinstance(e, MetricsEntry)]


def test_a_step_whose_checkpoint_committed_before_it_was_logged_is_recorded(
    tmp_path: Path,
) -> None:
    relay = relay_after_replay(tmp_path, logged=[1, 2, 3, 4, 5])  # rank 0 died before 6
    restored = relay.collect([restored_world(6, then=[7, 8])])
    assert recorded_steps(relay) == [1, 2, 3, 4, 5, 6, 7, 8]
    six = next(e for e in relay.buffer.after(0) if isinstance(e, MetricsEntry) and e.step == 6)
    assert six.values == metrics(6)
    # The event is stored without the metrics, and still names the restored step.
    assert restored is not None and restored.data["step"] == 6
    stored = [e.data for e in relay.buffer.after(0) if isinstance(e, EventEntry)]
    assert stored == [{"step": 6, "path": "/x", "tier": "storage", "kind": "restored"}]


def test_a_restored_step_logged_already_is_not_recorded_twice(tmp_path: Path) -> None:
    relay = relay_after_replay(tmp_path, logged=[1, 2, 3, 4, 5, 6, 7])
    relay.collect([restored_world(6, then=[7, 8])])
    assert recorded_steps(relay) == [1, 2, 3, 4, 5, 6, 7, 8]
    six = [e for e in relay.buffer.after(0) if isinstance(e, MetricsEntry) and e.step == 6]
    assert len(six) == 1
