"""Model families are found by name, Hugging Face `model_type` and preset; the half the
control plane reads loads no torch; the other half is what the engine builds from."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shardline.workers.contract.hf_config import InitFromError, shape_from_config
from shardline.workers.contract.presets import PRESETS
from shardline.workers.contract.sections import ModelSpec
from shardline.workers.engine.models import registry
from shardline.workers.engine.models.family import load_family
from shardline.workers.engine.models.llama.config import CONFIG as LLAMA_CONFIG

LLAMA_JSON = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "intermediate_size": 160,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
}


def test_every_family_is_found_by_its_model_types_and_presets() -> None:
    assert registry.family_of_model_type("llama") == "llama"
    assert registry.family_of_model_type("gpt2") is None
    assert registry.family_config("llama") is LLAMA_CONFIG
    for name in PRESETS:
        assert registry.family_of(ModelSpec(preset=name)) in registry.FAMILIES
    with pytest.raises(KeyError, match="no model family 'nope'"):
        registry.family_config("nope")


def test_a_config_json_is_read_by_the_family_its_model_type_names() -> None:
    assert shape_from_config(LLAMA_JSON) == {
        "dim": 64,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "vocab_size": 300,
        "ffn_dim": 160,
        "norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_embeddings": False,
        "rope_scaling": None,
        "sliding_window": None,
    }
    with pytest.raises(InitFromError, match="the model types that load are 'llama'"):
        shape_from_config({**LLAMA_JSON, "model_type": "gpt2"})


def test_the_family_the_engine_builds_is_the_one_its_config_describes() -> None:
    family = load_family("llama")
    assert family.config is LLAMA_CONFIG and family.name == "llama"
    args = family.args(ModelSpec(preset="tiny").resolved())
    model = family.build(args)
    # The adapter names every parameter, both ways.
    adapter = family.state_dict_adapter(args)
    for name, _ in model.named_parameters():
        assert adapter.from_hf_name(adapter.to_hf_name(name)) == name
    exported = family.config.hf_config(
        ModelSpec(preset="tiny").resolved(), bos_token_id=None, eos_token_id=None
    )
    assert exported["architectures"] == ["LlamaForCausalLM"]
    assert family.config.shape_from_hf(exported)["dim"] == args.dim


def test_pipeline_stages_keep_the_first_and_last_parts_where_they_belong() -> None:
    family = load_family("llama")
    model = family.build(family.args(ModelSpec(preset="tiny").resolved()))
    first, last = family.cut_stage(model, 0, 2), family.cut_stage(model, 1, 2)
    names = [{n.split(".")[0] for n, _ in m.named_parameters()} for m in (first, last)]
    assert names == [{"tok_embeddings", "layers"}, {"layers", "norm", "output"}]
    blocks = [[n for n, _ in m.get_submodule("layers").named_children()] for m in (first, last)]
    assert blocks == [["0", "1"], ["2", "3"]]


def test_reading_a_config_json_loads_no_torch() -> None:
    probe = (
        "import sys\n"
        "from shardline.workers.contract.hf_config import shape_from_config\n"
        f"shape_from_config({LLAMA_JSON!r})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
