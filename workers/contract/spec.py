"""The JobSpec: what a user asks Shardline to train.

Pure pydantic on purpose: the SDK and the API import this module, and it must not pull in
torch or ray. Every rule that can be checked without running anything is checked here, and
each failure names the field and says what to change.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Self

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from workers.contract.presets import PRESETS, ffn_hidden_dim

# Upper bounds keep absurd requests (a typo's extra zeros) out with a clear message
# instead of an out-of-memory crash hours later.
MAX_DEGREE = 4096
MAX_STEPS = 100_000_000
# About 8x the largest open models: beyond this a spec is a typo, not a plan.
MAX_PARAMETERS = 4 * 10**12
# Tokens in one micro-batch (activations scale with it) and in one optimizer step.
MAX_MICRO_BATCH_TOKENS = 1 << 22
MAX_GLOBAL_BATCH_TOKENS = 1 << 30
# data.tokenizer's value for "the tokenizer.json beside model.init_from".
INIT_FROM = "init_from"


class _Strict(BaseModel):
    # allow_inf_nan=False: JSON has no Infinity or NaN, and a spec must survive the
    # database and every reader of it (one unreadable spec once stopped all scheduling).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _text_is_storable(cls, value: Any) -> Any:
        """Strings must encode as UTF-8 and hold no NUL: the database, JSON responses and
        file paths all need that, so such a value is refused here and never stored."""
        if isinstance(value, str):
            if "\x00" in value:
                raise ValueError("contains a NUL character; remove it")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as err:
                raise ValueError(
                    f"is not valid Unicode text (a lone surrogate at position {err.start}); "
                    "remove that character"
                ) from None
        return value


class DataSource(StrEnum):
    synthetic = "synthetic"
    text = "text"
    tokens = "tokens"


class PipelineSchedule(StrEnum):
    gpipe = "gpipe"
    one_f_one_b = "1f1b"
    interleaved_1f1b = "interleaved_1f1b"


class Precision(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class ActivationCheckpointing(StrEnum):
    none = "none"
    full = "full"
    selective = "selective"


class ModelSpec(_Strict):
    """A preset, with any field overriding it."""

    preset: str = "tiny"
    dim: Annotated[int, Field(ge=8, le=65536)] | None = None
    n_layers: Annotated[int, Field(ge=1, le=1024)] | None = None
    n_heads: Annotated[int, Field(ge=1, le=1024)] | None = None
    n_kv_heads: Annotated[int, Field(ge=1, le=1024)] | None = None
    vocab_size: Annotated[int, Field(ge=2, le=1_048_576)] | None = None
    seq_len: Annotated[int, Field(ge=2, le=1_048_576)] | None = None
    # Shape details a Hugging Face config.json carries (None: the preset's rule/defaults).
    ffn_dim: Annotated[int, Field(ge=1, le=1_048_576)] | None = None
    norm_eps: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    rope_theta: Annotated[float, Field(gt=0.0, le=1e12)] | None = None
    # A Hugging Face Llama folder (config.json + *.safetensors) to start from; the shape
    # is read from its config.json (workers/contract/hf_config.py) when the job is submitted.
    init_from: Annotated[str, Field(min_length=1, max_length=4096)] | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.preset not in PRESETS:
            raise ValueError(
                f"model.preset={self.preset!r} is unknown; choose one of {', '.join(PRESETS)}"
            )
        r = self.resolved()
        if r["dim"] % r["n_heads"]:
            raise ValueError(
                f"model.dim={r['dim']} is not divisible by model.n_heads={r['n_heads']}"
            )
        if (r["dim"] // r["n_heads"]) % 2:
            raise ValueError(
                f"model.dim / model.n_heads = {r['dim'] // r['n_heads']} must be even "
                "(rotary embeddings rotate pairs of channels)"
            )
        if r["n_kv_heads"] > r["n_heads"] or r["n_heads"] % r["n_kv_heads"]:
            raise ValueError(
                f"model.n_kv_heads={r['n_kv_heads']} must divide model.n_heads={r['n_heads']}"
            )
        return self

    def resolved(self) -> dict[str, Any]:
        """The preset's values with this spec's overrides applied, plus the MLP width."""
        preset = PRESETS[self.preset]
        out: dict[str, Any] = {}
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"):
            value = getattr(self, name)
            out[name] = getattr(preset, name) if value is None else value
        out["ffn_dim"] = self.ffn_dim or ffn_hidden_dim(
            out["dim"], preset.ffn_multiplier, preset.ffn_multiple_of
        )
        # Only where given (init_from): otherwise ModelArgs' defaults apply.
        for name in ("norm_eps", "rope_theta"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    def parameter_count(self) -> int:
        """Parameters of the model (untied input and output embeddings, as the engine
        builds it)."""
        r = self.resolved()
        kv_dim = r["n_kv_heads"] * (r["dim"] // r["n_heads"])
        attention = 2 * r["dim"] * r["dim"] + 2 * r["dim"] * kv_dim
        mlp = 3 * r["dim"] * r["ffn_dim"]
        per_layer = attention + mlp + 2 * r["dim"]
        return 2 * r["vocab_size"] * r["dim"] + r["n_layers"] * per_layer + r["dim"]


class DataSpec(_Strict):
    source: DataSource = DataSource.synthetic
    path: str | None = None
    tokenizer: str = "byte"
    val_fraction: Annotated[float, Field(ge=0.0, le=0.5)] = 0.05

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.source != DataSource.synthetic and not self.path:
            raise ValueError(
                f"data.path is required when data.source={self.source.value!r}; "
                "give a file or folder of text, or a .bin of token ids"
            )
        if self.source == DataSource.tokens and self.tokenizer != "byte":
            raise ValueError(
                "data.tokenizer does not apply to data.source='tokens' (already tokenized); "
                "remove it"
            )
        return self


class ParallelSpec(_Strict):
    dp: Annotated[int, Field(ge=1, le=MAX_DEGREE)] = 1
    tp: Annotated[int, Field(ge=1, le=MAX_DEGREE)] = 1
    pp: Annotated[int, Field(ge=1, le=MAX_DEGREE)] = 1
    zero_stage: Annotated[int, Field(ge=0, le=3)] = 0
    pp_schedule: PipelineSchedule = PipelineSchedule.one_f_one_b
    pp_virtual_stages: Annotated[int, Field(ge=1, le=64)] = 1
    sequence_parallel: bool = False
    # bf16 jobs at zero_stage 2/3: FSDP gathers bf16 parameters (half the bytes) and
    # reduces gradients in fp32; the shards stay fp32. Ignored elsewhere.
    fsdp_mixed_precision: bool = True

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @model_validator(mode="after")
    def _check(self) -> Self:
        interleaved = self.pp_schedule == PipelineSchedule.interleaved_1f1b
        if interleaved and self.pp_virtual_stages < 2:
            raise ValueError(
                "parallel.pp_schedule='interleaved_1f1b' needs parallel.pp_virtual_stages >= 2"
            )
        if not interleaved and self.pp_virtual_stages > 1:
            raise ValueError(
                f"parallel.pp_virtual_stages={self.pp_virtual_stages} needs "
                "parallel.pp_schedule='interleaved_1f1b'; set it to 1 or change the schedule"
            )
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("parallel.sequence_parallel needs parallel.tp > 1")
        return self


class TrainSpec(_Strict):
    steps: Annotated[int, Field(ge=1, le=MAX_STEPS)] = 100
    global_batch_size: Annotated[int, Field(ge=1, le=1_048_576)] = 8
    micro_batch_size: Annotated[int, Field(ge=1, le=1_048_576)] = 2
    lr: Annotated[float, Field(gt=0.0, le=10.0)] = 3e-4
    min_lr: Annotated[float, Field(ge=0.0, le=10.0)] = 3e-5
    warmup_steps: Annotated[int, Field(ge=0, le=MAX_STEPS)] = 0
    weight_decay: Annotated[float, Field(ge=0.0, le=10.0)] = 0.1
    grad_clip: Annotated[float, Field(ge=0.0, le=1e6)] = 1.0
    activation_checkpointing: ActivationCheckpointing = ActivationCheckpointing.none
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    log_every: Annotated[int, Field(ge=1, le=MAX_STEPS)] = 1
    eval_every: Annotated[int, Field(ge=0, le=MAX_STEPS)] = 0
    # torch.compile each transformer block (first steps pay for compiling).
    compile: bool = False
    # Fused AdamW kernels where the device has them (CUDA); same update, fewer launches.
    fused_optimizer: bool = True

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.min_lr > self.lr:
            raise ValueError(f"train.min_lr={self.min_lr} is above train.lr={self.lr}")
        if self.warmup_steps > self.steps:
            raise ValueError(
                f"train.warmup_steps={self.warmup_steps} exceeds train.steps={self.steps}"
            )
        return self


class CheckpointSpec(_Strict):
    every_steps: Annotated[int, Field(ge=0, le=MAX_STEPS)] = 0
    keep_last: Annotated[int, Field(ge=1, le=1000)] = 2
    async_save: bool = False
    # In-memory snapshots (0: off): host memory on the node, outliving the worker process;
    # a worker's death then costs at most this many steps (workers/storage/snapshots.py).
    memory_every_steps: Annotated[int, Field(ge=0, le=MAX_STEPS)] = 0


class ResumeFromSpec(_Strict):
    """Start from a checkpoint of another job (yours), in this job's layout."""

    job_id: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9]+$")]
    step: Annotated[int, Field(ge=1, le=MAX_STEPS)] | None = None  # None: its newest


