"""The polled reads' path: one connection per request however many readers it opens,
stored JSON read by orjson (and the stdlib where only it can), and responses encoded
without the model that say the same as the model."""

from __future__ import annotations

import json
import math
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text

from shardline.api.json_body import json_body
from shardline.api.schemas import JobPublic
from shardline.service.db import Database, load_stored_json
from shardline.service.job_views import JobView, spec_steps


def test_a_reader_inside_a_reader_shares_its_connection(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'x.db'}")
    with db.reader() as outer, db.reader() as inner:
        assert inner is outer
    with db.reader() as again:  # the outer one closed: a fresh one
        assert again is not outer
    seen: list[object] = []
    with db.reader() as mine:
        other = threading.Thread(target=lambda: seen.append(_connection_of(db)))
        other.start()
        other.join()
        assert seen and seen[0] is not mine  # another thread never gets this one
    db.dispose()


def _connection_of(db: Database) -> object:
    with db.reader() as conn:
        conn.execute(text("SELECT 1"))
        return conn


def test_stored_json_with_nan_is_still_read() -> None:
    assert load_stored_json('{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}
    loss = load_stored_json('{"loss": NaN}')["loss"]
    assert math.isnan(loss)


def _view(spec: dict[str, Any] | None = None, **changes: object) -> JobView:
    spec = spec or {"name": "tiny", "train": {"steps": 40}}
    values: dict[str, object] = dict(
        id="j1",
        owner_id=1,
        owner="ann",
        name="tiny",
        spec_text=json.dumps(spec),  # as the column stores it
        steps=spec_steps(spec),
        state="RUNNING",
        version=3,
        priority=0,
        created_at=datetime(2026, 11, 26, 12, 0, 0, 123456),  # naive, as SQLite gives
        started_at=datetime(2026, 11, 26, 12, 0, 1, tzinfo=UTC),
        finished_at=None,
        restarts=0,
        failures=0,
        failure_reason=None,
        queue_reason=None,
        current_step=7,
        latest_metrics={"loss": 2.5, "grad_norm": float("nan")},
        latest_checkpoint="/srv/jobs/j1/checkpoints/step-00000004",
        steps_lost=0,
        seconds_lost=0.0,
    )
    values.update(changes)
    return JobView(**values)  # type: ignore[arg-type]


def _same_as_the_model(view: JobView) -> dict[str, object]:
    fast = json.loads(bytes(json_body(JobPublic.one(view)).body))
    slow = json.loads(JobPublic.of(view).model_dump_json())
    fast.pop("goodput"), slow.pop("goodput")  # wall time since start: moves between calls
    assert fast == slow
    return fast


def test_a_job_encoded_without_the_model_is_what_the_model_says() -> None:
    body = _same_as_the_model(_view())
    assert body["created_at"] == "2026-11-26T12:00:00.123456+00:00"
    assert body["latest_metrics"] == {"loss": 2.5, "grad_norm": None}
    assert body["steps"] == 40 and body["latest_checkpoint"] == "checkpoints/step-00000004"


def test_what_orjson_refuses_takes_the_safe_way() -> None:
    # A lone surrogate and an integer past 64 bits, in a row stored before specs refused them.
    spec = {"name": "bad\ud800name", "train": {"steps": 2**70}, "x": float("inf")}
    body = _same_as_the_model(_view(spec=spec))
    assert body["spec"] == {"name": "bad?name", "train": {"steps": 2**70}, "x": None}
    assert body["steps"] == 2**70


def test_a_stored_spec_is_served_as_it_is_stored_and_says_what_the_model_says() -> None:
    view = _view({"name": "ünïcode \U0001f600", "train": {"steps": 12}, "z": [1.5, None]})
    text_of_spec = view.spec_text
    body = bytes(json_body(JobPublic.fields(_view({"name": "plain", "train": {"steps": 3}}))).body)
    assert b'"spec":{"name": "plain", "train": {"steps": 3}}' in body  # embedded, not re-encoded
    spec = _same_as_the_model(view)["spec"]
    assert isinstance(spec, dict) and spec["name"] == "ünïcode \U0001f600"
    assert "\\ud83d" in text_of_spec  # an escaped surrogate pair: decoded, still right
    unreadable: list[object] = [{"train": {"steps": "many"}}, {"train": []}, {"train": None}, []]
    assert [spec_steps(bad) for bad in unreadable] == [0, 0, 0, 0]
