"""The service's step against Ray Train's `TorchTrainer` training the same model, one run.

    .venv/bin/python -m bench.vs_ray_train [SPEC.yaml]   (needs `pip install "ray[train]"`)

- Ray Train: a `TorchTrainer` with one CPU worker per rank (its own local Ray cluster,
  gloo), each running what a user would write for it: the plain loop of
  `bench/vs_plain.py` (the same `Transformer`, AdamW, clipping and batches: the rank's
  data-parallel share) with the model wrapped by `ray.train.torch.prepare_model` (DDP),
  timing each step and reporting the times once at the end.
- The service: the same spec through `shardline serve` on its embedded defaults (rank 0's
  own step times, as `bench.service_overhead` reads them).

Prints one JSON line: each side's mean step over the second half of its run (once what
starts beside the first steps is done; the service's by the time its logged steps ended,
so unlogged steps count too) and their ratio, service over Ray Train. The default spec is
pure data parallelism on 2 ranks (zero_stage 0: what DDP does), one micro-batch a rank,
every step logged (the spec's default); `log_every` in a spec given changes that.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import yaml

from bench.service_overhead import late, through_service
from workers.contract.spec import JobSpec, load_spec

log = logging.getLogger(__name__)

SPEC: dict[str, Any] = {
    "name": "vs-ray-train",
    "model": {"preset": "tiny", "seq_len": 128},
    "data": {"source": "synthetic"},
    "parallel": {"dp": 2, "zero_stage": 0},
    "precision": "fp32",
    "train": {
        "steps": 400,
        "global_batch_size": 8,
        "micro_batch_size": 4,
        "lr": 3e-3,
        "log_every": 1,
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
    for _ in range(spec.train.steps):
        started = time.perf_counter()
        loop.train_step()
        step_times.append(time.perf_counter() - started)
    # Ray Train keeps a report's metrics only with a checkpoint: rank 0 writes its times
    # where the driver reads them (one machine).
    if context.get_world_rank() == 0:
        Path(config["times_file"]).write_text(json.dumps(step_times))
    ray.train.report({"steps": len(step_times)})


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


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", nargs="?", type=Path, help="a job spec (default: SPEC here)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shardline-bench-") as folder:
        if args.spec is not None:
            spec_path = args.spec
        else:
            spec_path = Path(folder) / "spec.yaml"
            spec_path.write_text(yaml.safe_dump(SPEC))
        spec = load_spec(spec_path)
        ray_train = through_ray_train(spec)
        service = through_service(spec_path)
    # The second half's mean step by each side's clock: every step, logged or not.
    half = ray_train[len(ray_train) // 2 :]
    ray_train_mean = sum(half) / len(half)
    service_mean = service["late_span_step_s"]
    if service_mean is None:
        raise RuntimeError("the service's metrics say no time: too few logged steps")
    print(
        json.dumps(
            {
                "bench": "vs_ray_train",
                "spec": spec.name,
                "world_size": spec.parallel.world_size,
                "log_every": spec.train.log_every,
                "service_late_step_s": round(service_mean, 4),
                "ray_train_late_step_s": round(ray_train_mean, 4),
                "ratio": round(service_mean / ray_train_mean, 3),
                # Logged steps only (all of them where log_every is 1): median, each side.
                "service_logged_step_median_s": round(service["late_step_time_s"], 4),
                "ray_train_step_median_s": round(late(ray_train), 4),
                "service_submit_to_first_step_s": round(service["submit_to_first_step_s"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
