"""`model.init_from` at submit, and GET /v1/jobs/{id}/export's refusals.

The shape comes from the folder's config.json and is stored in the job's spec; every bad
folder is a 422 naming the field, never a 500.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from shardline.api.client import Client, InvalidRequest, NotFound
from tests.api.conftest import Backend
from tests.api.test_resume_from import commit_checkpoint

LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 256,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    "hidden_act": "silu",
}


def model_folder(backend: Backend, config: dict[str, Any] | None = None, **files: str) -> Path:
    """A folder inside the data roots with a config.json and (placeholder) weights."""
    folder = backend.server.settings.data_roots[0] / f"model-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    for name, text in files.items():
        (folder / name.replace("_", ".")).write_text(text)
    return folder


def refused_field(client: Client, spec: dict[str, Any]) -> str:
    with pytest.raises(InvalidRequest) as caught:
        client.submit({"name": "init", **spec})
    assert caught.value.status == 422, caught.value
    return str(caught.value.details[0]["field"])


def test_the_shape_is_read_from_config_json_and_stored(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    folder = model_folder(backend, LLAMA_CONFIG, tokenizer_json="{}")
    job = user_client().submit(
        {
            "name": "init",
            "model": {"init_from": str(folder), "n_heads": 4, "seq_len": 32},
            "data": {"tokenizer": "init_from"},
            "parallel": {"tp": 2},
        }
    )
    model = job["spec"]["model"]
    assert (model["dim"], model["n_layers"], model["n_heads"], model["n_kv_heads"]) == (64, 4, 4, 2)
    assert (model["ffn_dim"], model["vocab_size"], model["seq_len"]) == (96, 256, 32)
    assert (model["norm_eps"], model["rope_theta"]) == (1e-6, 500000.0)
    assert job["spec"]["data"]["tokenizer"] == str(folder / "tokenizer.json")


@pytest.mark.parametrize(
    ("changes", "family", "read"),
    [
        (
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 32.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
                "tie_word_embeddings": True,
                "head_dim": 32,
            },
            "llama",
            {"tie_embeddings": True, "head_dim": 32},
        ),
        (
            {"model_type": "qwen2", "tie_word_embeddings": True},
            "qwen2",
            {"tie_embeddings": True},
        ),
        ({"model_type": "qwen3", "head_dim": 32}, "qwen3", {"head_dim": 32}),
        ({"model_type": "mistral", "sliding_window": 16}, "mistral", {"sliding_window": 16}),
    ],
)
def test_each_family_s_folder_is_read_into_the_spec(
    backend: Backend,
    user_client: Callable[..., Client],
    changes: dict[str, Any],
    family: str,
    read: dict[str, Any],
) -> None:
    folder = model_folder(backend, {**LLAMA_CONFIG, **changes})
    job = user_client().submit({"name": "init", "model": {"init_from": str(folder)}})
    model = job["spec"]["model"]
    assert model["family"] == family
    assert {k: model[k] for k in read} == read
    if family == "llama":
        assert model["rope_scaling"]["rope_type"] == "llama3"
        assert model["rope_scaling"]["factor"] == 32.0


@pytest.mark.parametrize(
    ("config", "model", "field"),
    [
        (None, {}, "model.init_from"),  # no config.json
        ({**LLAMA_CONFIG, "model_type": "gpt2"}, {}, "model.init_from"),
        ({**LLAMA_CONFIG, "attention_bias": True}, {}, "model.init_from"),
        ({**LLAMA_CONFIG, "hidden_size": "big"}, {}, "model.init_from"),
        (LLAMA_CONFIG, {"n_layers": 2}, "model.n_layers"),
        (LLAMA_CONFIG, {"dim": 128}, "model.dim"),
        (LLAMA_CONFIG, {"vocab_size": 512}, "model.vocab_size"),
        (LLAMA_CONFIG, {"family": "qwen3"}, "model.family"),
        (
            {**LLAMA_CONFIG, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
            {},
            "model.init_from",
        ),
        (
            {**LLAMA_CONFIG, "model_type": "qwen2", "use_sliding_window": True},
            {},
            "model.init_from",
        ),
    ],
)
def test_bad_folders_and_disagreeing_fields_are_refused_by_name(
    backend: Backend,
    user_client: Callable[..., Client],
    config: dict[str, Any] | None,
    model: dict[str, Any],
    field: str,
) -> None:
    folder = model_folder(backend, config)
    assert refused_field(user_client(), {"model": {"init_from": str(folder), **model}}) == field


def test_a_huge_config_json_is_refused_quickly_without_reading_it(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    folder = model_folder(backend)
    with (folder / "config.json").open("wb") as f:
        f.truncate(1 << 30)  # 1 GiB, sparse: reading it all would take seconds and the memory
    started = time.monotonic()
    with pytest.raises(InvalidRequest) as caught:
        user_client().submit({"name": "init", "model": {"init_from": str(folder)}})
    assert time.monotonic() - started < 2.0
    assert caught.value.details[0]["field"] == "model.init_from"
    assert "larger than 1024 KiB" in caught.value.message


def test_a_folder_outside_the_data_roots_is_refused(
    backend: Backend, user_client: Callable[..., Client], tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    client = user_client()
    assert refused_field(client, {"model": {"init_from": str(tmp_path)}}) == "model.init_from"
    # The state dir (admin token, database) is never data, even named as a model folder.
    state = backend.server.settings.state_dir
    with pytest.raises(InvalidRequest) as caught:
        client.submit({"name": "x", "model": {"init_from": str(state)}})
    assert caught.value.details[0]["field"] == "model.init_from"
    assert "never data" in caught.value.message


def test_a_symlinked_config_json_outside_the_roots_is_refused(
    backend: Backend, user_client: Callable[..., Client], tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    folder = model_folder(backend)
    (folder / "config.json").symlink_to(tmp_path / "config.json")
    assert refused_field(user_client(), {"model": {"init_from": str(folder)}}) == "model.init_from"


def test_tokenizer_init_from_needs_the_file_and_the_folder(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    client = user_client()
    folder = model_folder(backend, LLAMA_CONFIG)  # no tokenizer.json
    spec = {"model": {"init_from": str(folder)}, "data": {"tokenizer": "init_from"}}
    assert refused_field(client, spec) == "data.tokenizer"
    with pytest.raises(InvalidRequest, match=r"needs model\.init_from"):
        client.submit({"name": "x", "data": {"tokenizer": "init_from"}})


def test_a_shape_that_does_not_fit_the_layout_is_refused(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    folder = model_folder(backend, {**LLAMA_CONFIG, "num_hidden_layers": 3})
    with pytest.raises(InvalidRequest, match=r"n_layers=3 is not divisible by parallel\.pp=2"):
        user_client().submit(
            {
                "name": "x",
                "model": {"init_from": str(folder)},
                "parallel": {"pp": 2},
                "train": {"global_batch_size": 8, "micro_batch_size": 2},
            }
        )


def test_export_of_another_users_job_or_a_missing_step_is_not_found(
    backend: Backend, user_client: Callable[..., Client], tmp_path: Path
) -> None:
    alice, bob = user_client(), user_client()
    job = alice.submit({"name": "source"})
    with pytest.raises(NotFound, match="no committed checkpoint yet"):
        alice.export(job["id"], tmp_path / "a.zip")
    commit_checkpoint(backend, job["id"], 4)
    with pytest.raises(NotFound):
        bob.export(job["id"], tmp_path / "b.zip")
    with pytest.raises(NotFound, match="at step 5"):
        alice.export(job["id"], tmp_path / "c.zip", step=5)
    # A checkpoint this test forged (no DCP metadata, no spec): a clear refusal, not a 500.
    with pytest.raises(InvalidRequest) as caught:
        alice.export(job["id"], tmp_path / "d.zip", step=4)
    assert caught.value.code == "export_failed"
    assert "no job spec" in caught.value.message
    # Named as the job's step; where the server keeps it is not the user's business.
    storage = str(backend.server.settings.storage_root)
    assert storage not in caught.value.message, caught.value.message
    assert "checkpoint step 4" in caught.value.message, caught.value.message


def test_export_step_must_be_a_positive_integer(backend: Backend) -> None:
    _, token = backend.new_user()
    job = backend.client(token).submit({"name": "source"})
    response = httpx.get(
        f"{backend.server.url}/v1/jobs/{job['id']}/export",
        params={"step": "0"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 422
