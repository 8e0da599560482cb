"""The service's step against Ray Train's `TorchTrainer` training the same model, one run.

    .venv/bin/python -m bench.vs_ray_train [SPEC.yaml] [--rounds N] [--settle-s S]
        [--against OTHER_CHECKOUT ...]          (needs `pip install "ray[train]"`)

- Ray Train: a `TorchTrainer` with one CPU worker per rank (its own local Ray cluster,
  gloo), each running what a user would write for it: the plain loop of
  `bench/vs_plain.py` (the same `Transformer`, AdamW, clipping and batches: the rank's
  data-parallel share) with the model wrapped by `ray.train.torch.prepare_model` (DDP),
  reporting the loss with `ray.train.report` on the steps the service logs, and timing
  each step with its report.
- The service: the same spec through `shardline serve` on its embedded defaults (its
  rank 0's metrics), submitted `--settle-s` after the server answers (a warm service:
  its pool filled), polled as the page polls once the first step shows. `--against`
  also runs the service from other checkouts (before and after a change, in one run).

Each round runs Ray Train, then the service from each checkout. One JSON line per service
run: the second half's mean step by each side's clock (every step, logged or not; the
service's: the time between its logged steps' ends over the steps between) and their
ratio, service over Ray Train; the last line has each checkout's median ratio. The
default spec is pure data parallelism on 2 ranks (zero_stage 0: what DDP does), one
micro-batch a rank, logged every 50 steps, 1000 steps.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any, cast

import yaml

from bench.service_overhead import through_service
from shardline.workers.contract.spec import JobSpec, load_spec

log = logging.getLogger(__name__)

SPEC: dict[str, Any] = {
    "name": "vs-ray-train",
    "model": {"preset": "tiny", "seq_len": 128},
    "data": {"source": "synthetic"},
    "parallel": {"dp": 2, "zero_stage": 0},
    "precision": "fp32",
    "train": {
        # Long enough that the second half is steadier: the job's warm spares and the
        # pool's replacements start (at the lowest priority) once it trains, and on 2
        # busy cores took 40 s and more to import torch.
        "steps": 1000,
        "global_batch_size": 8,
        "micro_batch_size": 4,
        "lr": 3e-3,
        # Both sides report on the same steps. Ray Train's report() waits for its
        # controller, which takes one every 2 s: reporting every step held each step there.
        "log_every": 50,
    },
}


def ray_train_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: the plain loop over its share of the batches, DDP-wrapped."""
    import ray.train
    import ray.train.torch
    import torch

    from bench.vs_plain import PlainLoop

    torch.set_num_threads(1)
    spec = JobSpec.model_validate_json(config["spec"])
    context = ray.train.get_context()
    loop = PlainLoop(
        spec,
        torch.device("cpu"),
        dp_rank=context.get_world_rank(),
        dp_size=context.get_world_size(),
    )
    loop.model = cast(Any, ray.train.torch.prepare_model(loop.model))
    step_times = []
    total = spec.train.steps
    for step in range(1, total + 1):
        started = time.perf_counter()
        loss = loop.train_step()
        # Its metrics reported on the steps the service logs (the loss read back on each),
        # as a user of Ray Train reports them: each step's time includes its report.
        if step % spec.train.log_every == 0 or step in (1, total):
            ray.train.report({"step": step, "loss": float(loss)})
        step_times.append(time.perf_counter() - started)
    # Ray Train keeps a report's metrics only with a checkpoint: rank 0 writes its times
    # where the driver reads them (one machine).
    if context.get_world_rank() == 0:
        Path(config["times_file"]).write_text(json.dumps(step_times))


def through_ray_train(spec: JobSpec) -> list[float]:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    world = spec.parallel.world_size
    with tempfile.TemporaryDirectory(prefix="shardline-bench-") as storage:
        times = Path(storage) / "step_times.json"
        ray.init(num_cpus=world + 2, include_dashboard=False, log_to_driver=False)
        try:
            trainer = TorchTrainer(
                ray_train_loop,
                train_loop_config={"spec": spec.model_dump_json(), "times_file": str(times)},
                scaling_config=ScalingConfig(num_workers=world, use_gpu=False),
                run_config=RunConfig(storage_path=storage, name="vs-ray-train"),
            )
            result = trainer.fit()
        finally:
            ray.shutdown()
        if result.error is not None or not times.exists():
            raise RuntimeError(f"the Ray Train run failed: {result.error}")
        step_times: list[float] = json.loads(times.read_text())
    return step_times


def service_row(
    spec: JobSpec, spec_path: Path, ray_train_mean: float, src: Path | None, settle_s: float
) -> dict[str, Any]:
    service = through_service(spec_path, server_src=src, settle_s=settle_s)
    service_mean = service["late_span_step_s"]
    if service_mean is None:
        raise RuntimeError("the service's metrics say no time: too few logged steps")
    return {
        "bench": "vs_ray_train",
        "server_src": str(src) if src is not None else "this checkout",
        "service_late_step_s": round(service_mean, 4),
        "ray_train_late_step_s": round(ray_train_mean, 4),
        "ratio": round(service_mean / ray_train_mean, 3),
        "service_submit_to_first_step_s": round(service["submit_to_first_step_s"], 2),
    }


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", nargs="?", type=Path, help="a job spec (default: SPEC here)")
    parser.add_argument(
        "--against",
        type=Path,
        action="append",
        default=[],
        help="also run the service from this checkout (before/after in one run); repeatable",
    )
    parser.add_argument("--rounds", type=int, default=1, help="Ray Train, then each service")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=20.0,
        help="seconds a service runs before the job is submitted (a warm service)",
    )
    args = parser.parse_args()
    ratios: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="shardline-bench-") as folder:
        if args.spec is not None:
            spec_path = args.spec
        else:
            spec_path = Path(folder) / "spec.yaml"
            spec_path.write_text(yaml.safe_dump(SPEC))
        spec = load_spec(spec_path)
        for _ in range(args.rounds):
            ray_train = through_ray_train(spec)
            # The second half's mean step by each side's clock: every step, logged or not.
            half = ray_train[len(ray_train) // 2 :]
            ray_train_mean = sum(half) / len(half)
            for src in [None, *args.against]:
                row = service_row(spec, spec_path, ray_train_mean, src, args.settle_s)
                ratios.setdefault(row["server_src"], []).append(row["ratio"])
                print(json.dumps(row), flush=True)
    print(
        json.dumps(
            {
                "bench": "vs_ray_train",
                "spec": spec.name,
                "world_size": spec.parallel.world_size,
                "steps": spec.train.steps,
                "log_every": spec.train.log_every,
                "median_ratio": {src: round(median(r), 3) for src, r in ratios.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
