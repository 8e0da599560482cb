"""Tokens/s, MFU and peak memory of one spec on the devices present; one JSON line.

    .venv/bin/python -m bench.mfu examples/bench-1b.yaml [--steps N] [--compile | --no-compile]

The spec runs as `shardline train` would (one process per rank, `parallel`'s world size),
on the GPUs when there are any, else on the CPU (then `device` says cpu and MFU is null:
there is no peak to compare with). Figures are the steady state, after the first steps.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

import torch

from shardline.workers.contract.spec import JobSpec, load_spec
from shardline.workers.engine.launch import train_local


def device_name() -> str:
    if not torch.cuda.is_available():
        return "cpu"
    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"


def with_overrides(spec: JobSpec, steps: int | None, compile_blocks: bool | None) -> JobSpec:
    data = spec.model_dump(mode="json")
    if steps is not None:
        data["train"]["steps"] = steps
        data["train"]["warmup_steps"] = min(data["train"]["warmup_steps"], steps)
    if compile_blocks is not None:
        data["train"]["compile"] = compile_blocks
    return JobSpec.model_validate(data)


def measure(spec: JobSpec) -> dict[str, Any]:
    logged: list[dict[str, Any]] = []
    summary = train_local(spec, spec.parallel.world_size, on_metrics=logged.append)
    return {
        "bench": "mfu",
        "spec": spec.name,
        "device": device_name(),
        "layout": summary["layout"],
        "parameters": spec.model.parameter_count(),
        "seq_len": spec.model.resolved()["seq_len"],
        "global_batch_size": spec.train.global_batch_size,
        "compile": spec.train.compile,
        "steps": summary["steps"],
        "tokens_per_s": summary["tokens_per_s"],
        "step_time_s": summary["step_time_s"],
        "mfu": summary["mfu"],
        "peak_mem_bytes": summary["peak_mem_bytes"],
        "final_loss": summary["final_loss"],
        # Where the last logged step's time went, per rank (CUDA events on a GPU).
        "breakdown": logged[-1].get("breakdown") if logged else None,
    }


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument(
        "--compile",
        dest="compile_blocks",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="override train.compile",
    )
    args = parser.parse_args()
    spec = with_overrides(load_spec(args.spec), args.steps, args.compile_blocks)
    print(json.dumps(measure(spec)), flush=True)


if __name__ == "__main__":
    main()
