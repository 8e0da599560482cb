"""The tiny model learns real text: this project's own engine source code, byte-tokenized."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from shardline.workers.engine.data.loader import BatchLoader
from shardline.workers.engine.trainer import Trainer
from shardline.workers.contract.spec import JobSpec

CORPUS = Path(__file__).resolve().parents[2] / "workers"
STEPS = 150
MARGIN = 0.9


def bigram_loss(train: np.ndarray, rows: list[torch.Tensor], vocab: int) -> float:
    """Mean next-token loss (nats) of a byte bigram model counted on `train`, on the same
    held-out rows the trainer evaluates; add-k smoothing with the k that suits it best."""
    counts = np.zeros((vocab, vocab))
    np.add.at(counts, (train[:-1].astype(np.int64), train[1:].astype(np.int64)), 1.0)
    prev = torch.cat([r[:, :-1].reshape(-1) for r in rows]).numpy()
    nxt = torch.cat([r[:, 1:].reshape(-1) for r in rows]).numpy()
    losses = []
    for k in (1.0, 0.3, 0.1, 0.03, 0.01):
        probs = (counts + k) / (counts + k).sum(axis=1, keepdims=True)
        losses.append(float(-np.log(probs[prev, nxt]).mean()))
    return min(losses)


def test_validation_loss_beats_a_bigram_model_on_project_source(
    one_rank_world: torch.device, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDLINE_CACHE_DIR", str(tmp_path))
    spec = JobSpec.model_validate(
        {
            "name": "real-text",
            "model": {"preset": "tiny", "seq_len": 128},
            "data": {
                "source": "text",
                "path": str(CORPUS),
                "tokenizer": "byte",
                "val_fraction": 0.1,
            },
            "train": {
                "steps": STEPS,
                "global_batch_size": 16,
                "micro_batch_size": 16,
                "lr": 3e-3,
                "min_lr": 3e-4,
                "warmup_steps": 10,
                "log_every": 50,
                "seed": 1,
            },
        }
    )
    trainer = Trainer(spec, world_size=1, device=one_rank_world)
    loader = trainer.loader
    assert isinstance(loader, BatchLoader)
    assert len(loader.val_tokens) > 1000, "corpus too small to say anything"
    # A model that sees only the current byte (broken attention) can do no better than
    # the bigram statistics of the text; one that uses context must beat them.
    baseline = bigram_loss(
        loader.train_tokens, [b.tokens for b in trainer.val_batches], 256
    )
    initial = trainer.evaluate()
    trainer.train()
    final = trainer.evaluate()
    assert final < MARGIN * baseline, (initial, final, baseline)
    # The tokenized corpus was cached for the next run.
    assert list((tmp_path / "tokens").iterdir())
