"""`shardline plan`: every legal layout of a spec on N ranks, predicted and ranked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from shardline.api.cli.common import console, err_console, fail, read_spec
from shardline.service.config import DEFAULT_STATE_DIR
from shardline.workers.contract.planner import PlannedLayout
from shardline.workers.contract.rates import DEFAULT_RATES, Rates
from shardline.workers.contract.spec import JobSpec

DEFAULT_RATES_FILE = DEFAULT_STATE_DIR / "rates.json"
GIB = float(1 << 30)
AC_SHORT = {"none": "-", "selective": "sel", "full": "full"}


def plan(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC.yaml", help="Job spec file.")],
    ranks: Annotated[int, typer.Option("--ranks", min=1, max=4096, help="Ranks to plan for.")],
    gpus_per_node: Annotated[
        int | None,
        typer.Option("--gpus-per-node", min=1, help="Ranks per node (default: all on one)."),
    ] = None,
    device_memory: Annotated[
        int | None,
        typer.Option("--device-memory", min=1, help="Bytes a rank may use; others don't fit."),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            help=f"Default rates to start from: {', '.join(DEFAULT_RATES)} (default: cpu, or "
            "h100 for a spec that asks for GPUs).",
        ),
    ] = None,
    rates_file: Annotated[
        Path,
        typer.Option("--rates", help="Calibrated rates: read if present, written by --calibrate."),
    ] = DEFAULT_RATES_FILE,
    calibrate: Annotated[
        bool,
        typer.Option(
            "--calibrate", help="Measure this machine's rates for the spec's model first."
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON array, best first, every layout.")
    ] = False,
    top: Annotated[int, typer.Option("--top", min=1, help="Rows of the table.")] = 10,
) -> None:
    """Rank every legal layout of SPEC on N ranks by predicted step time."""
    from shardline.workers.contract.planner import plan as plan_layouts

    spec = read_spec(spec_path)
    rates, calibrated = _rates(spec, ranks, device, rates_file, calibrate)
    device_memory = device_memory or rates.device_memory  # a GPU kind's own, by default
    planned = plan_layouts(
        spec, ranks, rates, ranks_per_node=gpus_per_node, device_memory=device_memory
    )
    if not planned:
        raise fail(
            [
                f"{spec_path}: no legal layout on {ranks} ranks: dp x tp x pp must be {ranks}, "
                "with tp dividing the heads and vocabulary, pp the layers, and dp x "
                "micro_batch_size the global batch; try another --ranks"
            ]
        )
    if as_json:
        print(json.dumps([p.to_json() for p in planned]))
        return
    console.print(_table(planned[:top], rates, ranks))
    console.print("mb: micro-batch size; AC: activation checkpointing; GiB: peak per rank")
    fitting = sum(p.fits for p in planned)
    console.print(
        f"{len(planned)} legal layouts, {fitting} fit"
        + (f" in {device_memory / GIB:.1f} GiB" if device_memory else "")
        + f"; rates: {rates.device}"
        + (" (calibrated)" if calibrated else " (defaults; --calibrate measures)")
    )


def _rates(
    spec: JobSpec, ranks: int, device: str | None, rates_file: Path, calibrate: bool
) -> tuple[Rates, bool]:
    """The rates to plan with, and whether they were measured on this machine."""
    if device is not None and device not in DEFAULT_RATES:
        raise fail([f"--device {device!r}: use one of {', '.join(DEFAULT_RATES)}"])
    if calibrate:
        from shardline.workers.engine.calibrate import calibrate as measure

        err_console.print("calibrating: the model's rate, memory and all-reduce speed ...")
        rates = measure(spec, ranks)
        rates_file.parent.mkdir(parents=True, exist_ok=True)
        rates_file.write_text(json.dumps(rates.to_json(), indent=1))
        err_console.print(f"rates saved to {rates_file}")
        return rates, True
    if rates_file.exists() and device is None:
        try:
            return Rates.from_json(json.loads(rates_file.read_text())), True
        except (ValueError, TypeError) as err:
            raise fail(
                [f"{rates_file}: not a rates file ({err}); --calibrate rewrites it"]
            ) from None
    if device is None:
        device = "h100" if spec.resources.gpus_per_worker > 0 else "cpu"
    return DEFAULT_RATES[device], False


def _layout(p: PlannedLayout) -> str:
    """ "dp2 tp4 pp2/i2 z2 sp": the dimensions above 1, the schedule, ZeRO, SP."""
    par = p.spec.parallel
    parts = [f"{name}{size}" for name, size in (("dp", par.dp), ("tp", par.tp)) if size > 1]
    if par.pp > 1:
        schedule = {"gpipe": "g", "1f1b": "1f1b", "interleaved_1f1b": f"i{par.pp_virtual_stages}"}
        parts.append(f"pp{par.pp}/{schedule[par.pp_schedule.value]}")
    if par.dp > 1:
        parts.append(f"z{par.zero_stage}")
    if par.sequence_parallel:
        parts.append("sp")
    return " ".join(parts) or "one rank"


def _table(planned: list[PlannedLayout], rates: Rates, ranks: int) -> Table:
    table = Table(
        title=f"Layouts on {ranks} ranks ({rates.device}), fastest first",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    columns = ("#", "layout", "mb", "AC", "step s", "tokens/s", "GiB", "fits", "most")
    for column in columns:
        left = column in ("layout", "AC", "fits", "most")
        table.add_column(
            column, justify="left" if left else "right", no_wrap=True, min_width=len(column)
        )
    for i, p in enumerate(planned, start=1):
        pred = p.predicted
        times = {k: v for k, v in pred.terms.items() if k.endswith("_s")}
        largest = max(times, key=lambda k: times[k])
        table.add_row(
            str(i),
            _layout(p),
            str(p.spec.train.micro_batch_size),
            AC_SHORT[p.spec.train.activation_checkpointing.value],
            f"{pred.step_s:.4f}",
            f"{pred.tokens_per_s:,.0f}",
            f"{pred.peak_bytes_per_rank / GIB:.2f}",
            "yes" if p.fits else "no",
            largest.removesuffix("_s").replace("optimizer", "optim"),
        )
    return table
