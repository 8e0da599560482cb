"""Bounds on what one job may ask: rank size, tokens per batch, parameters, and models too
large to train in host memory on CPU ranks."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from shardline.service.scheduler import host_memory_refusal
from shardline.workers.contract.spec import JobSpec, describe_errors
from shardline.workers.engine.models.family import count_params
from shardline.workers.engine.models.llama.config import ModelArgs
from shardline.workers.engine.models.llama.model import Transformer


def spec(**sections: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "x", **sections})


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"resources": {"cpus_per_worker": 0.01}}, "resources.cpus_per_worker: Input should be"),
        (
            {"model": {"seq_len": 1 << 20}, "train": {"micro_batch_size": 8}},
            "train.micro_batch_size x model.seq_len",
        ),
        (
            {
                "model": {"seq_len": 1 << 16},
                "train": {"global_batch_size": 1 << 16, "micro_batch_size": 32},
            },
            "train.global_batch_size x model.seq_len",
        ),
        ({"model": {"dim": 65536, "n_layers": 1024, "n_heads": 64}}, "parameters, above"),
        (
            {"fault_tolerance": {"hang_timeout_s": 0.001}},
            "fault_tolerance.hang_timeout_s: Input should be greater than or equal to 5",
        ),
        (
            {"train": {"steps": 10**8}},
            "train.steps: Input should be less than or equal to 10000000",
        ),
        (
            {"data": {"val_fraction": 0}, "train": {"eval_every": 1}},
            "data.val_fraction=0 holds out none; set val_fraction above 0",
        ),
    ],
)
def test_absurd_requests_are_refused_naming_what_to_change(
    sections: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError) as err:
        spec(**sections)
    assert any(message in line for line in describe_errors(err.value)), describe_errors(err.value)


def test_a_tenth_of_a_cpu_is_still_a_rank() -> None:
    assert spec(resources={"cpus_per_worker": 0.1}).resources.cpus_per_worker == 0.1


@pytest.mark.parametrize(
    "model", [{"preset": "tiny"}, {"preset": "tiny", "dim": 64, "n_kv_heads": 4, "n_layers": 2}]
)
def test_parameter_count_matches_the_engines_model(model: dict[str, Any]) -> None:
    job = spec(model=model)
    engine_model = Transformer(ModelArgs.from_resolved(job.model.resolved()))
    assert job.model.parameter_count() == count_params(engine_model)


def test_an_8b_model_on_cpu_ranks_does_not_fit() -> None:
    big = spec(model={"preset": "8b"})
    reason = host_memory_refusal(big, cluster_gpus=0)
    assert reason is not None
    assert "8.0B parameters" in reason and "the cluster has no GPUs" in reason
    assert "gpus_per_worker" in (host_memory_refusal(big, cluster_gpus=8) or "")
    on_gpus = spec(model={"preset": "8b"}, resources={"gpus_per_worker": 1})
    assert host_memory_refusal(on_gpus, cluster_gpus=0) is None
    assert host_memory_refusal(spec(model={"preset": "1b"}), cluster_gpus=0) is None
