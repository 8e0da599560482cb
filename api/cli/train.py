"""`shardline train`: the engine on this machine, without Ray or a server."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from shardline.api.cli.common import err_console, fail, read_spec, step_progress
from shardline.api.cli.hf import resolve_local_init_from
from shardline.workers.contract.spec import JobSpec


def train(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC.yaml", help="Job spec file.")],
    nproc: Annotated[
        int | None,
        typer.Option("--nproc", min=1, help="Processes to run (default: dp*tp*pp from the spec)."),
    ] = None,
    metrics_out: Annotated[
        Path | None,
        typer.Option("--metrics-out", help="Write one JSON object per logged step to this file."),
    ] = None,
    checkpoint_dir: Annotated[
        str | None,
        typer.Option(
            "--checkpoint-dir",
            help="Save checkpoints here (a folder or an fsspec URL such as s3://bucket/run): "
            "every checkpoint.every_steps, at the last step and when stopped.",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="Continue from the newest good checkpoint in --checkpoint-dir."
        ),
    ] = False,
    stop_after_step: Annotated[
        int | None,
        typer.Option(
            "--stop-after-step",
            min=1,
            help="Stop after this step (saving a checkpoint); --resume continues.",
        ),
    ] = None,
) -> None:
    """Train a spec on this machine without Ray (gloo on CPU, NCCL on GPU)."""
    from shardline.workers.engine.launch import (
        LocalCheckpoints,
        TrainingFailed,
        exit_rank_process,
        train_local,
        train_under_torchrun,
    )

    spec = resolve_local_init_from(read_spec(spec_path))
    if spec.parallel.auto:
        spec = _auto_layout(spec, nproc)
    if resume and not checkpoint_dir:
        raise fail(["--resume needs --checkpoint-dir (the folder to continue from)"])
    local = LocalCheckpoints(checkpoint_dir, resume, stop_after_step)
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun else (nproc or spec.parallel.world_size)
    try:
        spec.check_world_size(world)
    except ValueError as err:
        raise fail([str(err)]) from None
    metrics_file = metrics_out.open("w", encoding="utf-8") if metrics_out else None

    summary: dict[str, Any] = {}
    with step_progress(disable=under_torchrun and os.environ["RANK"] != "0") as progress:
        task = progress.add_task(spec.name, total=spec.train.steps, status="starting")

        def on_metrics(m: dict[str, Any]) -> None:
            if metrics_file is not None:
                metrics_file.write(json.dumps(m, sort_keys=True) + "\n")
                metrics_file.flush()
            status = f"loss {m['loss']:.4f}  {m['tokens_per_s']:.0f} tok/s"
            if "val_loss" in m:
                status += f"  val {m['val_loss']:.4f}"
            progress.update(task, completed=m["step"], status=status)

        def report(kind: str, payload: Any) -> None:
            if kind == "metrics":
                on_metrics(payload)
            elif kind == "event":
                progress.console.print(payload)
            elif kind == "summary":
                summary.update(payload)

        try:
            if under_torchrun:
                train_under_torchrun(spec, report, local)
            else:
                summary.update(
                    train_local(
                        spec,
                        world,
                        on_metrics=on_metrics,
                        local=local,
                        on_event=lambda message: progress.console.print(message),
                    )
                )
        except TrainingFailed as err:
            raise fail([str(err)], code=1) from None
        finally:
            if metrics_file is not None:
                metrics_file.close()
    if summary:
        typer.echo(json.dumps(summary, sort_keys=True))
    if under_torchrun:
        exit_rank_process(0)


def _auto_layout(spec: JobSpec, nproc: int | None) -> JobSpec:
    """`parallel: auto` here: the fastest predicted layout on exactly the ranks that run
    (torchrun's world, else `--nproc`, else one per GPU, else one)."""
    import torch

    from shardline.service.layout_planning import NoLayout, pick_layout
    from shardline.workers.contract.rates import DEFAULT_RATES
    from shardline.workers.engine.calibrate import device_kind

    gpus = torch.cuda.device_count()
    # Under torchrun the world is its own (all nodes); else --nproc, one per GPU, or one.
    ranks = int(os.environ.get("WORLD_SIZE", 0)) or nproc or gpus or 1
    rates = DEFAULT_RATES[device_kind(torch.device("cuda", 0)) if gpus else "cpu"]
    try:
        chosen, event = pick_layout(spec, [ranks], rates)
    except NoLayout as err:
        raise fail([str(err)]) from None
    if int(os.environ.get("RANK", 0)) == 0:
        err_console.print(event.message)
    return chosen
