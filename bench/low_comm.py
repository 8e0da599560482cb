"""Train one model on real text with each gradient compression, and with local SGD
(DiLoCo), on the same ranks and the same samples, and print one JSON line per mode:
gradient bytes each rank sends per step (after any warm-up, and over the whole run), wall
time, and the final validation loss.

    .venv/bin/python -m bench.low_comm [--dp 4] [--steps 300]
        [--modes none,bf16,powersgd,local_sgd,local_sgd_bf16] [--rank 4] [--warmup 30]
        [--sync-every 16] [--outer-lr 0.7] [--outer-momentum 0.9] [--lr 3e-3]
        [--corpus workers] [--replica-batch 4]

The corpus is byte-tokenized text (by default this project's engine source). Each line's
`val_loss_vs_none` is its final validation loss over the uncompressed run's.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

from workers.contract.spec import JobSpec
from workers.engine.launch import train_local

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
                "steps": args.steps,
                "global_batch_size": args.replica_batch * args.dp,
                "micro_batch_size": args.replica_batch,
                "lr": args.lr,
                "min_lr": args.lr / 10,
                "warmup_steps": 10,
                "log_every": 1,
                "eval_every": args.steps,
                "seed": 1,
            },
        }
    )


def run_mode(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    metrics: list[dict[str, Any]] = []
    start = time.perf_counter()
    summary = train_local(spec_for(args, mode), args.dp, on_metrics=metrics.append)
    wall = time.perf_counter() - start
    sent = [m["grad_bytes"] for m in metrics]
    after = sent[args.warmup :] if mode == "powersgd" else sent
    return {
        "mode": mode,
        "dp": args.dp,
        "steps": len(metrics),
        "grad_bytes_per_step": round(sum(after) / len(after)),
        "grad_bytes_per_step_whole_run": round(sum(sent) / len(sent)),
        "wall_s": round(wall, 1),
        "step_time_s": round(summary["step_time_s"], 4),
        "final_val_loss": round(metrics[-1]["val_loss"], 4),
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
    args = parser.parse_args()
    lines = [run_mode(args, mode) for mode in args.modes.split(",")]
    base = next((line for line in lines if line["mode"] == "none"), None)
    for line in lines:
        if base is not None:
            line["bytes_vs_none"] = round(
                line["grad_bytes_per_step"] / base["grad_bytes_per_step"], 4
            )
            line["val_loss_vs_none"] = round(line["final_val_loss"] / base["final_val_loss"], 4)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
