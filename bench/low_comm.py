"""Train one model on real text with each gradient compression, with local SGD
(DiLoCo) and with asynchronous replicas, on the same ranks and the same samples, and print
one JSON line per mode: gradient bytes each rank sends per step (after any warm-up, and
over the whole run), wall time, the final validation loss, and the wall time until the
validation loss first reached the sync run's final one.

    .venv/bin/python -m bench.low_comm [--dp 4] [--steps 300]
        [--modes none,bf16,powersgd,local_sgd,local_sgd_bf16,async] [--rank 4] [--warmup 30]
        [--sync-every 16] [--outer-lr 0.7] [--outer-momentum 0.9] [--lr 3e-3]
        [--corpus workers] [--replica-batch 4] [--log-every 10] [--eval-every 20]
        [--slow-rank R --slow-factor 3] [--max-staleness 16] [--staleness-policy drop]
        [--async-steps N]

The corpus is byte-tokenized text (by default this project's engine source). Each line's
`val_loss_vs_none` is its final validation loss over the uncompressed (sync) run's, and
`s_to_sync_loss` the seconds from the start of the run until its validation loss (taken
every `--eval-every` steps) was at most the sync run's final one. `--slow-rank` makes that
rank `--slow-factor` times slower in every mode (it sleeps after each backward), and
`--async-steps` lets the async run train more steps than the others (more samples, its
schedule stretched to them), to see when it reaches the sync run's loss.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.launch import SlowRank, train_local

ROOT = Path(__file__).resolve().parents[1]


def parallel_for(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """`mode` is a grad_compression kind, or local_sgd (its delta in fp32 or bf16)."""
    if mode.startswith("local_sgd"):
        dtype = "bf16" if mode.endswith("_bf16") else "fp32"
        local = {
            "sync_every": args.sync_every,
            "delta_dtype": dtype,
            "outer_lr": args.outer_lr,
            "outer_momentum": args.outer_momentum,
        }
        return {"dp": args.dp, "dp_mode": "local_sgd", "local_sgd": local}
    if mode == "async":
        return {
            "dp": args.dp,
            "dp_mode": "async",
            "max_staleness": args.max_staleness,
            "staleness_policy": args.staleness_policy,
        }
    compression: dict[str, Any] = {"kind": mode}
    if mode == "powersgd":
        compression.update(rank=args.rank, warmup_steps=args.warmup)
    return {"dp": args.dp, "grad_compression": compression}


def spec_for(args: argparse.Namespace, mode: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": f"low-comm-{mode}",
            "model": {"preset": args.preset, "seq_len": 128},
            "data": {
                "source": "text",
                "path": str(Path(args.corpus).resolve()),
                "tokenizer": "byte",
                "val_fraction": 0.1,
            },
            "precision": "fp32",
            "parallel": parallel_for(args, mode),
            "train": {
                "steps": args.async_steps if mode == "async" and args.async_steps else args.steps,
                "global_batch_size": args.replica_batch * args.dp,
                "micro_batch_size": args.replica_batch,
                "lr": args.lr,
                "min_lr": args.lr / 10,
                "warmup_steps": 10,
                "log_every": args.log_every,
                "eval_every": args.eval_every,
                "seed": 1,
            },
        }
    )


def run_mode(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    metrics: list[dict[str, Any]] = []
    start = time.perf_counter()

    def seen(row: dict[str, Any]) -> None:
        metrics.append({**row, "wall_s": time.perf_counter() - start})

    slow = SlowRank(args.slow_rank, args.slow_factor) if args.slow_rank is not None else None
    summary = train_local(spec_for(args, mode), args.dp, on_metrics=seen, slow=slow)
    wall = time.perf_counter() - start
    # A logged step's grad_bytes is the mean over the steps since the one logged before.
    sent = [m["grad_bytes"] for m in metrics if m["step"] > 1]
    after = [
        m["grad_bytes"]
        for m in metrics
        if m["step"] > 1 and m["step"] - args.log_every >= args.warmup
    ]
    after = after if mode == "powersgd" else sent
    curve = [(m["wall_s"], m["val_loss"]) for m in metrics if "val_loss" in m]
    return {
        "mode": mode,
        "dp": args.dp,
        "steps": len(metrics),
        "grad_bytes_per_step": round(sum(after) / len(after)),
        "grad_bytes_per_step_whole_run": round(sum(sent) / len(sent)),
        "wall_s": round(wall, 1),
        "step_time_s": round(summary["step_time_s"], 4),
        "final_val_loss": round(metrics[-1]["val_loss"], 4),
        "val_curve": [(round(t, 1), round(v, 4)) for t, v in curve],
        **(
            {k: metrics[-1][k] for k in ("staleness_mean", "staleness_max")}
            | {"stale_dropped": sum(m["stale_dropped"] for m in metrics)}
            if mode == "async"
            else {}
        ),
    }


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--modes", default="none,bf16,powersgd")
    parser.add_argument("--rank", type=int, default=4, help="PowerSGD's approximation rank")
    parser.add_argument("--warmup", type=int, default=30, help="PowerSGD's plain steps")
    parser.add_argument("--sync-every", type=int, default=16, help="local SGD's inner steps")
    parser.add_argument("--outer-lr", type=float, default=0.7, help="local SGD's outer lr")
    parser.add_argument("--outer-momentum", type=float, default=0.9)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW's (the inner) peak lr")
    parser.add_argument("--corpus", default=str(ROOT / "workers"))
    parser.add_argument("--replica-batch", type=int, default=4, help="samples per replica per step")
    parser.add_argument("--log-every", type=int, default=10, help="also async's meetings")
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--slow-rank", type=int, default=None)
    parser.add_argument("--slow-factor", type=float, default=3.0)
    parser.add_argument("--max-staleness", type=int, default=16, help="async's")
    parser.add_argument("--staleness-policy", default="drop", help="async's: drop or weight")
    parser.add_argument("--async-steps", type=int, default=None, help="async's steps")
    args = parser.parse_args()
    lines = [run_mode(args, mode) for mode in args.modes.split(",")]
    base = next((line for line in lines if line["mode"] == "none"), None)
    for line in lines:
        if base is not None:
            line["bytes_vs_none"] = round(
                line["grad_bytes_per_step"] / base["grad_bytes_per_step"], 4
            )
            line["val_loss_vs_none"] = round(line["final_val_loss"] / base["final_val_loss"], 4)
            reached = [t for t, v in line["val_curve"] if v <= base["final_val_loss"]]
            line["s_to_sync_loss"] = reached[0] if reached else None
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
