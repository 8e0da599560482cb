"""The JobSpec: what a user asks Shardline to train.

Pure pydantic on purpose: the SDK and the API import this module, and it must not pull in
torch or ray. Every rule that can be checked without running anything is checked here (the
sections alone in workers/contract/sections.py, how they fit together below), and each
failure names the field and says what to change.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import Field, ValidationError, field_validator, model_validator

from shardline.workers.contract.dp_modes import async_problem, local_sgd_problem
from shardline.workers.contract.grad_compression import GradCompressionKind
from shardline.workers.contract.sections import (
    INIT_FROM,
    MAX_GLOBAL_BATCH_TOKENS,
    MAX_MICRO_BATCH_TOKENS,
    MAX_PARAMETERS,
    CheckpointSpec,
    DataSource,
    DataSpec,
    FaultToleranceSpec,
    ModelSpec,
    ParallelSpec,
    PipelineSchedule,
    Precision,
    ResourcesSpec,
    ResumeFromSpec,
    TrainSpec,
    _Strict,
)
from shardline.workers.contract.spec_errors import explain, parse_spec_text


class JobSpec(_Strict):
    """A training job: model, data, layout, precision, schedule and fault-tolerance."""

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][\w.\-]*$")]
    priority: Annotated[int, Field(ge=-1000, le=1000)] = 0
    model: ModelSpec = ModelSpec()
    data: DataSpec = DataSpec()
    parallel: ParallelSpec = ParallelSpec()
    precision: Precision = Precision.fp32
    train: TrainSpec = TrainSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    resume_from: ResumeFromSpec | None = None
    fault_tolerance: FaultToleranceSpec = FaultToleranceSpec()
    resources: ResourcesSpec = ResourcesSpec()

    @field_validator("parallel", mode="before")
    @classmethod
    def _auto_layout(cls, value: object) -> object:
        """`parallel: auto` is `parallel: {auto: true}`."""
        return {"auto": True} if value == "auto" else value

    @model_validator(mode="after")
    def _check_layout(self) -> Self:
        m = self.model.resolved()
        par, tr = self.parallel, self.train
        stages = par.pp * par.pp_virtual_stages
        if m["n_layers"] % stages:
            what = (
                "parallel.pp"
                if par.pp_virtual_stages == 1
                else ("parallel.pp x parallel.pp_virtual_stages")
            )
            raise ValueError(
                f"model.n_layers={m['n_layers']} is not divisible by {what}={stages}; "
                "change the layer count or the number of pipeline stages"
            )
        if m["n_heads"] % par.tp or m["n_kv_heads"] % par.tp:
            raise ValueError(
                f"parallel.tp={par.tp} must divide model.n_heads={m['n_heads']} and "
                f"model.n_kv_heads={m['n_kv_heads']} (each tensor-parallel rank holds whole heads)"
            )
        if m["vocab_size"] % par.tp:
            raise ValueError(
                f"model.vocab_size={m['vocab_size']} is not divisible by parallel.tp={par.tp}; "
                "round the vocabulary up to a multiple of tp"
            )
        per_step = tr.micro_batch_size * par.dp
        if tr.global_batch_size % per_step:
            raise ValueError(
                f"train.global_batch_size={tr.global_batch_size} is not divisible by "
                f"train.micro_batch_size x parallel.dp = {tr.micro_batch_size} x {par.dp} = "
                f"{per_step}; make it a multiple of {per_step}"
            )
        if par.pp > 1 and self.accumulation_steps < par.pp:
            raise ValueError(
                f"with parallel.pp={par.pp} the pipeline needs at least {par.pp} micro-batches "
                f"per step but train.global_batch_size / (micro_batch_size x dp) = "
                f"{self.accumulation_steps}; raise global_batch_size or lower micro_batch_size"
            )
        interleaved = par.pp_schedule == PipelineSchedule.interleaved_1f1b
        if par.pp > 1 and interleaved and self.accumulation_steps % par.pp:
            raise ValueError(
                f"with parallel.pp_schedule='interleaved_1f1b' the micro-batches per step "
                f"({self.accumulation_steps}) must be a multiple of parallel.pp={par.pp}; "
                "change global_batch_size or micro_batch_size"
            )
        elastic = self.fault_tolerance.elastic
        if elastic is not None and elastic.min_dp > par.dp and not par.auto:
            raise ValueError(
                f"fault_tolerance.elastic.min_dp={elastic.min_dp} is above parallel.dp="
                f"{par.dp}; the job can only shrink: set min_dp <= dp"
            )
        micro_tokens = tr.micro_batch_size * m["seq_len"]
        if micro_tokens > MAX_MICRO_BATCH_TOKENS:
            raise ValueError(
                f"train.micro_batch_size x model.seq_len = {tr.micro_batch_size} x "
                f"{m['seq_len']} = {micro_tokens} tokens per micro-batch, above "
                f"{MAX_MICRO_BATCH_TOKENS}; lower micro_batch_size (accumulation keeps the "
                "global batch)"
            )
        step_tokens = tr.global_batch_size * m["seq_len"]
        if step_tokens > MAX_GLOBAL_BATCH_TOKENS:
            raise ValueError(
                f"train.global_batch_size x model.seq_len = {step_tokens} tokens per step, "
                f"above {MAX_GLOBAL_BATCH_TOKENS}; lower global_batch_size"
            )
        params = self.model.parameter_count()
        if params > MAX_PARAMETERS:
            raise ValueError(
                f"model.dim, model.n_layers and model.vocab_size give {params:.3g} parameters, "
                f"above {MAX_PARAMETERS:.0g}; use a smaller model"
            )
        if (
            self.data.source == DataSource.text
            and self.data.tokenizer == "byte"
            and (m["vocab_size"] < 256)
        ):
            raise ValueError(
                f"model.vocab_size={m['vocab_size']} is too small for data.tokenizer='byte'; "
                "it needs at least 256"
            )
        return self

    @model_validator(mode="after")
    def _check_compression(self) -> Self:
        # fp16 overflows now and then by design (the loss scaler skips those steps), and
        # PowerSGD's error feedback would carry the inf into every later step.
        if (
            self.precision == Precision.fp16
            and self.parallel.grad_compression.kind == GradCompressionKind.powersgd
        ):
            raise ValueError(
                "parallel.grad_compression.kind='powersgd' cannot take precision 'fp16': an "
                "overflowed step would poison its error feedback; use bf16 or fp32"
            )
        problem = local_sgd_problem(self) or async_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _check_evaluation(self) -> Self:
        if self.train.eval_every > 0 and self.data.val_fraction == 0:
            raise ValueError(
                f"train.eval_every={self.train.eval_every} evaluates on held-out data, but "
                "data.val_fraction=0 holds out none; set val_fraction above 0 (e.g. 0.05) "
                "or eval_every to 0"
            )
        return self

    @model_validator(mode="after")
    def _check_init_from(self) -> Self:
        if self.data.tokenizer == INIT_FROM and self.model.init_from is None:
            raise ValueError(
                "data.tokenizer='init_from' needs model.init_from (the folder whose "
                "tokenizer.json to use); set it or name a tokenizer file"
            )
        return self

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step on each data-parallel rank."""
        return self.train.global_batch_size // (self.train.micro_batch_size * self.parallel.dp)

    def check_world_size(self, world_size: int) -> None:
        """Raise ValueError unless the layout uses exactly `world_size` processes."""
        par = self.parallel
        if par.world_size != world_size:
            raise ValueError(
                f"parallel: dp*tp*pp = {par.dp}*{par.tp}*{par.pp} = {par.world_size} but the job "
                f"runs on {world_size} processes; make the product {world_size} or run "
                f"{par.world_size} processes"
            )


