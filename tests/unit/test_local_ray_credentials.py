"""The Ray processes the service starts (its local head, local nodes) get none of its
storage credentials unless the operator passes them: every job's ranks inherit a node's
environment, and serve's AWS_* keys were in every rank's."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardline.service.local_ray import LocalRay

SECRETS = {"AWS_ACCESS_KEY_ID": "AKIA-serve", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}


def head(tmp_path: Path) -> LocalRay:
    return LocalRay("127.0.0.1:1", 0, tmp_path / "head.json", tmp_path / "token")


def test_a_started_ray_process_gets_no_storage_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in {**SECRETS, "AWS_DEFAULT_REGION": "eu-west-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SHARDLINE_PASS_STORAGE_CREDENTIALS", raising=False)
    env = head(tmp_path).process_env()
    assert not set(SECRETS) & set(env)
    assert env["AWS_DEFAULT_REGION"] == "eu-west-1"  # not a secret: where to find the store
    assert env["RAY_AUTH_MODE"] == "token"


@pytest.mark.parametrize("switch", ["1", "true", "yes"])
def test_the_operator_may_pass_them_on(
    switch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SHARDLINE_PASS_STORAGE_CREDENTIALS", switch)
    env = head(tmp_path).process_env()
    assert {k: env[k] for k in SECRETS} == SECRETS
