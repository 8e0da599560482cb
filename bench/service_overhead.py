"""The same spec through the service (REST -> Ray actors) and through `shardline train`.

Prints one JSON line: both steady-state step times (as rank 0 measures them), their ratio,
the ratio of their second halves' medians (once what starts beside a job's first steps is
done), the time from submit to the first completed step, and both runs' wall-clock times.

    .venv/bin/python -m bench.service_overhead [SPEC.yaml]
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean, median
from typing import Any

from bench.first_start import run_to_end
from shardline.api.local_service import local_service
from shardline.workers.contract.spec import load_spec
from shardline.workers.engine.launch import train_local

log = logging.getLogger(__name__)

DEFAULT_SPEC = Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"


def steady(step_times: list[float]) -> float:
    """Mean step time without the first two steps (allocation, warm-up)."""
    return mean(step_times[2:] if len(step_times) > 3 else step_times)


def late_span(rows: list[dict[str, Any]]) -> float | None:
    """Mean step time over the second half by the clock: the seconds between the logged
    step halfway and the last over the steps between (every step, logged or not; rows
    carry when their step ended). None where rows say no time."""
    half = rows[len(rows) // 2]
    if rows[-1]["step"] <= half["step"] or "time" not in half:
        return None
    return float(rows[-1]["time"] - half["time"]) / (rows[-1]["step"] - half["step"])


def late(step_times: list[float]) -> float:
    """Median step time of the second half: what a long job's steps cost once what starts
    beside its first steps (the service's warm spares importing torch) is done."""
    return median(step_times[len(step_times) // 2 :])


# Once the first step shows, the job is polled as its page polls it: a poller at 10 Hz
# for the whole run took 2% of a 2-core machine from the job it measured.
THEN_POLL_S = 2.0


def through_service(
    spec_path: Path, server_src: Path | None = None, settle_s: float = 0.0
) -> dict[str, Any]:
    """The spec through `shardline serve` (of `server_src`: another checkout, if given),
    submitted `settle_s` after the server answers (a warm service: its pool filled)."""
    with (
        tempfile.TemporaryDirectory(prefix="shardline-bench-") as state,
        local_service(Path(state), server_src=server_src) as svc,
        svc.client() as client,
    ):
        time.sleep(settle_s)
        submitted = time.monotonic()
        job = client.submit(spec_path)
        current, first_step_s = run_to_end(
            client, job["id"], submitted, poll_s=0.1, then_poll_s=THEN_POLL_S
        )
        wall_s = time.monotonic() - submitted
        if current["state"] != "SUCCEEDED":
            raise RuntimeError(f"job ended {current['state']}: {current['failure_reason']}")
        rows = client.metrics(job["id"])
    return {
        "step_time_s": steady([r["step_time_s"] for r in rows]),
        "late_step_time_s": late([r["step_time_s"] for r in rows]),
        "late_span_step_s": late_span(rows),
        "submit_to_first_step_s": first_step_s,
        "wall_s": wall_s,
        "final_loss": rows[-1]["loss"],
    }


def through_train(spec_path: Path) -> dict[str, Any]:
    spec = load_spec(spec_path)
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    summary = train_local(spec, spec.parallel.world_size, on_metrics=rows.append)
    return {
        "step_time_s": steady([r["step_time_s"] for r in rows]),
        "late_step_time_s": late([r["step_time_s"] for r in rows]),
        "wall_s": time.monotonic() - started,
        "final_loss": summary["final_loss"],
    }


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    spec_path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SPEC
    train = through_train(spec_path)
    service = through_service(spec_path)
    print(
        json.dumps(
            {
                "spec": str(spec_path),
                "service_step_time_s": round(service["step_time_s"], 4),
                "train_step_time_s": round(train["step_time_s"], 4),
                "step_time_ratio": round(service["step_time_s"] / train["step_time_s"], 3),
                "late_step_time_ratio": round(
                    service["late_step_time_s"] / train["late_step_time_s"], 3
                ),
                "submit_to_first_step_s": round(service["submit_to_first_step_s"], 2),
                "service_wall_s": round(service["wall_s"], 2),
                "train_wall_s": round(train["wall_s"], 2),
                "same_final_loss": abs(service["final_loss"] - train["final_loss"])
                <= 1e-5 * abs(train["final_loss"]),
            }
        )
    )


if __name__ == "__main__":
    main()
