"""`shardline train` with `model.init_from`: the local command reads the shape from
config.json and its ranks start from the Hugging Face weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from tests.support.hf_models import save_random_llama
from shardline.workers.engine.data.loader import build_loader
from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.hf_config import resolve_init_from
from shardline.workers.contract.spec import load_spec


BIN = Path(sys.executable).parent


def test_train_starts_from_the_hugging_face_weights(tmp_path: Path) -> None:
    hf = save_random_llama(tmp_path / "llama", seed=9)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(
        yaml.safe_dump(
            {
                "name": "local-init",
                "model": {"init_from": str(tmp_path / "llama"), "seq_len": 32},
                "parallel": {"pp": 2},
                "train": {"steps": 2, "global_batch_size": 4, "micro_batch_size": 1},
            }
        )
    )
    out = tmp_path / "metrics.jsonl"
    proc = subprocess.run(
        [BIN / "shardline", "train", spec_path, "--metrics-out", out],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    first = json.loads(out.read_text().splitlines()[0])
    spec = resolve_init_from(load_spec(spec_path), DataAccess())
    rows = build_loader(spec, dp_rank=0, dp_size=1).train_batch(1).tokens
    with torch.no_grad():
        logits = hf(rows[:, :-1]).logits
    expected = F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())
    assert first["step"] == 1 and first["loss"] == pytest.approx(float(expected), rel=1e-4)


def test_train_refuses_a_disagreeing_field(tmp_path: Path) -> None:
    save_random_llama(tmp_path / "llama")
    spec_path = tmp_path / "spec.yaml"
    body = {"name": "bad", "model": {"init_from": str(tmp_path / "llama"), "n_layers": 2}}
    spec_path.write_text(yaml.safe_dump(body))
    proc = subprocess.run(
        [BIN / "shardline", "train", spec_path], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "model.n_layers" in proc.stderr and "Traceback" not in proc.stderr