class ElasticSpec(_Strict):
    """Go on with fewer data-parallel ranks (down to `min_dp`) when a node is lost."""

    min_dp: Annotated[int, Field(ge=1, le=MAX_DEGREE)] = 1


class FaultToleranceSpec(_Strict):
    max_failures: Annotated[int, Field(ge=0, le=1000)] = 3
    hang_timeout_s: Annotated[float, Field(gt=0.0, le=86400.0)] = 600.0
    # A step whose loss is not finite rolls back to the newest snapshot and skips that
    # step's batch, at most this many times in the job's life (0: fail at once).
    max_nonfinite_skips: Annotated[int, Field(ge=0, le=1000)] = 3
    elastic: ElasticSpec | None = None


class ResourcesSpec(_Strict):
    gpus_per_worker: Annotated[float, Field(ge=0.0, le=64.0)] = 0.0
    # A rank below a tenth of a CPU would only time out its collectives.
    cpus_per_worker: Annotated[float, Field(ge=0.1, le=1024.0)] = 1.0


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
        if elastic is not None and elastic.min_dp > par.dp:
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
    """Read a JobSpec from a YAML or JSON file."""
    text = Path(path).read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a job spec is a mapping of fields, got {type(data).__name__}")
    return JobSpec.model_validate(data)


def describe_errors(err: ValidationError) -> list[str]:
    """One readable line per validation error: the field path, then what is wrong."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(part) for part in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{loc}: {msg}" if loc else msg)
    return lines
