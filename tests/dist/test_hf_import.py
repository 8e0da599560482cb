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
from tests.support.hf_models import save_random_llama
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
) -> torch.Tensor | None:
    spec = JobSpec.model_validate(
        {
            "name": "import",
            "model": {"init_from": folder, "seq_len": SEQ},
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
    checkpoints = tmp_path / "checkpoints"
    results = on_ranks(
        partial(
            _import_forward_save, folder=str(folder), layout=layout, checkpoints=str(checkpoints)
        ),
        4,
    )
    logits = [r for r in results if r is not None]
    assert len(logits) == (2 if layout.get("pp") else 4)  # last pipeline stage only
    for got in logits:
        assert float((got - expected).abs().max()) < 1e-4

    ckpt = CheckpointStore(str(checkpoints)).find(0)
    assert ckpt is not None
    # `shardline export CHECKPOINT OUT_DIR`, as a user runs it.
    shardline = str(Path(sys.executable).parent / "shardline")
    done = subprocess.run(
        [shardline, "export", ckpt.path, str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    exported = load_file(str(tmp_path / "out" / "model.safetensors"))
    original: dict[str, torch.Tensor] = {}
    for part in folder.glob("*.safetensors"):
        original.update(load_file(str(part)))
    assert exported.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name
