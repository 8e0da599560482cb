"""bench/layouts.py prints one JSON line per layout; `shardline train` runs pp x tp."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from bench.layouts import parse_layout

ROOT = Path(__file__).resolve().parents[2]


def small_spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({
        "name": "bench", "model": {"preset": "tiny", "seq_len": 32},
        "train": {"steps": 4, "global_batch_size": 8, "micro_batch_size": 2, "log_every": 2,
                  "warmup_steps": 1},
    }))
    return path


def test_parse_layout_uses_spec_names() -> None:
    assert parse_layout("pp=2,v=2,sched=interleaved_1f1b,sp=1,tp=2") == {
        "pp": 2, "pp_virtual_stages": 2, "pp_schedule": "interleaved_1f1b",
        "sequence_parallel": True, "tp": 2}


def test_bench_prints_one_line_per_layout(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.layouts", str(small_spec(tmp_path)), "pp=2,tp=2",
         "dp=2,tp=2,zero=1"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    good, bad = (json.loads(line) for line in proc.stdout.splitlines())
    assert good["layout"] == "pp=2,dp=1,tp=2,zero=0,fp32"
    assert good["tokens_per_s"] > 0 and good["step_time_s"] > 0 and good["peak_mem_bytes"] > 0
    assert "zero_stage=1 cannot be combined with parallel.tp > 1" in bad["error"]


def test_shardline_train_runs_pipeline_with_tensor_parallel(tmp_path: Path) -> None:
    spec = small_spec(tmp_path)
    data = yaml.safe_load(spec.read_text())
    data["parallel"] = {"pp": 2, "tp": 2, "pp_schedule": "gpipe"}
    spec.write_text(yaml.safe_dump(data))
    out = tmp_path / "m.jsonl"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "shardline"), "train", str(spec),
         "--metrics-out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["layout"] == "pp=2,dp=1,tp=2,zero=0,fp32" and summary["steps"] == 4
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 4] and rows[-1]["loss"] == summary["final_loss"]
