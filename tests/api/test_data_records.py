"""Records at submit: a sample of the first records is read as the ranks will read
them, so bad data is a 422 naming the file, the line and the field to change, not a job
that fails minutes later; records given as plain text are refused with the fix."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardline.api.client import Client, InvalidRequest
from tests.api.conftest import Backend
from tests.support.records import PLAIN_CHAT, noise_chats, write_jsonl, write_parquet


def data_folder(backend: Backend) -> Path:
    folder = backend.server.settings.data_roots[0] / f"records-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    return folder


def chat(path: Path, **data: Any) -> dict[str, Any]:
    return {
        "name": "chat",
        "model": {"preset": "tiny", "seq_len": 64},
        "data": {
            "source": "records",
            "path": str(path),
            "format": "chat",
            "chat_template": PLAIN_CHAT,
            **data,
        },
    }


def refusal(client: Client, spec: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(InvalidRequest) as caught:
        client.submit(spec)
    assert caught.value.status == 422, caught.value
    return str(caught.value.details[0]["field"]), caught.value.message


def test_a_chat_job_on_records_is_accepted_as_written(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    folder = data_folder(backend)
    write_parquet(noise_chats(50), folder / "chats.parquet")
    job = user_client().submit(chat(folder / "chats.parquet", overflow="drop"))
    data = job["spec"]["data"]
    assert (data["source"], data["format"], data["overflow"]) == ("records", "chat", "drop")
    assert data["packing"] is True and data["train_on_prompt"] is False


@pytest.mark.parametrize(
    ("lines", "data", "field", "said"),
    [
        (['{"messages": []}'], {}, "data.messages_field", "line 1: messages must be a non-empty"),
        (
            ['{"messages": [{"role": "user", "content": "hi"}]}', "{oops"],
            {},
            "data.path",
            "bad.jsonl line 2 is not JSON",
        ),
        (
            ['{"messages": [{"role": "bot", "content": "hi"}]}'],
            {},
            "data.messages_field",
            "messages[0].role 'bot' is not one of",
        ),
        (
            ['{"messages": [{"role": "user", "content": "hi"}]}'],
            {"chat_template": "{{ raise_exception('needs a system turn') }}"},
            "data.chat_template",
            "bad.jsonl line 1: the chat template failed: needs a system turn",
        ),
        (
            ['{"messages": [{"role": "user", "content": "hi"}]}'],
            {"chat_template": "{% if %}"},
            "data.chat_template",
            "not valid Jinja",
        ),
    ],
)
def test_bad_records_are_refused_naming_line_and_field(
    backend: Backend,
    user_client: Callable[..., Client],
    lines: list[str],
    data: dict[str, Any],
    field: str,
    said: str,
) -> None:
    path = data_folder(backend) / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    got_field, message = refusal(user_client(), chat(path, **data))
    assert got_field == field
    assert said in message


def test_skip_bad_records_lets_a_few_bad_lines_through(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    path = data_folder(backend) / "mixed.jsonl"
    write_jsonl(noise_chats(10), path)
    path.write_text(path.read_text() + "not json\n")
    client = user_client()
    assert refusal(client, chat(path))[0] == "data.path"
    assert client.submit(chat(path, skip_bad_records=True))["state"] == "QUEUED"


def test_a_record_without_the_text_field_names_the_field(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    path = write_jsonl([{"body": "x"}], data_folder(backend) / "docs.jsonl")
    spec = {"name": "t", "data": {"source": "records", "path": str(path)}}
    field, message = refusal(user_client(), spec)
    assert field == "data.text_field"
    assert "docs.jsonl line 1 has no field 'text'" in message


@pytest.mark.parametrize("kind", ["jsonl-named-txt", "parquet-named-txt", "jsonl"])
def test_records_given_as_plain_text_are_refused_with_the_fix(
    backend: Backend, user_client: Callable[..., Client], kind: str
) -> None:
    folder = data_folder(backend)
    if kind == "parquet-named-txt":
        path = write_parquet([{"text": "a"}, {"text": "b"}], folder / "corpus.txt")
    else:
        name = "corpus.jsonl" if kind == "jsonl" else "corpus.txt"
        path = write_jsonl([{"text": "a"}, {"text": "b"}], folder / name)
    field, message = refusal(
        user_client(), {"name": "t", "data": {"source": "text", "path": str(path)}}
    )
    assert field == "data.source"
    assert "set data.source: records" in message


def test_plain_text_that_starts_with_braces_is_still_text(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    path = data_folder(backend) / "code.txt"
    path.write_text("{\n  body();\n}\nmore text\n")
    job = user_client().submit({"name": "t", "data": {"source": "text", "path": str(path)}})
    assert job["spec"]["data"]["source"] == "text"
