"""Every path of a job, in one place: `storage_root/<job id>/` holds the resolved spec,
`logs/rank-<r>.log`, rank 0's `metrics.jsonl`, `checkpoints/step-<n>/` (with the record of
skipped batches) and `exports/`; its in-memory snapshots live in host memory under
`<snapshot root>/<job id>/`. With a checkpoint root (a folder or an object store's URL),
the checkpoints go to `<checkpoint root>/<job id>/checkpoints/` instead.

A JobLayout is built once (the control plane from its settings, `shardline train` from its
options) and passed whole to the supervisor, the worker group and the workers, as Ray
Train passes its StorageContext; the API reads logs and lists checkpoints through it.
Nobody else builds a job's paths. In a multi-node deployment storage_root is a shared
filesystem mounted at the same path on every node. No torch, no Ray.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from shardline.workers.storage.checkpoints import CheckpointStore, RestoreSource
from shardline.workers.storage.skipped_batches import SkippedBatches
from shardline.workers.storage.snapshots import default_snapshot_root


@dataclass(frozen=True)
class CheckpointLocations:
    """Where a run's checkpoints go and may come from (the when is `CheckpointSpec`'s)."""

    save_url: str | None = None  # the run's own checkpoints folder; None: never saves
    # Tried in order; the first that has a committed checkpoint wins (the job's own folder
    # first, so a restarted or resumed job continues from its own newest one).
    restore_from: tuple[RestoreSource, ...] = ()
    snapshot_url: str | None = None  # the in-memory tier's folder; None: off


@dataclass(frozen=True)
class JobLayout:
    storage_root: str
    job_id: str
    # Host memory for in-memory snapshots; None: the default of the process that resolves
    # `snapshot_dir`: each worker's own node's (`here()`), and each node's own when the
    # job's snapshots are removed.
    snapshot_root: str | None = None
    # Where checkpoints go instead of under storage_root: a folder or an fsspec URL
    # ("s3://bucket/prefix"), as `<checkpoint_root>/<job id>/checkpoints/`. None: under
    # storage_root with the rest.
    checkpoint_root: str | None = None

    @property
    def dir(self) -> Path:
        return Path(self.storage_root) / self.job_id

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
    def checkpoints_dir(self) -> str:
        """A folder or, with an object-store checkpoint_root, a URL."""
        if self.checkpoint_root is None:
            return str(self.dir / "checkpoints")
        return f"{self.checkpoint_root.rstrip('/')}/{self.job_id}/checkpoints"

    def remove(self) -> None:
        """Delete everything of the job: its folder (logs, metrics, spec, exports,
        profiles) and its checkpoints wherever they are. Raises OSError where a store
        refuses; what was removed stays removed."""
        if self.checkpoint_root is not None:
            store = CheckpointStore(self.checkpoints_dir)
            job_dir = store.root.rsplit("/", 1)[0]  # <root>/<job id>, not the root itself
            if store.fs.exists(job_dir):
                store.fs.rm(job_dir, recursive=True)
        if self.dir.exists():
            shutil.rmtree(self.dir)

    def checkpoints(self) -> CheckpointStore:
        """The job's committed checkpoints (listing, finding, verifying)."""
        return CheckpointStore(self.checkpoints_dir)

    def skipped_batches(self) -> SkippedBatches:
        """Batches skipped after a non-finite loss: kept beside the checkpoints, since
        every checkpoint of the job resumes with them."""
        return SkippedBatches(self.checkpoints_dir)

    @property
    def exports_dir(self) -> Path:
        """Where exports of this job's checkpoints are written before they are sent."""
        return self.dir / "exports"

    @property
    def profiles_dir(self) -> Path:
        """Profiles taken on demand: one folder each, a Chrome trace per rank."""
        return self.dir / "profiles"

    @property
    def snapshot_dir(self) -> Path:
        """This job's in-memory snapshots on the node that asks."""
        root = Path(self.snapshot_root) if self.snapshot_root else default_snapshot_root()
        return root / self.job_id

    def of_job(self, job_id: str) -> JobLayout:
        """Another job's layout under the same roots (a `resume_from` source)."""
        return JobLayout(self.storage_root, job_id, self.snapshot_root, self.checkpoint_root)

    def here(self, locations: CheckpointLocations | None) -> CheckpointLocations | None:
        """`locations` with the snapshot folder of the node that asks: a worker writes its
        snapshots into its own node's host memory, whichever process planned them."""
        if locations is None or locations.snapshot_url is None or self.snapshot_root:
            return locations
        return replace(locations, snapshot_url=str(self.snapshot_dir))

    def checkpoint_locations(
        self, *, resume_from: RestoreSource | None = None, snapshots: bool = False
    ) -> CheckpointLocations:
        """The job saves into its own folder and starts from it; a job with `resume_from`
        starts from that job's checkpoint until it has one of its own."""
        restore = [RestoreSource(self.checkpoints_dir)]
        if resume_from is not None:
            restore.append(resume_from)
        return CheckpointLocations(
            save_url=self.checkpoints_dir,
            restore_from=tuple(restore),
            snapshot_url=str(self.snapshot_dir) if snapshots else None,
        )
