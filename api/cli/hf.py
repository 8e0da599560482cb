"""`shardline export` and `shardline generate`: Hugging Face folders out, text out.

Both import torch only inside the command (the CLI module itself is part of the control
plane, which never imports torch).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from shardline.api.cli.common import TokenOption, UrlOption, api_errors, client, console, fail
from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.hf_config import InitFromError, resolve_init_from
from shardline.workers.contract.spec import JobSpec, describe_errors


def resolve_local_init_from(spec: JobSpec) -> JobSpec:
    """For commands that run on this machine: the shape read from `model.init_from`."""
    try:
        return resolve_init_from(spec, DataAccess())
    except ValidationError as err:
        raise fail(describe_errors(err)) from None
    except (InitFromError, OSError) as err:
        raise fail([str(err)]) from None


def export(
    checkpoint: Annotated[
        Path | None,
        typer.Argument(
            metavar="[CHECKPOINT]",
            help="A checkpoint folder (checkpoints/step-<n>); or use --job.",
        ),
    ] = None,
    out_dir: Annotated[Path | None, typer.Argument(metavar="OUT_DIR")] = None,
    job: Annotated[
        str | None, typer.Option("--job", help="Export this job's checkpoint through the API.")
    ] = None,
    step: Annotated[
        int | None, typer.Option("--step", min=1, help="With --job: this step (default newest).")
    ] = None,
    max_shard_gb: Annotated[
        float, typer.Option("--max-shard-gb", min=0.001, help="Split weights above this size.")
    ] = 5.0,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Write a checkpoint as a Hugging Face folder of its family (config.json, safetensors,
    tokenizer): `shardline export CHECKPOINT OUT_DIR` or `shardline export --job ID OUT_DIR`."""
    if job is not None:
        # With --job the one positional argument is the output folder.
        target = out_dir or checkpoint
        if target is None or (out_dir is not None and checkpoint is not None):
            raise fail(["with --job give only OUT_DIR: shardline export --job ID OUT_DIR"])
        _export_through_api(job, step, target, url, token)
        return
    if checkpoint is None or out_dir is None:
        raise fail(["give CHECKPOINT and OUT_DIR, or --job ID and OUT_DIR"])
    if step is not None:
        raise fail(["--step goes with --job; a CHECKPOINT folder is one step already"])
    from shardline.workers.engine.hf_export import ExportError, export_checkpoint

    try:
        summary = export_checkpoint(
            str(checkpoint), out_dir, max_shard_bytes=int(max_shard_gb * 1024**3)
        )
    except (ExportError, OSError, KeyError, ValidationError) as err:
        raise fail([f"{checkpoint}: {err}"]) from None
    console.print(f"exported step {summary['step']} to {out_dir}: {', '.join(summary['files'])}")


def _export_through_api(
    job_id: str, step: int | None, out_dir: Path, url: str | None, token: str | None
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shardline-export-") as tmp:
        archive = Path(tmp) / "model.zip"
        with api_errors(), client(url, token) as c:
            c.export(job_id, archive, step=step)
        with zipfile.ZipFile(archive) as zf:
            for member in zf.infolist():
                name = Path(member.filename).name  # flat folder: never a path out of OUT_DIR
                with zf.open(member) as src, (out_dir / name).open("wb") as dst:
                    shutil.copyfileobj(src, dst)
            names = [Path(m.filename).name for m in zf.infolist()]
    console.print(f"exported job {job_id} to {out_dir}: {', '.join(names)}")


# `shardline generate` samples unless told --greedy: greedy decoding of a small model
# soon repeats itself. Seeded, so the same command gives the same text.
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_P = 0.95


def generate(
    ctx: typer.Context,
    model: Annotated[
        Path, typer.Argument(metavar="MODEL", help="An exported folder or a checkpoint folder.")
    ],
    prompt: Annotated[str, typer.Option("--prompt", help="The text to continue.")],
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 64,
    greedy: Annotated[
        bool,
        typer.Option(
            "--greedy",
            help="Always take the most likely token instead of sampling (deterministic; "
            "small models tend to repeat themselves).",
        ),
    ] = False,
    temperature: Annotated[
        float,
        typer.Option(
            "--temperature",
            min=1e-4,
            help="Sampling temperature: lower stays closer to the most likely tokens.",
        ),
    ] = DEFAULT_TEMPERATURE,
    top_p: Annotated[
        float,
        typer.Option(
            "--top-p",
            min=1e-4,
            max=1.0,
            help="Nucleus sampling: only the most likely tokens that together hold this "
            "probability mass.",
        ),
    ] = DEFAULT_TOP_P,
    seed: Annotated[
        int,
        typer.Option("--seed", help="Seed of the sampler: the same seed gives the same text."),
    ] = 0,
    device: Annotated[
        str | None, typer.Option("--device", help="cpu or cuda (default: cuda if present).")
    ] = None,
    ids: Annotated[
        bool, typer.Option("--ids", help="Print the new token ids as JSON instead of text.")
    ] = False,
) -> None:
    """Continue a prompt with a trained model, in this process, with a KV cache. Samples
    (temperature 0.8, top-p 0.95, seeded by --seed) unless --greedy is given."""
    # Given on the command line (or otherwise not left at the default). By the enum's
    # name: typer may bring a click of its own, whose ParameterSource is another class.
    given = [
        f"--{name.replace('_', '-')}"
        for name in ("temperature", "top_p")
        if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") != "DEFAULT"
    ]
    if greedy and given:
        raise fail([f"--greedy does not sample: drop {' and '.join(given)}"])
    import torch

    from shardline.workers.engine.generate import Sampling
    from shardline.workers.engine.generate import generate as run_generate
    from shardline.workers.engine.local_model import load_local_model

    where = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        loaded = load_local_model(model, where)
    except (OSError, ValueError, KeyError) as err:
        raise fail([f"{model}: {err}"]) from None
    sampling = Sampling(greedy=greedy, temperature=temperature, top_p=top_p, seed=seed)
    prompt_ids = loaded.codec.encode(prompt)
    if not prompt_ids:
        raise fail(["--prompt is empty; give some text"])
    new = run_generate(
        loaded.model,
        prompt_ids,
        family=loaded.family,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        eos_token_id=loaded.eos_token_id,
    )
    if ids:
        typer.echo(json.dumps({"prompt_ids": prompt_ids, "new_ids": new}))
    else:
        typer.echo(prompt + loaded.codec.decode(new))
