"""Service settings: one pydantic-settings class, read from SHARDLINE_* environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from workers.storage.layout import JobLayout

DEFAULT_STATE_DIR = Path(".shardline")


class Settings(BaseSettings):
    """Everything the control plane needs; the defaults run embedded on one machine."""

    model_config = SettingsConfigDict(env_prefix="SHARDLINE_", extra="ignore")

    # Where the embedded defaults (SQLite file, storage, admin token) live.
    state_dir: Path = DEFAULT_STATE_DIR
    # SQLAlchemy URL; empty means a SQLite file in state_dir.
    database_url: str = ""
    # Ray cluster to use ("ray://..." or "host:port"); empty starts a local Ray instance.
    ray_address: str = ""
    # Logical CPUs of a local Ray instance, so several CPU ranks fit a small machine.
    ray_num_cpus: Annotated[int, Field(ge=1)] = 8
    # Checkpoints, logs and resolved specs go under storage_root/<job id>/.
    storage_root: Path | None = None
    # Host memory for in-memory snapshots (a tmpfs); empty: /dev/shm/shardline-snapshots
    # on each node, or its temp folder where it has no /dev/shm.
    snapshot_root: Path | None = None
    # A job's data.path must resolve inside one of these folders (comma-separated).
    data_roots: Annotated[list[Path], NoDecode] = Field(default_factory=lambda: [Path.cwd()])
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    # Requests with bodies above this are refused with 413.
    max_body_bytes: Annotated[int, Field(ge=1024)] = 1 << 20
    # The admin token is written here on first start, mode 0600, for the CLI.
    admin_token_file: Path | None = None
    # Page size limit of list routes.
    max_page_size: Annotated[int, Field(ge=1, le=1000)] = 200
    # Per-token rate limit (a token bucket): requests per second sustained, and the burst
    # a token may send at once. Far above what the CLI, the status page or a script that
    # polls needs; 0 turns the limit off. Over it: 429 with Retry-After.
    rate_limit_per_s: Annotated[float, Field(ge=0)] = 100.0
    rate_limit_burst: Annotated[int, Field(ge=1)] = 1000
    # Per-user quotas (admins included); 0 means no limit. Queued jobs over the limit are
    # refused at submit (429); jobs that would take a user's running jobs past the CPU or
    # GPU quota stay QUEUED with a queue_reason naming the quota.
    user_max_queued_jobs: Annotated[int, Field(ge=0)] = 1000
    user_max_cpus: Annotated[float, Field(ge=0)] = 0.0
    user_max_gpus: Annotated[float, Field(ge=0)] = 0.0

    @field_validator("data_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: object) -> object:
        if isinstance(value, str):
            return [Path(part) for part in value.split(",") if part.strip()]
        return value

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.state_dir / 'shardline.db').resolve()}"

    @property
    def resolved_storage_root(self) -> Path:
        return (self.storage_root or self.state_dir / "storage").resolve()

    def job_layout(self, job_id: str) -> JobLayout:
        """Every path of one job, under this server's roots."""
        snapshots = str(self.snapshot_root.resolve()) if self.snapshot_root else None
        return JobLayout(str(self.resolved_storage_root), job_id, snapshots)

    @property
    def private_dirs(self) -> list[Path]:
        """Folders no job may read as data: they hold the admin token, the database and
        every job's checkpoints and logs."""
        return [self.state_dir.resolve(), self.resolved_storage_root]

    @property
    def resolved_admin_token_file(self) -> Path:
        return self.admin_token_file or self.state_dir / "admin-token"
