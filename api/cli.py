"""The `shardline` command line."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from workers.spec import JobSpec, describe_errors, load_spec

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Shardline: train large language models on your own cluster.")
err_console = Console(stderr=True)


@app.callback()
def _root() -> None:
    """Shardline: train large language models on your own cluster."""


def _fail(lines: list[str], code: int = 2) -> typer.Exit:
    for line in lines:
        err_console.print(f"[red]error:[/red] {line}", highlight=False)
    return typer.Exit(code)


def read_spec(path: Path) -> JobSpec:
    """Load a spec file, turning every problem into a readable error and exit code 2."""
    try:
        return load_spec(path)
    except FileNotFoundError:
        raise _fail([f"{path}: no such file"]) from None
    except ValidationError as err:
        raise _fail([f"{path}: {line}" for line in describe_errors(err)]) from None
    except (ValueError, OSError) as err:  # YAML syntax errors are ValueErrors
        raise _fail([f"{path}: {err}"]) from None


@app.command()
def train(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC.yaml", help="Job spec file.")],
    nproc: Annotated[int | None, typer.Option(
        "--nproc", min=1, help="Processes to run (default: dp*tp*pp from the spec).")] = None,
    metrics_out: Annotated[Path | None, typer.Option(
        "--metrics-out", help="Write one JSON object per logged step to this file.")] = None,
) -> None:
    """Train a spec on this machine without Ray (gloo on CPU, NCCL on GPU)."""
    from workers.engine.launch import TrainingFailed, train_local, train_under_torchrun

    spec = read_spec(spec_path)
    metrics_file = metrics_out.open("w", encoding="utf-8") if metrics_out else None
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun else (nproc or
                                                                   spec.parallel.world_size)
    try:
        spec.check_world_size(world)
    except ValueError as err:
        raise _fail([str(err)]) from None

    summary: dict[str, Any] = {}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total} {task.fields[status]}"),
                  TimeElapsedColumn(), console=err_console, transient=False,
                  disable=under_torchrun and os.environ["RANK"] != "0") as progress:
        task = progress.add_task(spec.name, total=spec.train.steps, status="starting")

        def on_metrics(m: dict[str, Any]) -> None:
            if metrics_file is not None:
                metrics_file.write(json.dumps(m, sort_keys=True) + "\n")
                metrics_file.flush()
            status = f"loss {m['loss']:.4f}  {m['tokens_per_s']:.0f} tok/s"
            if "val_loss" in m:
                status += f"  val {m['val_loss']:.4f}"
            progress.update(task, completed=m["step"], status=status)

        try:
            if under_torchrun:
                def report(kind: str, payload: Any) -> None:
                    if kind == "metrics":
                        on_metrics(payload)
                    elif kind == "summary":
                        summary.update(payload)
                train_under_torchrun(spec, report)
            else:
                summary.update(train_local(spec, world, on_metrics=on_metrics))
        except TrainingFailed as err:
            raise _fail([str(err)], code=1) from None
        finally:
            if metrics_file is not None:
                metrics_file.close()
    if summary:
        typer.echo(json.dumps(summary, sort_keys=True))


def main() -> None:
    logging.basicConfig(level=os.environ.get("SHARDLINE_LOG_LEVEL", "WARNING"),
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    app()


if __name__ == "__main__":
    main()
