"""Service settings: one pydantic-settings class, read from SHARDLINE_* environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from shardline.workers.storage.layout import JobLayout
from shardline.workers.storage.limits import StorageLimits
from shardline.workers.storage.urls import storage_url_problem

DEFAULT_STATE_DIR = Path(".shardline")

# A database password shorter than this, or one of these placeholders (.env.example's
# among them, compared case-insensitively), is refused at start.
MIN_SECRET_CHARS = 16
PLACEHOLDER_SECRETS = frozenset(
    {"change-me", "changeme", "change_me", "password", "postgres", "secret", "shardline"}
)


def weak_secret(variable: str, value: str) -> str | None:
    """Why `value` is no secret to deploy with (one line naming `variable`), or None."""
    if value.strip().lower() in PLACEHOLDER_SECRETS:
        problem = f"is the placeholder {value.strip()!r}"
    elif len(value) < MIN_SECRET_CHARS:
        problem = f"is shorter than {MIN_SECRET_CHARS} characters"
    else:
        return None
    return f"{variable} {problem}: set a random one, e.g. `openssl rand -hex 24`"


class Settings(BaseSettings):
    """Everything the control plane needs; the defaults run embedded on one machine."""

    # Errors leave out the values given: they may hold the database password.
    model_config = SettingsConfigDict(
        env_prefix="SHARDLINE_", extra="ignore", hide_input_in_errors=True
    )

    # Where the embedded defaults (SQLite file, storage, admin token) live.
    state_dir: Path = DEFAULT_STATE_DIR
    # SQLAlchemy URL; empty means a SQLite file in state_dir.
    database_url: str = ""
    # The database password, kept out of the URL so that any character works in it: it
    # replaces database_url's password, URL-encoded (docker-compose.yml passes
    # POSTGRES_PASSWORD this way). Placeholders and short ones are refused.
    database_password: SecretStr | None = None
    # Ray cluster to use ("ray://..." or "host:port"); empty starts a local Ray instance.
    ray_address: str = ""
    # Ray's own RAY_AUTH_TOKEN (no SHARDLINE_ prefix), read only to refuse a placeholder or
    # short one for a cluster at ray_address: a local head uses a token file of its own.
    ray_auth_token: SecretStr | None = Field(default=None, validation_alias="RAY_AUTH_TOKEN")
    # Logical CPUs of a local Ray instance, so several CPU ranks fit a small machine.
    ray_num_cpus: Annotated[int, Field(ge=1)] = 8
    # How long `serve` keeps trying to reach the cluster at ray_address before it gives up:
    # in docker-compose the API may start before the head answers, and a Ray Client's
    # first connection can fail while the head starts its per-client server.
    ray_connect_timeout_s: Annotated[float, Field(ge=0)] = 60.0
    # The least share of a real CPU core each rank of a job must get (cores of the
    # cluster's nodes over the job's ranks): below it the job is refused at submit, since
    # its ranks would crawl and time out their collectives while loading every host.
    min_core_share: Annotated[float, Field(ge=0.0, le=64.0)] = 0.25
    # Rank processes started ahead on every node (torch and the engine imported) that the
    # next jobs' CPU ranks take instead of starting their own: a job's first step comes
    # about 1.5 s sooner. Each holds some 400 MB of host memory while it waits; 0: none.
    warm_workers_per_node: Annotated[int, Field(ge=0, le=64)] = 2
    # They are stopped after this long without a job taking one (and started again by the
    # next job that finds none).
    warm_workers_idle_s: Annotated[float, Field(gt=0)] = 1800.0
    # Checkpoints, logs and resolved specs go under storage_root/<job id>/.
    storage_root: Path | None = None
    # Every job's checkpoints under <checkpoint_root>/<job id>/checkpoints/ instead of
    # storage_root: a folder (the same shared mount on every node) or an fsspec URL such
    # as s3://bucket/prefix (pip install 'shardline[s3]'). Each node reads its own
    # credentials for it, as the storage's client library finds them (for S3: AWS_*
    # variables, a profile or an instance role); none are passed to jobs.
    checkpoint_root: str | None = None
    # Each call to object storage (s3://), in the API and in every job: the seconds to
    # connect and to wait for an answer, and how many times it is tried, so that a store
    # that does not answer fails a request or a save in seconds (workers/storage/limits.py).
    storage_connect_timeout_s: Annotated[float, Field(gt=0, le=600)] = 5.0
    storage_read_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 15.0
    storage_attempts: Annotated[int, Field(ge=1, le=10)] = 2
    # Host memory for in-memory snapshots (a tmpfs); empty: /dev/shm/shardline-snapshots-<uid>
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
    # How long a token's user, a job's status and a page of the listing are kept for the
    # clients polling them (service/read_cache.py): what this process writes shows at
    # once, what another process writes (the CLI revoking a token, a second API server)
    # within this. 0 turns it off.
    read_cache_s: Annotated[float, Field(ge=0, le=10)] = 1.0
    # On PostgreSQL every write is notified to every API server as it commits
    # (service/write_notices.py), so another process's writes show at once too; while
    # this server is listening it keeps answers this long. What a status derives from
    # the clock (goodput) may be this old.
    read_cache_notified_s: Annotated[float, Field(ge=0, le=60)] = 10.0
    # Requests with a missing, invalid or revoked token, per client address: over this,
    # 429 before the token is even looked up (each lookup is a database read), so a flood
    # of bad tokens cannot slow everyone else; a request with a live token still goes on
    # (api/live_tokens.py). 0 turns it off. Behind a proxy, name it in trusted_proxies.
    auth_failures_per_s: Annotated[float, Field(ge=0)] = 5.0
    auth_failures_burst: Annotated[int, Field(ge=1)] = 100
    # The proxies whose X-Forwarded-For names the client (addresses or networks, comma
    # separated, "*" for any). None by default: the connection's own address counts, and
    # no client can name another address to escape the limits kept per address.
    trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Per-user quotas (admins included); 0 means no limit. Queued jobs over the limit are
    # refused at submit (429); jobs that would take a user's running jobs past the CPU or
    # GPU quota stay QUEUED with a queue_reason naming the quota.
    user_max_queued_jobs: Annotated[int, Field(ge=0)] = 1000
    user_max_cpus: Annotated[float, Field(ge=0)] = 0.0
    user_max_gpus: Annotated[float, Field(ge=0)] = 0.0

    @property
    def storage_limits(self) -> StorageLimits:
        return StorageLimits(
            self.storage_connect_timeout_s, self.storage_read_timeout_s, self.storage_attempts
        )

    @field_validator("data_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: object) -> object:
        if isinstance(value, str):
            return [Path(part) for part in value.split(",") if part.strip()]
        return value

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _split_proxies(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("checkpoint_root")
    @classmethod
    def _check_checkpoint_root(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip()
        if "://" not in value:
            return str(Path(value).expanduser().resolve())
        problem = storage_url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value.rstrip("/")

    @model_validator(mode="after")
    def _refuse_weak_ray_token(self) -> Settings:
        if self.ray_address and self.ray_auth_token is not None:
            weak = weak_secret("RAY_AUTH_TOKEN", self.ray_auth_token.get_secret_value())
            if weak:
                raise ValueError(weak)
        return self

    @model_validator(mode="after")
    def _insert_database_password(self) -> Settings:
        if self.database_password is None:
            return self
        password = self.database_password.get_secret_value()
        weak = weak_secret("SHARDLINE_DATABASE_PASSWORD (POSTGRES_PASSWORD in .env)", password)
        if weak:
            raise ValueError(weak)
        if not self.database_url:
            raise ValueError(
                "SHARDLINE_DATABASE_PASSWORD is set but SHARDLINE_DATABASE_URL is not: "
                "give the URL too, without its password"
            )
        try:
            url = make_url(self.database_url)
        except ArgumentError:
            raise ValueError("SHARDLINE_DATABASE_URL is not a database URL") from None
        # render_as_string URL-encodes the password (@, /, :, % and the rest).
        self.database_url = url.set(password=password).render_as_string(hide_password=False)
        return self

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.state_dir / 'shardline.db').resolve()}"

    @property
    def resolved_storage_root(self) -> Path:
        return (self.storage_root or self.state_dir / "storage").resolve()

    def job_layout(self, job_id: str) -> JobLayout:
        """Every path of one job, under this server's roots."""
        snapshots = str(self.snapshot_root.resolve()) if self.snapshot_root else None
        return JobLayout(str(self.resolved_storage_root), job_id, snapshots, self.checkpoint_root)

    @property
    def private_dirs(self) -> list[Path]:
        """Folders no job may read as data: they hold the admin token, the database and
        every job's checkpoints and logs."""
        private = [self.state_dir.resolve(), self.resolved_storage_root]
        if self.checkpoint_root is not None and "://" not in self.checkpoint_root:
            private.append(Path(self.checkpoint_root))
        return private

    @property
    def resolved_admin_token_file(self) -> Path:
        return self.admin_token_file or self.state_dir / "admin-token"
