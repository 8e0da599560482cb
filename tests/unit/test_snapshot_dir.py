"""The in-memory snapshot folder is private to the user the workers run as: another local
user can neither make its root first nor swap a folder for a link to one of their own."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardline.workers.storage.snapshots import (
    SnapshotFolderRefused,
    private_snapshot_dir,
    remove_snapshot_dir,
)

NOBODY = 65534

needs_root = pytest.mark.skipif(os.getuid() != 0, reason="acting as another user needs root")


def as_nobody(*command: str) -> None:
    subprocess.run(list(command), user=NOBODY, group=NOBODY, check=True)


@pytest.fixture
def shared_memory() -> Iterator[Path]:
    """A folder every user may write into and reach, as /dev/shm is (pytest's own temp
    folders are 0700)."""
    shm = Path(tempfile.mkdtemp(prefix="shardline-shm-"))
    shm.chmod(0o1777)
    yield shm
    shutil.rmtree(shm)


def test_the_root_is_made_or_made_again_0700(tmp_path: Path) -> None:
    root = tmp_path / "shardline-snapshots"
    job = private_snapshot_dir(root / "job-a")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE(job.stat().st_mode) == 0o700
    root.chmod(0o755)  # as an older version left it
    private_snapshot_dir(root / "job-b")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


@needs_root
def test_a_root_another_user_made_first_is_refused(shared_memory: Path) -> None:
    root = shared_memory / "shardline-snapshots"
    as_nobody("mkdir", "-m", "777", str(root))
    with pytest.raises(
        SnapshotFolderRefused, match=f"belongs to user {NOBODY}.*SHARDLINE_SNAPSHOT_ROOT"
    ):
        private_snapshot_dir(root / "job")
    assert not (root / "job").exists()  # nothing written where the other user can read


@needs_root
def test_a_link_made_where_the_root_would_be_is_refused(shared_memory: Path) -> None:
    theirs = shared_memory / "theirs"
    as_nobody("mkdir", "-m", "777", str(theirs))
    root = shared_memory / "shardline-snapshots"
    as_nobody("ln", "-s", str(theirs), str(root))
    with pytest.raises(SnapshotFolderRefused, match="a link or a file"):
        private_snapshot_dir(root / "job")
    assert list(theirs.iterdir()) == []


@needs_root
def test_another_user_cannot_swap_a_jobs_folder(shared_memory: Path) -> None:
    job = private_snapshot_dir(shared_memory / "shardline-snapshots" / "job")
    theirs = shared_memory / "theirs"
    as_nobody("mkdir", "-m", "777", str(theirs))
    swap = subprocess.run(
        ["sh", "-c", f"mv {job} {job}.old && ln -s {theirs} {job}"],
        user=NOBODY,
        group=NOBODY,
        capture_output=True,
        text=True,
    )
    assert swap.returncode != 0 and "Permission denied" in swap.stderr
    assert not job.is_symlink()


def test_a_link_in_place_of_a_jobs_folder_is_refused_and_removed_alone(tmp_path: Path) -> None:
    root = tmp_path / "shardline-snapshots"
    private_snapshot_dir(root / "job-a")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("not the job's")
    (root / "job-b").symlink_to(elsewhere)
    with pytest.raises(SnapshotFolderRefused, match="a link or a file"):
        private_snapshot_dir(root / "job-b")
    assert remove_snapshot_dir(root / "job-b")
    assert not (root / "job-b").is_symlink()
    assert (elsewhere / "keep").read_text() == "not the job's"
    assert remove_snapshot_dir(root / "job-a") and not (root / "job-a").exists()
    assert not remove_snapshot_dir(root / "job-a")
