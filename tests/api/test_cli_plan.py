"""`shardline plan` as a user runs it: a table, --json, --calibrate, and mistakes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from shardline.api.cli.app import app
from shardline.workers.contract.spec import JobSpec

RUNNER = CliRunner()


def write_spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "plan-me",
                "model": {"preset": "tiny", "seq_len": 64},
                "train": {"steps": 10, "global_batch_size": 8, "micro_batch_size": 2},
            }
        )
    )
    return path


def test_json_items_drop_into_the_spec(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    rates = str(tmp_path / "none.json")
    result = RUNNER.invoke(app, ["plan", str(spec), "--ranks", "4", "--json", "--rates", rates])
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)
    assert items[0]["predicted"]["step_s"] <= items[-1]["predicted"]["step_s"]
    base = yaml.safe_load(spec.read_text())
    for item in items[:20]:
        layout = JobSpec.model_validate(
            {**base, "parallel": item["parallel"], "train": {**base["train"], **item["train"]}}
        )
        assert layout.parallel.world_size == 4


def test_calibrate_measures_saves_and_is_used_next_time(tmp_path: Path) -> None:
    spec, rates = write_spec(tmp_path), tmp_path / "rates.json"
    # In a process of its own: calibration builds a model, resizes torch's thread pool and
    # starts rank processes, none of which this test process should keep until its exit.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardline.api.cli",
            "plan",
            str(spec),
            "--ranks",
            "2",
            "--calibrate",
            "--rates",
            str(rates),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    saved = json.loads(rates.read_text())
    assert saved["device"] == "cpu" and saved["flops_per_s"] > 0 and saved["cores"] >= 1
    assert saved["bandwidth"]["intra"] > 0 and saved["runtime_bytes"] > 0
    again = RUNNER.invoke(app, ["plan", str(spec), "--ranks", "2", "--rates", str(rates)])
    assert again.exit_code == 0, again.output
    assert "Layouts on 2 ranks (cpu)" in again.stdout and "(calibrated)" in again.stdout


def test_mistakes_are_one_line_errors(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    rates = str(tmp_path / "none.json")
    seven = RUNNER.invoke(app, ["plan", str(spec), "--ranks", "7", "--rates", rates])
    assert seven.exit_code == 2 and "no legal layout on 7 ranks" in seven.output
    tpu = RUNNER.invoke(app, ["plan", str(spec), "--ranks", "4", "--device", "tpu"])
    assert tpu.exit_code == 2 and "--device 'tpu': use one of cpu" in tpu.output
    (tmp_path / "bad.json").write_text("{}")
    bad = RUNNER.invoke(
        app, ["plan", str(spec), "--ranks", "4", "--rates", str(tmp_path / "bad.json")]
    )
    assert bad.exit_code == 2 and "not a rates file" in bad.output
    assert "Traceback" not in seven.output + tpu.output + bad.output
