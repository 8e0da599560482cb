"""bench/layouts.py prints one JSON line per layout; `shardline train` runs pp x tp."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.layouts import parse_layout
from tests.dist.runs import run
from shardline.workers.contract.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
STEPS, BATCH, SEQ_LEN = 4, 8, 32
TOKENS_PER_STEP = BATCH * SEQ_LEN


def small_spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "bench",
                "model": {"preset": "tiny", "seq_len": SEQ_LEN},
                "train": {
                    "steps": STEPS,
                    "global_batch_size": BATCH,
                    "micro_batch_size": 2,
                    "log_every": 2,
                    "warmup_steps": 1,
                },
            }
        )
    )
    return path


def test_parse_layout_uses_spec_names() -> None:
    assert parse_layout("pp=2,v=2,sched=interleaved_1f1b,sp=1,tp=2") == {
        "pp": 2,
        "pp_virtual_stages": 2,
        "pp_schedule": "interleaved_1f1b",
        "sequence_parallel": True,
        "tp": 2,
    }


def test_bench_prints_one_line_per_layout(tmp_path: Path) -> None:
    spec = small_spec(tmp_path)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.layouts", str(spec), "pp=2,tp=2", "tp=3"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    good, bad = (json.loads(line) for line in proc.stdout.splitlines())
    assert good["layout"] == "pp=2,dp=1,tp=2,zero=0,fp32"
    # The figures describe this run: tokens/s is the step's tokens over its time, a step
    # took less than the whole command, and the layout trained like one process.
    assert good["tokens_per_s"] == pytest.approx(TOKENS_PER_STEP / good["step_time_s"], rel=1e-2)
    assert 0 < good["step_time_s"] < elapsed / STEPS
    metrics, one_process = run(load_spec(spec))
    assert good["final_loss"] == pytest.approx(one_process["final_loss"], rel=1e-4)
    # pp=2 x tp=2 splits the model state four ways (embeddings and norms are not split).
    whole = sum(metrics[-1]["mem_bytes"].values())
    assert 0.2 * whole < good["model_state_bytes"] <= 0.55 * whole
    assert good["peak_mem_bytes"] > good["model_state_bytes"]
    # a layout the spec refuses gets its error line, and the others still run
    assert "parallel.tp=3 must divide model.n_heads=4" in bad["error"]


def test_shardline_train_runs_pipeline_with_tensor_parallel(tmp_path: Path) -> None:
    spec = small_spec(tmp_path)
    data = yaml.safe_load(spec.read_text())
    data["parallel"] = {"pp": 2, "tp": 2, "pp_schedule": "gpipe"}
    spec.write_text(yaml.safe_dump(data))
    out = tmp_path / "m.jsonl"
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "shardline"),
            "train",
            str(spec),
            "--metrics-out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["layout"] == "pp=2,dp=1,tp=2,zero=0,fp32" and summary["steps"] == 4
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 4]
    # pp x tp trains like one process: every logged step and the summary agree with it.
    reference, _ = run(load_spec(small_spec(tmp_path)))
    assert [r["loss"] for r in rows] == pytest.approx([m["loss"] for m in reference], rel=1e-4)
    assert summary["final_loss"] == pytest.approx(reference[-1]["loss"], rel=1e-4)
