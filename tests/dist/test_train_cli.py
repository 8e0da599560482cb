"""`shardline train` as a user runs it: a subprocess, a spec file, a metrics file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.dist.runs import run
from shardline.workers.contract.spec import load_spec

BIN = Path(sys.executable).parent


def write_spec(tmp_path: Path, **parallel: int) -> Path:
    spec = {
        "name": "cli-run",
        "model": {"preset": "tiny", "seq_len": 32},
        "parallel": parallel,
        "train": {
            "steps": 6,
            "global_batch_size": 4,
            "micro_batch_size": 1,
            "log_every": 2,
            "eval_every": 3,
            "lr": 1e-3,
        },
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_train_writes_metrics_and_ends_with_the_summary(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, dp=2, zero_stage=1)
    out = tmp_path / "metrics.jsonl"
    proc = subprocess.run(
        [BIN / "shardline", "train", spec, "--nproc", "2", "--metrics-out", out],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(summary) == {
        "final_loss",
        "steps",
        "tokens_per_s",
        "mfu",
        "step_time_s",
        "layout",
        "peak_mem_bytes",
    }
    assert summary["steps"] == 6 and summary["mfu"] is None  # no MFU on CPU
    assert summary["layout"] == "pp=1,dp=2,tp=1,zero=1,fp32"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 4, 6]
    for r in rows:
        assert {"step", "loss", "grad_norm", "lr", "tokens_per_s", "mem_bytes"} <= set(r)
        assert set(r["mem_bytes"]) == {"params", "grads", "optim"}
    assert [r["step"] for r in rows if "val_loss" in r] == [1, 6]
    # The same spec trained in this process's own spawned world: the CLI reports exactly it.
    reference, _ = run(load_spec(spec))
    expected = {m["step"]: m["loss"] for m in reference}
    assert [r["loss"] for r in rows] == pytest.approx([expected[r["step"]] for r in rows])
    assert summary["final_loss"] == pytest.approx(expected[6])
    assert "cli-run" in proc.stderr  # the progress display


def test_train_under_torchrun(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, dp=2)
    torchrun = shutil.which("torchrun", path=str(BIN))
    assert torchrun is not None
    proc = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "shardline.api.cli",
            "train",
            spec,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    summaries = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1 and summaries[0]["steps"] == 6  # only rank 0 reports


def test_invalid_spec_is_a_readable_error(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nmodel: {n_layers: 5}\nparallel: {pp: 2}\n")
    proc = subprocess.run([BIN / "shardline", "train", spec], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "model.n_layers=5 is not divisible by parallel.pp=2" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_nproc_must_match_the_layout(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, dp=2)
    proc = subprocess.run(
        [BIN / "shardline", "train", spec, "--nproc", "3"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "dp*tp*pp = 2*1*1 = 2 but the job runs on 3 processes" in proc.stderr
