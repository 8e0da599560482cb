"""Every path of a job, in one place: `storage_root/<job id>/` holds the resolved spec,
`logs/rank-<r>.log` and `checkpoints/step-<n>/`.

The supervisor, the workers and the API all go through this class; nobody builds a job's
paths by hand. In a multi-node deployment storage_root is a shared filesystem mounted at
the same path on every node.
"""

from __future__ import annotations

from pathlib import Path


class JobStorage:
    def __init__(self, storage_root: str | Path, job_id: str) -> None:
        self.job_id = job_id
        self.dir = Path(storage_root) / job_id

    @property
    def spec_file(self) -> Path:
        return self.dir / "spec.json"

    @property
    def logs_dir(self) -> Path:
        return self.dir / "logs"

    def log_file(self, rank: int) -> Path:
        return self.logs_dir / f"rank-{rank}.log"

    def log_ranks(self) -> list[int]:
        """The ranks that have written a log, in order."""
        stems = (p.stem.removeprefix("rank-") for p in self.logs_dir.glob("rank-*.log"))
        return sorted(int(s) for s in stems if s.isdigit())

    @property
    def metrics_file(self) -> Path:
        """Rank 0's logged metrics, one JSON object a line, appended as they come."""
        return self.dir / "metrics.jsonl"

    @property
    def checkpoints_dir(self) -> Path:
        return self.dir / "checkpoints"
