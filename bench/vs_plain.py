"""The engine's step against the plainest PyTorch loop over the same model; one JSON line.

    .venv/bin/python -m bench.vs_plain examples/bench-1b.yaml [--steps 10] [--rounds 3]
        [--compile | --no-compile]

One rank, in one process, both sides alternating (engine, plain, engine, plain, ...) so
that a machine's drift lands on both. Each round times `--steps` steps after two
unmeasured ones by the wall clock, the device synchronised only at the round's ends.

- engine: `Trainer(spec, world_size=1).train_step()`, everything a `shardline train` step
  does (learning-rate schedule, clipping by the global norm, the loss read back, the
  breakdown on logged steps: `log_every` is raised past the run, as a job logs rarely);
- plain: the same `Transformer` on the device, `torch.autocast` in the spec's precision,
  AdamW (fused on a GPU), `torch.nn.utils.clip_grad_norm_`, the same batches, and each
  block compiled where the spec compiles (`torch.compile` per block, as torchtitan does).

`ratio` is engine over plain, the median round of each; the engine's budget is 1.03.
`ratio_logged` is the same engine with every step logged (`log_every: 1`, the default):
what a logged step adds (its memory count and step-time breakdown) on every step.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from bench.mfu import device_name
from shardline.workers.contract.net import free_port
from shardline.workers.contract.sections import MAX_STEPS
from shardline.workers.contract.spec import JobSpec, load_spec
from shardline.workers.engine.calibrate import seconds_per_call
from shardline.workers.engine.compiling import apply_compile
from shardline.workers.engine.data.loader import build_loader
from shardline.workers.engine.distributed import init_world, leave_world, pick_device
from shardline.workers.engine.models.llama.config import ModelArgs
from shardline.workers.engine.models.llama.model import Transformer
from shardline.workers.engine.precision import AUTOCAST_DTYPES
from shardline.workers.engine.trainer import Trainer


def bench_spec(spec: JobSpec, compile_blocks: bool | None, log_every: int) -> JobSpec:
    data = spec.model_dump(mode="json")
    data["train"].update(steps=MAX_STEPS, log_every=log_every, eval_every=0)
    if compile_blocks is not None:
        data["train"]["compile"] = compile_blocks
    data["checkpoint"] = {"every_steps": 0}
    return JobSpec.model_validate(data)


class PlainLoop:
    """What a user would write by hand for the same model, data and optimizer."""

    def __init__(
        self, spec: JobSpec, device: torch.device, dp_rank: int = 0, dp_size: int = 1
    ) -> None:
        self.spec, self.device = spec, device
        torch.manual_seed(spec.train.seed)
        with torch.device(device):
            self.model = Transformer(ModelArgs.from_resolved(spec.model.resolved()))
        if spec.train.compile:
            apply_compile(self.model)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=spec.train.lr,
            weight_decay=spec.train.weight_decay,
            fused=device.type == "cuda",
        )
        self.loader = build_loader(spec, dp_rank=dp_rank, dp_size=dp_size)
        self.dtype = AUTOCAST_DTYPES.get(spec.precision)
        self.step = 0

    def train_step(self) -> torch.Tensor:
        """One optimizer step; returns its mean loss, on the device (not read back)."""
        self.step += 1
        rows = self.loader.train_batch(self.step).tokens.to(self.device)
        micro = self.spec.train.micro_batch_size
        n = rows.shape[0] // micro
        total = torch.zeros((), device=self.device)
        for chunk in rows.split(micro):
            with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
                logits = self.model(chunk[:, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten()) / n
            loss.backward()
            total += loss.detach()
        if self.spec.train.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.train.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total


def measure(spec: JobSpec, logged: JobSpec, steps: int, rounds: int) -> dict[str, Any]:
    device = pick_device(0)
    init_world(
        rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(), device=device
    )
    try:
        sides: dict[str, Callable[[], Any]] = {
            "engine": Trainer(spec, world_size=1, device=device).train_step,
            "plain": PlainLoop(spec, device).train_step,
            # Every step logged (the spec default, log_every 1): memory and breakdown too.
            "engine_logged": Trainer(logged, world_size=1, device=device).train_step,
        }
        times: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(rounds):
            for side, step in sides.items():
                times[side].append(seconds_per_call(step, steps, device, warmup=2))
    finally:
        leave_world()
    medians = {side: statistics.median(values) for side, values in times.items()}
    return {
        "bench": "vs_plain",
        "spec": spec.name,
        "device": device_name(),
        "compile": spec.train.compile,
        "precision": spec.precision.value,
        "steps_per_round": steps,
        "step_s": times,
        "ratio": medians["engine"] / medians["plain"],
        "ratio_logged": medians["engine_logged"] / medians["plain"],
    }


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--compile", dest="compile_blocks", action=argparse.BooleanOptionalAction, default=None
    )
    args = parser.parse_args()
    spec = load_spec(args.spec)
    quiet = bench_spec(spec, args.compile_blocks, log_every=MAX_STEPS)
    logged = bench_spec(spec, args.compile_blocks, log_every=1)
    print(json.dumps(measure(quiet, logged, args.steps, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
