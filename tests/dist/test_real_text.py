"""The tiny model learns real text: this project's own engine source code, byte-tokenized."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workers.engine.trainer import Trainer
from workers.spec import JobSpec

CORPUS = Path(__file__).resolve().parents[2] / "workers"


def test_validation_loss_falls_below_60_percent_on_project_source(
    one_rank_world: torch.device, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDLINE_CACHE_DIR", str(tmp_path))
    spec = JobSpec.model_validate({
        "name": "real-text",
        "model": {"preset": "tiny", "seq_len": 128},
        "data": {"source": "text", "path": str(CORPUS), "tokenizer": "byte",
                 "val_fraction": 0.1},
        "train": {"steps": 150, "global_batch_size": 16, "micro_batch_size": 16, "lr": 3e-3,
                  "min_lr": 3e-4, "warmup_steps": 10, "log_every": 50, "seed": 1},
    })
    trainer = Trainer(spec, world_size=1, device=one_rank_world)
    assert len(trainer.loader.val_tokens) > 1000, "corpus too small to say anything"
    initial = trainer.evaluate()
    trainer.train()
    final = trainer.evaluate()
    print(f"corpus {CORPUS}: {len(trainer.loader.tokens)} byte tokens; "
          f"val loss {initial:.3f} -> {final:.3f} ({final / initial:.0%})")
    assert final < 0.6 * initial
    # The tokenized corpus was cached for the next run.
    assert list((tmp_path / "tokens").iterdir())
