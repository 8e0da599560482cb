"""A job reads only files inside the data roots, checked when each file is opened: real
files, real symlinks, including ones swapped in after the API looked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shardline.workers.contract.data_access import (
    PRIVATE_ENV,
    ROOTS_ENV,
    DataAccess,
    DataAccessDenied,
)
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.data.sources import bin_tokens, load_tokens
from shardline.workers.engine.data.tokenizers import load_tokenizer

SECRET = "sl_admin_0123456789abcdef"


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A data root holding the service's state dir (the embedded default), a folder of
    text, and a secret outside the root; the worker's environment set as the service sets it."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    state = root / ".shardline"
    for folder in (root / "corpus", state / "storage", outside):
        folder.mkdir(parents=True)
    (root / "corpus" / "a.txt").write_text("hello world\n" * 200)
    (state / "admin-token").write_text(SECRET)
    (outside / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n" * 50)
    monkeypatch.setenv("SHARDLINE_CACHE_DIR", str(tmp_path / "cache"))
    access = DataAccess.of([root], [state, state / "storage"])
    for name, value in access.env_vars().items():
        monkeypatch.setenv(name, value)
    return {"root": root, "outside": outside, "state": state}


def text_spec(path: Path, tokenizer: str = "byte") -> JobSpec:
    data = {"source": "text", "path": str(path), "tokenizer": tokenizer}
    return JobSpec.model_validate({"name": "x", "data": data})


def test_the_environment_carries_the_rules(layout: dict[str, Path]) -> None:
    access = DataAccess.from_env()
    assert access.roots == (layout["root"].resolve(),)
    assert layout["state"].resolve() in access.private
    assert DataAccess.from_env({}).roots is None  # `shardline train`: no service, no roots


def test_text_inside_the_root_is_read(layout: dict[str, Path]) -> None:
    tokens = load_tokens(text_spec(layout["root"] / "corpus"))
    assert bytes(np.asarray(tokens[:11], dtype=np.uint8)) == b"hello world"


def test_a_symlink_in_a_folder_pointing_out_of_the_root_is_refused(
    layout: dict[str, Path],
) -> None:
    (layout["root"] / "corpus" / "b.txt").symlink_to(layout["outside"] / "passwd")
    with pytest.raises(DataAccessDenied) as err:
        load_tokens(text_spec(layout["root"] / "corpus"))
    assert "outside the data roots" in str(err.value)
    assert str(layout["outside"]) not in str(err.value)


def test_a_file_swapped_for_a_symlink_after_submit_is_refused(layout: dict[str, Path]) -> None:
    data = layout["root"] / "corpus" / "a.txt"
    spec = text_spec(data)  # what the API accepted
    data.unlink()
    data.symlink_to(layout["outside"] / "passwd")
    with pytest.raises(DataAccessDenied):
        load_tokens(spec)


def test_a_symlinked_token_file_into_the_state_dir_is_refused(layout: dict[str, Path]) -> None:
    link = layout["root"] / "corpus" / "tokens.bin"
    link.symlink_to(layout["state"] / "admin-token")
    spec = JobSpec.model_validate(
        {"name": "x", "data": {"source": "tokens", "path": str(link)}, "model": {"vocab_size": 256}}
    )
    with pytest.raises(DataAccessDenied) as err:
        load_tokens(spec)
    assert "service's own state" in str(err.value)
    assert SECRET not in str(err.value)
    with pytest.raises(DataAccessDenied):
        load_tokens(text_spec(layout["root"]))  # a folder walk reaches the state dir too


def test_the_tokenizer_file_is_checked_like_data(layout: dict[str, Path]) -> None:
    outside = layout["outside"] / "tokenizer.json"
    outside.write_text(json.dumps({"version": "1.0"}))
    with pytest.raises(DataAccessDenied) as err:
        load_tokens(text_spec(layout["root"] / "corpus", tokenizer=str(outside)))
    assert err.value.args[0].startswith("data.tokenizer: ")
    with pytest.raises(DataAccessDenied):
        load_tokenizer(str(layout["state"] / "admin-token"), DataAccess.from_env())


def test_an_allowed_token_file_is_mapped(layout: dict[str, Path]) -> None:
    path = layout["root"] / "corpus" / "tokens.bin"
    np.arange(100, dtype=np.uint16).tofile(path)
    tokens = bin_tokens(path, 256, DataAccess.from_env())
    assert list(tokens[:5]) == [0, 1, 2, 3, 4]


def test_out_of_range_errors_do_not_echo_the_data(layout: dict[str, Path]) -> None:
    from shardline.workers.engine.data.loader import build_loader

    path = layout["root"] / "corpus" / "tokens.bin"
    np.full(4096, 54321, dtype=np.uint16).tofile(path)
    spec = JobSpec.model_validate(
        {
            "name": "x",
            "data": {"source": "tokens", "path": str(path)},
            "model": {"vocab_size": 256, "seq_len": 16},
        }
    )
    with pytest.raises(ValueError) as err:
        build_loader(spec, 0, 1).train_batch(1)
    assert "54321" not in str(err.value)


def test_no_environment_means_no_restriction(
    layout: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ROOTS_ENV)
    monkeypatch.delenv(PRIVATE_ENV)
    tokens = load_tokens(text_spec(layout["outside"] / "passwd"))
    assert len(tokens) > 0


def test_rules_installed_in_an_environment_replace_the_ones_there(tmp_path: Path) -> None:
    """A pooled rank takes its supervisor's rules into an environment that holds another
    control plane's: the roots go when the new rules have none."""
    earlier = DataAccess.of([tmp_path / "a"], [tmp_path / "state-a"])
    environ: dict[str, str] = {"PATH": "/bin", **earlier.env_vars()}
    anywhere = DataAccess(None, (tmp_path.resolve() / "state-b",))
    anywhere.install(environ)
    assert DataAccess.from_env(environ) == anywhere
    assert environ["PATH"] == "/bin"
    earlier.install(environ)
    assert DataAccess.from_env(environ) == earlier


def test_records_in_a_folder_with_a_symlink_out_of_the_root_are_refused(
    layout: dict[str, Path],
) -> None:
    """Records are opened by the same rules as every data file: the folder is inside the
    root, one of its files is a link to a file outside; reading reaches it and stops,
    naming the spec field and not a byte of what is out there."""
    from shardline.workers.engine.data.preflight import data_problem
    from shardline.workers.engine.data.records import read_records, record_files

    chats = layout["root"] / "chats"
    chats.mkdir()
    (chats / "a.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    secret = layout["outside"] / "secret.jsonl"
    secret.write_text(json.dumps({"text": SECRET}) + "\n")
    (chats / "b.jsonl").symlink_to(secret)
    access = DataAccess.from_env()
    records = read_records(record_files(str(chats)), access)
    assert next(records).values == {"text": "hello"}
    with pytest.raises(DataAccessDenied, match=r"data\.path: .*outside the data roots") as err:
        next(records)
    assert SECRET not in str(err.value)
    # At submit: a folder whose first file is such a link is refused before any rank starts.
    (chats / "a.jsonl").unlink()
    (chats / "a.jsonl").symlink_to(secret)
    spec = JobSpec.model_validate({"name": "x", "data": {"source": "records", "path": str(chats)}})
    problem = data_problem(spec.data, 32, 256, access)
    assert problem is not None and problem[0] == "data.path", problem
    assert "outside the data roots" in problem[1] and SECRET not in problem[1]
