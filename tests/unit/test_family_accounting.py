"""What the control plane predicts of each family without torch (parameters, FLOPs per
token, model-state bytes) is what the engine builds: the planner and `parallel: auto`
stay as accurate for Qwen and Mistral as for Llama. And the presets of the published
models have their published sizes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from pydantic import ValidationError

from shardline.workers.contract.cost_model import flops_per_token
from shardline.workers.contract.memory_model import model_state_bytes
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.models.family import count_params, load_family

MODELS: dict[str, dict[str, Any]] = {
    "llama-tied-head-dim": {
        "family": "llama",
        "head_dim": 48,
        "tie_embeddings": True,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    },
    "qwen2": {"family": "qwen2", "tie_embeddings": True},
    "qwen3": {"family": "qwen3", "head_dim": 48},
    "mistral": {"family": "mistral", "sliding_window": 16},
    "qwen3-0.6b": {"preset": "qwen3-0.6b", "n_layers": 2},
    "llama3.2-1b": {"preset": "llama3.2-1b", "n_layers": 2},
}


def _spec(model: dict[str, Any], **parallel: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "t", "model": model, "parallel": parallel})


def _built(spec: JobSpec) -> tuple[Any, Any, torch.nn.Module]:
    family = load_family(spec.model.family_name)
    args = family.args(spec.model.resolved())
    with torch.device("meta"):
        return family, args, family.build(args)


@pytest.mark.parametrize("name", list(MODELS))
def test_parameters_and_flops_predicted_are_what_the_engine_builds(name: str) -> None:
    spec = _spec(MODELS[name])
    family, args, model = _built(spec)
    assert spec.model.parameter_count() == count_params(model)
    assert flops_per_token(spec.model.resolved()) == family.flops_per_token(args, model)
    state = model_state_bytes(spec.model.resolved(), spec.parallel)
    assert state["params"] == 4 * count_params(model)


@pytest.mark.parametrize(
    ("preset", "billions"),
    [
        ("llama3.2-1b", 1.236),
        ("llama3.2-3b", 3.213),
        ("llama3.1-8b", 8.030),
        ("qwen2.5-0.5b", 0.494),
        ("qwen2.5-1.5b", 1.544),
        ("qwen3-0.6b", 0.596),
        ("qwen3-1.7b", 1.721),
        ("mistral-7b", 7.248),
    ],
)
def test_presets_have_the_published_sizes(preset: str, billions: float) -> None:
    assert _spec({"preset": preset}).model.parameter_count() / 1e9 == pytest.approx(
        billions, abs=0.001
    )


def test_a_tied_head_is_one_tensor_and_a_pipeline_s_last_stage_holds_its_copy() -> None:
    one = _spec({"preset": "qwen3-0.6b", "n_layers": 4})
    untied = _spec({"preset": "qwen3-0.6b", "n_layers": 4, "tie_embeddings": False})
    head, norm = 151936 * 1024, 1024
    assert untied.model.parameter_count() - one.model.parameter_count() == head
    layer = (one.model.parameter_count() - head - norm) // 4
    staged = _spec({"preset": "qwen3-0.6b", "n_layers": 4}, pp=2)
    # The last stage: two layers, the final norm and its copy of the embedding.
    last = model_state_bytes(staged.model.resolved(), staged.parallel)["params"]
    assert last == 4 * (2 * layer + norm + head)


def test_an_unknown_family_and_an_odd_head_dim_name_the_field() -> None:
    with pytest.raises(ValidationError, match=r"model\.family='gpt2' is unknown"):
        _spec({"family": "gpt2"})
    with pytest.raises(ValidationError, match=r"model\.head_dim = 33 must be even"):
        _spec({"head_dim": 33})


def test_rope_scaling_names_what_its_type_needs() -> None:
    with pytest.raises(ValidationError, match=r"model\.rope_scaling\.low_freq_factor"):
        _spec({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(ValidationError, match="applies to rope_type 'llama3' only"):
        _spec({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}})
