"""bench/plan_accuracy.py on two layouts: calibrated here, measured here, compared."""

from __future__ import annotations

import math

import json
import subprocess
import sys
from pathlib import Path

import yaml

from bench.plan_accuracy import spearman

ROOT = Path(__file__).resolve().parents[2]


def test_spearman_is_the_rank_correlation() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert spearman([1, 1, 2], [5, 5, 9]) == 1.0  # ties share their mean rank


def test_two_layouts_are_predicted_and_measured(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "accuracy",
                # Wide enough that FSDP's resident surplus is a fifth of its peak.
                "model": {"preset": "tiny", "dim": 256, "n_heads": 8, "n_kv_heads": 4,
                          "seq_len": 64},
                "train": {"steps": 5, "global_batch_size": 8, "micro_batch_size": 2},
            }
        )
    )
    # As a user runs it, in a process of its own (calibration resizes torch's thread pool
    # and starts rank processes: nothing this test process should keep until its exit).
    proc = subprocess.run(
        [sys.executable, "-m", "bench.plan_accuracy", str(spec), "--layouts", "dp=2,zero=3",
         "pp=2"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [row["layout"] for row in result["layouts"]] == [
        "pp=1,dp=2,tp=1,zero=3,fp32",
        "pp=2,dp=1,tp=1,zero=0,fp32",
    ]
    # Model state is exact arithmetic; the peak within the 15% on a CPU, FSDP too.
    assert result["max_model_state_error"] < 0.05
    assert result["max_peak_error"] < 0.15, result["layouts"]
    assert result["regret"] >= 1.0 and not math.isnan(result["spearman"])
    assert result["rates"]["cores"] >= 1 and result["rates"]["activation_scale"] >= 1.0