def spec_hash(spec: JobSpec) -> str:
    """sha256 of the spec's canonical JSON (sorted keys, no spaces): the same spec gives
    the same hash in the API's idempotency check and in every checkpoint's manifest."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def load_spec(path: str | Path) -> JobSpec:
    """Read a JobSpec from a YAML or JSON file. Relative paths in it (data, tokenizer,
    chat template, model folder) are read from the file's folder, as compose reads a
    compose file's, whatever folder the command runs in."""
    text = Path(path).read_text(encoding="utf-8")
    data = parse_spec_text(text, path)
    return JobSpec.model_validate(paths_from(data, Path(path).absolute().parent))


def _is_file_name(field: str, value: str) -> bool:
    """Whether a spec value names a file (not `byte`, `init_from`, a URL or a template's
    own text)."""
    if field == "tokenizer":
        return value not in ("byte", INIT_FROM)
    if field == "chat_template":
        return value.endswith(".jinja") and "{" not in value
    return "://" not in value


_PATH_FIELDS = (
    ("data", "path"),
    ("data", "tokenizer"),
    ("data", "chat_template"),
    ("model", "init_from"),
)


def paths_from(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """`data` (a spec's mapping) with each relative file name made absolute from
    `folder`."""
    out = dict(data)
    for section, field in _PATH_FIELDS:
        values = out.get(section)
        if not isinstance(values, dict):
            continue
        value = values.get(field)
        if not isinstance(value, str) or not value or Path(value).is_absolute():
            continue
        if _is_file_name(field, value):
            out[section] = {**values, field: os.path.normpath(folder / value)}
    return out


def describe_errors(err: ValidationError) -> list[str]:
    """One readable line per validation error: the field path, then what is wrong."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(part) for part in e["loc"])
        msg = explain(dict(e), e["loc"], JobSpec)
        lines.append(f"{loc}: {msg}" if loc else msg)
    return lines
