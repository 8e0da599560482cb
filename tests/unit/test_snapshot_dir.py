"""The in-memory snapshot folder is private to the user the workers run as."""

from __future__ import annotations

import stat
from pathlib import Path

from shardline.workers.storage.snapshots import private_snapshot_dir


def test_the_root_is_made_or_made_again_0700(tmp_path: Path) -> None:
    root = tmp_path / "shardline-snapshots"
    job = private_snapshot_dir(root / "job-a")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE(job.stat().st_mode) == 0o700
    root.chmod(0o755)  # as an older version left it
    private_snapshot_dir(root / "job-b")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
