"""A Hugging Face Llama imported into sharded layouts: every rank reads only its shards,
the distributed model gives transformers' logits, and its checkpoint exports back to the
very same tensors."""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from tests.dist.ranks import on_ranks
from tests.support.hf_models import save_random_llama, save_random_model
from shardline.workers.storage.checkpoints import CheckpointStore
from shardline.workers.storage.layout import CheckpointLocations
from shardline.workers.contract.data_access import DataAccess
from shardline.workers.engine.dtensor import plain
from shardline.workers.engine.trainer import Trainer
from shardline.workers.contract.hf_config import resolve_init_from
from shardline.workers.contract.spec import JobSpec


SEQ = 24


def _tokens() -> torch.Tensor:
    return torch.randint(0, 256, (2, SEQ), generator=torch.Generator().manual_seed(11))


def _forward(trainer: Trainer) -> torch.Tensor | None:
    """Logits of `_tokens()` through this rank's part of the model; None on stage 0 of a
    pipeline (it sends its hidden states on to the next stage's rank instead)."""
    module = trainer.parts.modules[0]
    tokens = _tokens()
    if trainer.dims.pp == 1:
        return plain(module(tokens))
    peers = trainer.pp_mesh.mesh.tolist()
    if trainer.pp_mesh.get_local_rank() == 0:
        dist.send(plain(module(tokens)).contiguous(), dst=peers[1])
        return None
    hidden = torch.empty(2, SEQ, trainer.spec.model.resolved()["dim"])
    dist.recv(hidden, src=peers[0])
    return plain(module(hidden))


def _import_forward_save(
    rank: int,
    world: int,
    device: torch.device,
    *,
    folder: str,
    layout: dict[str, Any],
    checkpoints: str,
    data: dict[str, Any] | None = None,
) -> torch.Tensor | None:
    spec = JobSpec.model_validate(
        {
            "name": "import",
            "model": {"init_from": folder, "seq_len": SEQ},
            "data": data or {},
            "parallel": layout,
            "train": {"steps": 1, "global_batch_size": 4, "micro_batch_size": 1, "seed": rank},
        }
    )
    trainer = Trainer(
        resolve_init_from(spec, DataAccess()),
        world_size=world,
        device=device,
        checkpoints=CheckpointLocations(save_url=checkpoints),
    )
    trainer.save_checkpoint()  # step 0: the imported weights, as the ranks hold them
    with torch.no_grad():
        return _forward(trainer)


def _import_and_export(
    tmp_path: Path, folder: Path, layout: dict[str, Any], data: dict[str, Any] | None = None
) -> tuple[list[torch.Tensor], Path]:
    """`folder` imported into `layout` on 4 ranks (the last stage's logits of each rank
    that has them), and its step-0 checkpoint exported by `shardline export`, as a user
    runs it."""
    checkpoints = tmp_path / "checkpoints"
    results = on_ranks(
        partial(
            _import_forward_save,
            folder=str(folder),
            layout=layout,
            checkpoints=str(checkpoints),
            data=data,
        ),
        4,
    )
    logits = [r for r in results if r is not None]
    assert len(logits) == (2 if layout.get("pp") else 4)  # last pipeline stage only
    ckpt = CheckpointStore(str(checkpoints)).find(0)
    assert ckpt is not None
    out = tmp_path / "out"
    shardline = str(Path(sys.executable).parent / "shardline")
    done = subprocess.run(
        [shardline, "export", ckpt.path, str(out)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return logits, out


def _assert_same_tensors(folder: Path, out: Path) -> None:
    exported = load_file(str(out / "model.safetensors"))
    original: dict[str, torch.Tensor] = {}
    for part in folder.glob("*.safetensors"):
        original.update(load_file(str(part)))
    assert exported.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name


@pytest.mark.parametrize(
    "layout",
    [
        {"tp": 2, "pp": 2},
        {"dp": 2, "tp": 2, "zero_stage": 3},
        {"pp": 2, "dp": 2, "zero_stage": 1},
    ],
    ids=["tp2-pp2", "dp2-tp2-zero3", "pp2-dp2-zero1"],
)
def test_import_gives_transformers_logits_and_exports_the_same_tensors(
    tmp_path: Path, layout: dict[str, Any]
) -> None:
    folder = tmp_path / "llama"
    hf = save_random_llama(folder, max_shard_size="60KB")  # several files and an index
    with torch.no_grad():
        expected = hf(_tokens()).logits
    logits, out = _import_and_export(tmp_path, folder, layout)
    for got in logits:
        assert float((got - expected).abs().max()) < 1e-4
    _assert_same_tensors(folder, out)


def _bpe_tokenizer(folder: Path) -> Any:
    """A small byte-level BPE tokenizer.json (under the tiny models' 256 ids) in `folder`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(
        ["hello shardline world"] * 20,
        trainers.BpeTrainer(vocab_size=256, initial_alphabet=alphabet),
    )
    tok.save(str(folder / "tokenizer.json"))
    return tok


FAMILY_LAYOUTS = {
    # Both tied: the head read into the last stage's copy, and into the one tensor.
    "llama": {"tp": 2, "pp": 2},
    "qwen2": {"dp": 2, "tp": 2, "zero_stage": 3},
    "qwen3": {"tp": 2, "pp": 2},
    "mistral": {"tp": 2, "pp": 2},
}


@pytest.mark.parametrize("family", list(FAMILY_LAYOUTS))
def test_each_family_imports_sharded_and_exports_to_its_own_class(
    tmp_path: Path, family: str
) -> None:
    """A transformers-made model of each family (its switches on: rope scaling, tied
    embeddings, biases, q/k norms, a sliding window shorter than the batch), imported into
    a sharded layout, gives transformers' logits; its checkpoint, exported by `shardline
    export`, loads in transformers as the same class and gives them again."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder = tmp_path / family
    hf = save_random_model(family, folder)
    # The model's own tokenizer beside it, as a downloaded folder has (save_pretrained
    # wrote generation_config.json too).
    tokenizer = _bpe_tokenizer(folder)
    with torch.no_grad():
        expected = hf(_tokens()).logits
    logits, out = _import_and_export(
        tmp_path, folder, FAMILY_LAYOUTS[family], data={"tokenizer": "init_from"}
    )
    for got in logits:
        assert float((got - expected).abs().max()) < 1e-4
    assert {"generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert GenerationConfig.from_pretrained(out).eos_token_id == hf.generation_config.eos_token_id
    text = "hello shardline"
    assert AutoTokenizer.from_pretrained(out).encode(text) == tokenizer.encode(text).ids
    back = AutoModelForCausalLM.from_pretrained(out).float().eval()
    assert type(back) is type(hf)
    assert back.config.tie_word_embeddings == hf.config.tie_word_embeddings
    with torch.no_grad():
        again = back(_tokens()).logits
    assert float((again - expected).abs().max()) < 1e-5
    _assert_same_tensors(folder, out)
