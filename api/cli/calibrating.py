"""`shardline calibrate`: measure the cluster's rates through the server (administrators),
so `parallel: auto` and `POST /v1/plan` plan with them instead of the defaults."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from shardline.api.cli.common import TokenOption, UrlOption, api_errors, client, console, fail

POLL_S = 1.0
TIMEOUT_S = 900.0


def calibrate(
    spec_path: Annotated[
        Path | None, typer.Argument(help="Whose model to measure (default: the tiny preset).")
    ] = None,
    ranks: Annotated[
        int, typer.Option("--ranks", min=2, help="Processes the all-reduces are timed among.")
    ] = 2,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Measure the cost model's rates on a cluster node and store them in the server."""
    with api_errors(), client(url, token) as c:
        c.calibrate(spec_path, ranks=ranks)
        deadline = time.monotonic() + TIMEOUT_S
        with console.status("calibrating: the model's rate, memory and all-reduce speed ..."):
            while (answer := c.cluster_rates())["calibration"]["state"] == "running":
                if time.monotonic() > deadline:
                    raise fail(["the calibration is still running; see GET /v1/cluster/rates"])
                time.sleep(POLL_S)
    state = answer["calibration"]
    if state["state"] != "done":
        raise fail([f"the calibration failed: {state['message']}"])
    for stored in answer["stored"]:
        if stored["kind"] != state["kind"]:
            continue
        rates = stored["rates"]
        console.print(
            f"{stored['kind']} rates stored {stored['measured_at'][:19]}: "
            f"{rates['flops_per_s'] / 1e9:,.1f} GFLOP/s per rank, "
            f"all-reduce {rates['bandwidth']['intra'] / 1e9:,.2f} GB/s within a node, "
            f"latency {rates['latency_s'] * 1e3:.2f} ms"
        )
