"""Hugging Face Llama weights in and out of the engine's model, in one process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from shardline.workers.contract.data_access import ROOTS_ENV, DataAccessDenied
from shardline.workers.contract.hf_config import shape_from_config
from shardline.workers.engine.generate import Sampling, generate
from shardline.workers.engine.hf_export import write_safetensors
from shardline.workers.engine.hf_weights import load_init_from, to_hf_state
from shardline.workers.engine.models.family import load_family
from shardline.workers.engine.models.llama.config import ModelArgs
from shardline.workers.engine.models.llama.model import Transformer
from shardline.workers.engine.models.llama.state_dict_adapter import (
    halves_to_interleaved,
    interleaved_to_halves,
)
from tests.support.hf_models import save_random_llama

LLAMA = load_family("llama")


def _engine_model(folder: Path) -> Transformer:
    config = json.loads((folder / "config.json").read_text())
    args = ModelArgs(seq_len=config["max_position_embeddings"], **shape_from_config(config))
    torch.manual_seed(123)  # a different random start than the Hugging Face model's
    model = Transformer(args)
    load_init_from([model], folder, LLAMA, args)
    return model.eval()


def _tokens(vocab: int = 256, length: int = 48) -> torch.Tensor:
    return torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(5))


def _max_logit_gap(hf: Any, ours: Transformer) -> float:
    tokens = _tokens()
    with torch.no_grad():
        expected = hf(tokens).logits
        got = ours(tokens)
    return float((expected - got).abs().max())


def test_imported_model_gives_transformers_logits(tmp_path: Path) -> None:
    hf = save_random_llama(tmp_path)
    assert _max_logit_gap(hf, _engine_model(tmp_path)) < 1e-4


def test_sharded_checkpoint_with_index_imports(tmp_path: Path) -> None:
    hf = save_random_llama(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    assert _max_logit_gap(hf, _engine_model(tmp_path)) < 1e-4


def test_tied_embeddings_import_into_the_untied_head(tmp_path: Path) -> None:
    hf = save_random_llama(tmp_path, tie_word_embeddings=True)
    ours = _engine_model(tmp_path)
    assert ours.output is not None and ours.tok_embeddings is not None
    assert torch.equal(ours.output.weight, ours.tok_embeddings.weight)
    assert _max_logit_gap(hf, ours) < 1e-4


def test_export_gives_back_every_original_tensor(tmp_path: Path) -> None:
    save_random_llama(tmp_path / "in")
    ours = _engine_model(tmp_path / "in")
    original = load_file(str(tmp_path / "in" / "model.safetensors"))
    out = tmp_path / "out"
    out.mkdir()
    hf_state = to_hf_state(ours.state_dict(), LLAMA.state_dict_adapter(ours.args))
    write_safetensors(hf_state, out, max_bytes=1 << 30)
    exported = load_file(str(out / "model.safetensors"))
    assert exported.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name


def test_export_splits_into_indexed_shards_above_the_size(tmp_path: Path) -> None:
    save_random_llama(tmp_path / "in")
    ours = _engine_model(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    hf_state = to_hf_state(ours.state_dict(), LLAMA.state_dict_adapter(ours.args))
    files = write_safetensors(hf_state, out, max_bytes=60_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(files) > 2 and set(index["weight_map"].values()) == set(files[:-1])
    original = load_file(str(tmp_path / "in" / "model.safetensors"))
    assert set(index["weight_map"]) == set(original)
    # Every tensor, read from the shard the index names, equals the original.
    shards = {name: load_file(str(out / name)) for name in set(index["weight_map"].values())}
    for name, tensor in original.items():
        shard = shards[index["weight_map"][name]]
        assert torch.equal(shard[name], tensor), name
    assert sum(len(s) for s in shards.values()) == len(original)  # each tensor once


def test_rotary_permutation_round_trips_and_moves_rows() -> None:
    w = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)  # 2 heads of head_dim 4
    halves = interleaved_to_halves(w, 2)
    # Interleaved pairs (0,1),(2,3) -> halves: rows 0,2 then 1,3 within each head.
    assert halves[:4, 0].tolist() == [0.0, 6.0, 3.0, 9.0]
    assert torch.equal(halves_to_interleaved(halves, 2), w)


def test_cached_greedy_decode_equals_the_full_forward(tmp_path: Path) -> None:
    save_random_llama(tmp_path)
    ours = _engine_model(tmp_path)
    prompt = _tokens(length=5)[0].tolist()
    new = generate(ours, prompt, family=LLAMA, max_new_tokens=12)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            ids.append(int(ours(torch.tensor([ids]))[0, -1].argmax()))
    assert new == ids[len(prompt) :]


def test_greedy_decode_equals_transformers_generate(tmp_path: Path) -> None:
    hf = save_random_llama(tmp_path)
    ours = _engine_model(tmp_path)
    prompt = _tokens(length=6)[0].tolist()
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=16,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    assert generate(ours, prompt, family=LLAMA, max_new_tokens=16) == expected


def test_sampling_with_a_tiny_top_p_is_greedy_and_is_seeded(tmp_path: Path) -> None:
    save_random_llama(tmp_path)
    ours = _engine_model(tmp_path)
    prompt = [3, 4, 5]
    greedy = generate(ours, prompt, family=LLAMA, max_new_tokens=8)
    narrow = Sampling(greedy=False, temperature=1.0, top_p=1e-6, seed=1)
    assert generate(ours, prompt, family=LLAMA, max_new_tokens=8, sampling=narrow) == greedy
    wide = Sampling(greedy=False, temperature=2.0, top_p=1.0, seed=7)
    first = generate(ours, prompt, family=LLAMA, max_new_tokens=8, sampling=wide)
    assert generate(ours, prompt, family=LLAMA, max_new_tokens=8, sampling=wide) == first


def test_eos_stops_generation(tmp_path: Path) -> None:
    save_random_llama(tmp_path)
    ours = _engine_model(tmp_path)
    greedy = generate(ours, [1, 2, 3], family=LLAMA, max_new_tokens=10)
    stop_at = greedy[3]
    stopped = generate(ours, [1, 2, 3], family=LLAMA, max_new_tokens=10, eos_token_id=stop_at)
    assert stopped == greedy[: greedy.index(stop_at) + 1]


@pytest.mark.parametrize("sharded", [False, True], ids=["one-file", "indexed"])
def test_weights_symlinked_from_outside_the_data_roots_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sharded: bool
) -> None:
    outside, root = tmp_path / "outside", tmp_path / "root"
    save_random_llama(outside, max_shard_size="40KB" if sharded else "5GB")
    (root / "llama").mkdir(parents=True)
    for path in outside.iterdir():
        target = root / "llama" / path.name
        if path.suffix == ".safetensors":
            target.symlink_to(path)  # the weights point out of the roots
        else:
            target.write_bytes(path.read_bytes())
    monkeypatch.setenv(ROOTS_ENV, str(root))
    config = json.loads((root / "llama" / "config.json").read_text())
    args = ModelArgs(seq_len=64, **shape_from_config(config))
    with pytest.raises(DataAccessDenied, match="outside the data roots"):
        load_init_from([Transformer(args)], root / "llama", LLAMA, args)


def test_a_folder_of_another_model_type_than_the_job_s_family_is_refused(
    tmp_path: Path,
) -> None:
    """The worker reads config.json again: a folder changed after the job was submitted
    to another architecture is refused, not read as the job's family."""
    save_random_llama(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    args = ModelArgs(seq_len=64, **shape_from_config(config))
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "mistral"}))
    with pytest.raises(ValueError, match="model_type='mistral', not one of the llama family"):
        load_init_from([Transformer(args)], tmp_path, LLAMA, args)
