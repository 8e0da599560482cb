"""Each model family against transformers itself: a tiny random model of the family's own
class (no download), imported through init_from, gives transformers' logits; written back
as the engine's export writes it, transformers loads it as the same class and gives the
same logits again. And what a family does not compute is refused, naming the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.hf_config import InitFromError, resolve_init_from
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.hf_weights import to_hf_state
from shardline.workers.engine.local_model import load_local_model
from shardline.workers.engine.models.family import load_family
from tests.support.hf_models import TINY_FAMILIES, save_random_model

FAMILIES = sorted(TINY_FAMILIES)
CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
}
SEQ = 24  # longer than Mistral's window (8) and Llama's original context (16)


def _tokens() -> torch.Tensor:
    return torch.randint(0, 256, (2, SEQ), generator=torch.Generator().manual_seed(5))


def _logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        out = model(_tokens())
    return out if isinstance(out, torch.Tensor) else out.logits


def _export(folder: Path, out: Path) -> JobSpec:
    """The engine's model of `folder` written out as `shardline export` writes a
    checkpoint: the family's config.json and its tensors under Hugging Face's names."""
    spec = resolve_init_from(
        JobSpec.model_validate({"name": "t", "model": {"init_from": str(folder), "seq_len": SEQ}}),
        DataAccess(),
    )
    resolved = spec.model.resolved()
    family = load_family(spec.model.family_name)
    model = load_local_model(folder, torch.device("cpu")).model
    tensors = to_hf_state(model.state_dict(), family.state_dict_adapter(family.args(resolved)))
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = family.config.hf_config(resolved, bos_token_id=None, eos_token_id=None)
    (out / "config.json").write_text(json.dumps(config))
    return spec


@pytest.mark.parametrize("family", FAMILIES)
def test_imported_model_gives_transformers_logits(tmp_path: Path, family: str) -> None:
    hf = save_random_model(family, tmp_path / family)
    ours = load_local_model(tmp_path / family, torch.device("cpu"))
    assert ours.family.name == family
    assert float((_logits(ours.model.eval()) - _logits(hf)).abs().max()) < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_exported_model_loads_in_transformers_as_its_family(tmp_path: Path, family: str) -> None:
    from transformers import AutoModelForCausalLM

    hf = save_random_model(family, tmp_path / family)
    spec = _export(tmp_path / family, tmp_path / "out")
    assert spec.model.family == family
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out").float().eval()
    assert type(back).__name__ == CLASSES[family]
    assert float((_logits(back) - _logits(hf)).abs().max()) < 1e-5
    tied = bool(TINY_FAMILIES[family].get("tie_word_embeddings"))
    assert back.config.tie_word_embeddings is tied
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == family and written["architectures"] == [CLASSES[family]]


def test_the_switches_of_each_family_are_read_from_config_json(tmp_path: Path) -> None:
    models = {}
    for family in FAMILIES:
        save_random_model(family, tmp_path / family)
        spec = resolve_init_from(
            JobSpec.model_validate({"name": "t", "model": {"init_from": str(tmp_path / family)}}),
            DataAccess(),
        )
        models[family] = spec.model.resolved()
    assert models["llama"]["rope_scaling"]["rope_type"] == "llama3"
    assert models["llama"]["tie_embeddings"] and models["llama"]["head_dim"] == 32
    assert models["qwen2"]["qkv_bias"] and models["qwen2"]["tie_embeddings"]
    assert models["qwen3"]["qk_norm"] and models["qwen3"]["head_dim"] == 32
    assert models["mistral"]["sliding_window"] == 8
    assert not any(m["qkv_bias"] for f, m in models.items() if f != "qwen2")


@pytest.mark.parametrize(
    ("family", "overrides", "says"),
    [
        (
            "llama",
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            "rope_type='yarn' is not computed here",
        ),
        ("llama", {"attention_bias": True}, "attention_bias=true is not supported for llama"),
        ("qwen3", {"attention_bias": True}, "attention_bias=true is not supported for qwen3"),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 8}, "use_sliding_window"),
        ("llama", {"mlp_bias": True}, "mlp_bias=true"),
        ("llama", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ],
)
def test_what_a_family_does_not_compute_is_refused_naming_the_key(
    tmp_path: Path, family: str, overrides: dict[str, Any], says: str
) -> None:
    save_random_model(family, tmp_path / family)
    config_path = tmp_path / family / "config.json"
    config = json.loads(config_path.read_text())
    config.update(overrides)
    if "rope_scaling" in overrides:
        config.pop("rope_parameters", None)
    config_path.write_text(json.dumps(config))
    spec = JobSpec.model_validate({"name": "t", "model": {"init_from": str(tmp_path / family)}})
    with pytest.raises(InitFromError, match=says.replace("(", r"\(")):
        resolve_init_from(spec, DataAccess())


def test_another_model_type_is_refused_naming_the_families(tmp_path: Path) -> None:
    save_random_model("llama", tmp_path / "m")
    config_path = tmp_path / "m" / "config.json"
    config_path.write_text(
        json.dumps({**json.loads(config_path.read_text()), "model_type": "gpt2"})
    )
    spec = JobSpec.model_validate({"name": "t", "model": {"init_from": str(tmp_path / "m")}})
    with pytest.raises(InitFromError) as err:
        resolve_init_from(spec, DataAccess())
    for model_type in FAMILIES:
        assert repr(model_type) in str(err.value)


@pytest.mark.parametrize("family", FAMILIES)
def test_shardline_generate_decodes_what_transformers_generates(
    tmp_path: Path, family: str
) -> None:
    """`shardline generate --greedy` on the transformers-made folder (its KV cache, rope
    scaling, q/k norms and a window shorter than prompt plus answer) picks the tokens
    transformers' greedy `generate` picks."""
    from typer.testing import CliRunner

    from shardline.api.cli import app

    hf = save_random_model(family, tmp_path / family)
    prompt = "Shardline trains "
    ids = list(prompt.encode())
    options = ["--prompt", prompt, "--greedy", "--max-new-tokens", "12", "--ids"]
    result = CliRunner().invoke(app, ["generate", str(tmp_path / family), *options])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["prompt_ids"] == ids
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor([ids]),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(ids) :].tolist()
    assert got["new_ids"] == expected
