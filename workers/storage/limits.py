"""How long one call to object storage may take, in every process that makes one.

An object store that accepts connections and never answers held a request for 405-418 s,
and a rank at its save until the hang limit: s3fs tries each call five times, boto each
of those five more, each waiting out its read timeout. Here each call is tried `attempts`
times with the given connect and read timeouts, by boto alone, so a store that does not
answer fails the call in seconds and says so.

The control plane installs the limits in its own process and hands them to every
supervisor and rank in `SHARDLINE_STORAGE_LIMITS`; a checkpoint store installs them from
there when it is first made in that process. S3 options the operator gave in fsspec's own
configuration (`FSSPEC_S3`) win over these. No torch, no Ray.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

ENV = "SHARDLINE_STORAGE_LIMITS"

_installed: StorageLimits | None = None


@dataclass(frozen=True)
class StorageLimits:
    connect_timeout_s: float
    read_timeout_s: float
    attempts: int

    def env_vars(self) -> dict[str, str]:
        """For a process started from here (a supervisor, a rank)."""
        return {ENV: json.dumps(asdict(self))}

    def install(self) -> None:
        """For every S3 filesystem this process makes from now on."""
        global _installed
        import fsspec.config

        given = fsspec.config.conf.get("s3", {})
        config = {
            "connect_timeout": self.connect_timeout_s,
            "read_timeout": self.read_timeout_s,
            "retries": {"max_attempts": self.attempts, "mode": "standard"},
            **given.get("config_kwargs", {}),
        }
        fsspec.config.conf["s3"] = {**given, "config_kwargs": config}
        try:
            from s3fs import S3FileSystem
        except ImportError:  # no S3 support installed: nothing to limit
            pass
        else:
            S3FileSystem.retries = 1  # its own loop around boto's: boto's attempts only
        _installed = self


def install_from_env() -> None:
    """Where the control plane said (`SHARDLINE_STORAGE_LIMITS`), once per process."""
    if _installed is not None:
        return
    try:
        given: Any = json.loads(os.environ.get(ENV, "null"))
        limits = StorageLimits(**given) if isinstance(given, dict) else None
    except (json.JSONDecodeError, TypeError):
        limits = None
    if limits is not None:
        limits.install()
