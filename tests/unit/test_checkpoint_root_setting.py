"""SHARDLINE_CHECKPOINT_ROOT: where every job's checkpoints go, checked when the server
starts rather than at a job's first save."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from shardline.service.config import Settings


def test_an_object_store_url_holds_each_jobs_checkpoints_and_nothing_else(tmp_path: Path) -> None:
    settings = Settings(storage_root=tmp_path, checkpoint_root="s3://bucket/prefix/")
    layout = settings.job_layout("job1")
    assert layout.checkpoints_dir == "s3://bucket/prefix/job1/checkpoints"
    assert layout.checkpoint_locations().save_url == "s3://bucket/prefix/job1/checkpoints"
    assert layout.of_job("job0").checkpoints_dir == "s3://bucket/prefix/job0/checkpoints"
    assert layout.logs_dir == tmp_path / "job1" / "logs"  # logs and metrics stay on disk
    assert len(settings.private_dirs) == 2  # nothing local to keep from jobs


def test_a_folder_is_made_absolute_and_is_never_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHARDLINE_CHECKPOINT_ROOT", "ckpts")
    settings = Settings(storage_root=tmp_path / "storage")
    assert settings.job_layout("j").checkpoints_dir == str(tmp_path / "ckpts" / "j" / "checkpoints")
    assert tmp_path / "ckpts" in settings.private_dirs


def test_without_it_checkpoints_stay_under_the_storage_root(tmp_path: Path) -> None:
    layout = Settings(storage_root=tmp_path).job_layout("j")
    assert layout.checkpoints_dir == str(tmp_path / "j" / "checkpoints")


def test_an_unknown_protocol_is_refused_with_the_fix() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(checkpoint_root="gibberish://bucket")
    message = str(caught.value)
    assert "gibberish:// is not a storage protocol" in message
    assert "s3://bucket/prefix" in message
