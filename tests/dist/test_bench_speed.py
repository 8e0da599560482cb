"""bench/mfu.py and bench/vs_torchtitan.py each print one JSON line, on this machine too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


def test_mfu_runs_a_spec_on_the_devices_present(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "mfu", "model": {"preset": "tiny", "seq_len": 32},
        "parallel": {"dp": 2, "zero_stage": 3}, "precision": "bf16",
        "train": {"steps": 50, "global_batch_size": 4, "micro_batch_size": 2, "warmup_steps": 1},
    }))
    line = bench("bench.mfu", str(spec), "--steps", "5")
    assert line["steps"] == 5 and line["layout"] == "pp=1,dp=2,tp=1,zero=3,bf16"
    assert isinstance(line["tokens_per_s"], float) and line["tokens_per_s"] > 0
    assert line["tokens_per_s"] == pytest.approx(4 * 32 / line["step_time_s"], rel=1e-2)
    assert isinstance(line["peak_mem_bytes"], int) and line["peak_mem_bytes"] > 0
    assert [row["rank"] for row in line["breakdown"]] == [0, 1]
    if torch.cuda.is_available():
        assert line["device"] != "cpu"
    else:
        assert line["device"] == "cpu" and line["mfu"] is None


def test_vs_plain_times_the_engine_and_a_plain_loop_in_turn(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "vs-plain", "model": {"preset": "tiny", "seq_len": 32},
        "train": {"steps": 5, "global_batch_size": 4, "micro_batch_size": 2},
    }))
    line = bench("bench.vs_plain", str(spec), "--steps", "2", "--rounds", "2")
    assert set(line["step_s"]) == {"engine", "plain", "engine_logged"}
    assert all(len(times) == 2 and min(times) > 0 for times in line["step_s"].values())
    # A tiny model on a loaded CPU: the ratio is only known to be a sane number here.
    assert 0.2 < line["ratio"] < 5 and 0.2 < line["ratio_logged"] < 5


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_vs_torchtitan_skips_cleanly_without_a_gpu() -> None:
    line = bench("bench.vs_torchtitan")
    assert line == {"bench": "vs_torchtitan", "spec": "examples/bench-1b.yaml",
                    "skipped": "no GPU"}
