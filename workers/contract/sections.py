"""The sections of a JobSpec (model, data, parallel, train, checkpoint, resume_from,
fault_tolerance, resources), each checked on its own; workers/contract/spec.py checks
how they fit together.

Pure pydantic: no torch, no Ray. Every failure names the field and says what to change.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from shardline.workers.contract.grad_compression import GradCompression, GradCompressionKind
from shardline.workers.contract.local_sgd import DataParallelMode, LocalSgd, StalenessPolicy
from shardline.workers.contract.presets import PRESETS, ffn_hidden_dim
from shardline.workers.contract.strict import _Strict
from shardline.workers.engine.models.registry import FAMILIES, family_config

# Upper bounds keep absurd requests (a typo's extra zeros) out with a clear message
# instead of an out-of-memory crash hours later.
MAX_DEGREE = 4096
MAX_STEPS = 10_000_000
# About 8x the largest open models: beyond this a spec is a typo, not a plan.
MAX_PARAMETERS = 4 * 10**12
# Tokens in one micro-batch (activations scale with it) and in one optimizer step.
MAX_MICRO_BATCH_TOKENS = 1 << 22
MAX_GLOBAL_BATCH_TOKENS = 1 << 30
# data.tokenizer's value for "the tokenizer.json beside model.init_from".
INIT_FROM = "init_from"


class DataSource(StrEnum):
    synthetic = "synthetic"
    text = "text"
    tokens = "tokens"
    # JSON Lines, Parquet or a `datasets` folder: one document or conversation per record.
    records = "records"


class RecordFormat(StrEnum):
    # A document in `text_field`, every token in the loss.
    text = "text"
    # A conversation in `messages_field`, rendered with the model's chat template; the loss
    # on the assistant's turns only unless `train_on_prompt`.
    chat = "chat"


class Overflow(StrEnum):
    """What happens to a conversation longer than model.seq_len + 1 tokens."""

    truncate = "truncate"
    drop = "drop"


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


class RopeScaling(_Strict):
    """Rotary frequencies stretched for a longer context, as transformers computes them:
    `llama3` (Llama 3.1-3.3: low frequencies divided by `factor`, high ones kept, those
    between blended) or `linear` (every position divided by `factor`)."""

    rope_type: Literal["llama3", "linear"]
    factor: Annotated[float, Field(gt=0.0, le=1024.0)]
    low_freq_factor: Annotated[float, Field(gt=0.0)] | None = None
    high_freq_factor: Annotated[float, Field(gt=0.0)] | None = None
    original_max_position_embeddings: Annotated[int, Field(ge=1, le=1 << 24)] | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        llama3 = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        given = [k for k in llama3 if getattr(self, k) is not None]
        if self.rope_type == "llama3" and len(given) < len(llama3):
            missing = ", ".join(f"model.rope_scaling.{k}" for k in llama3 if k not in given)
            raise ValueError(f"model.rope_scaling.rope_type='llama3' needs {missing}")
        if self.rope_type == "linear" and given:
            raise ValueError(
                f"model.rope_scaling.{given[0]} applies to rope_type 'llama3' only; remove it"
            )
        if (
            self.rope_type == "llama3"
            and self.high_freq_factor is not None
            and self.low_freq_factor is not None
            and self.high_freq_factor <= self.low_freq_factor
        ):
            raise ValueError(
                "model.rope_scaling.high_freq_factor must be above low_freq_factor "
                f"({self.high_freq_factor} <= {self.low_freq_factor})"
            )
        return self


class ModelSpec(_Strict):
    """A preset, with any field overriding it."""

    preset: str = "tiny"
    # The model family (workers/engine/models/registry.py); None: the preset's. Set from
    # init_from's config.json when a job is submitted.
    family: str | None = None
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
    # Channels per attention head; None: dim / n_heads (Qwen3 and Mistral Nemo differ).
    head_dim: Annotated[int, Field(ge=2, le=4096)] | None = None
    # The output head is the token embedding (one tensor, trained once); None: the preset's.
    tie_embeddings: bool | None = None
    rope_scaling: RopeScaling | None = None
    # Each position attends to at most this many (itself included); None: all before it.
    sliding_window: Annotated[int, Field(ge=1, le=1 << 24)] | None = None
    # A Hugging Face folder (config.json + *.safetensors) to start from; the family and
    # shape are read from its config.json (workers/contract/hf_config.py) when the job is
    # submitted.
    init_from: Annotated[str, Field(min_length=1, max_length=4096)] | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.preset not in PRESETS:
            raise ValueError(
                f"model.preset={self.preset!r} is unknown; choose one of {', '.join(PRESETS)}"
            )
        if self.family is not None and self.family not in FAMILIES:
            raise ValueError(
                f"model.family={self.family!r} is unknown; choose one of {', '.join(FAMILIES)}"
            )
        r = self.resolved()
        if self.head_dim is None and r["dim"] % r["n_heads"]:
            raise ValueError(
                f"model.dim={r['dim']} is not divisible by model.n_heads={r['n_heads']}; "
                "change one, or give model.head_dim"
            )
        if r["head_dim"] % 2:
            what = "model.head_dim" if self.head_dim else "model.dim / model.n_heads"
            raise ValueError(
                f"{what} = {r['head_dim']} must be even "
                "(rotary embeddings rotate pairs of channels)"
            )
        if r["n_kv_heads"] > r["n_heads"] or r["n_heads"] % r["n_kv_heads"]:
            raise ValueError(
                f"model.n_kv_heads={r['n_kv_heads']} must divide model.n_heads={r['n_heads']}"
            )
        return self

    @property
    def family_name(self) -> str:
        """The family this model builds: `family`, or its preset's."""
        return self.family or PRESETS[self.preset].family

    def resolved(self) -> dict[str, Any]:
        """Everything the model's shape needs (the family's args): the preset's values
        with this spec's overrides applied, the MLP width, and what the family fixes
        (biases on q/k/v, norms on q/k)."""
        preset = PRESETS[self.preset]
        out: dict[str, Any] = {}
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"):
            value = getattr(self, name)
            out[name] = getattr(preset, name) if value is None else value
        out["ffn_dim"] = (
            self.ffn_dim
            or preset.ffn_dim
            or ffn_hidden_dim(out["dim"], preset.ffn_multiplier, preset.ffn_multiple_of)
        )
        out["head_dim"] = self.head_dim or preset.head_dim or out["dim"] // out["n_heads"]
        # Only where given (init_from, a preset): otherwise the args' defaults apply.
        for name in ("norm_eps", "rope_theta"):
            value = getattr(self, name)
            if value is None:
                value = getattr(preset, name)
            if value is not None:
                out[name] = value
        tie = self.tie_embeddings
        out["tie_embeddings"] = preset.tie_embeddings if tie is None else tie
        if self.rope_scaling is not None:
            out["rope_scaling"] = self.rope_scaling.model_dump()
        elif preset.rope_scaling is not None:
            out["rope_scaling"] = dict(preset.rope_scaling)
        if self.sliding_window is not None:
            out["sliding_window"] = self.sliding_window
        out.update(family_config(self.family_name).fixed_args)
        return out

    def parameter_count(self) -> int:
        """Parameters of the model as the engine builds it (one tensor for tied
        embeddings)."""
        r = self.resolved()
        q_dim = r["n_heads"] * r["head_dim"]
        kv_dim = r["n_kv_heads"] * r["head_dim"]
        attention = 2 * r["dim"] * q_dim + 2 * r["dim"] * kv_dim
        if r.get("qkv_bias"):
            attention += q_dim + 2 * kv_dim
        if r.get("qk_norm"):
            attention += 2 * r["head_dim"]
        mlp = 3 * r["dim"] * r["ffn_dim"]
        per_layer = attention + mlp + 2 * r["dim"]
        embeddings = (1 if r["tie_embeddings"] else 2) * r["vocab_size"] * r["dim"]
        return embeddings + r["n_layers"] * per_layer + r["dim"]


class DataSpec(_Strict):
    source: DataSource = DataSource.synthetic
    path: str | None = None
    tokenizer: str = "byte"
    val_fraction: Annotated[float, Field(ge=0.0, le=0.5)] = 0.05
    # Records only (source: records).
    format: RecordFormat = RecordFormat.text
    text_field: Annotated[str, Field(min_length=1, max_length=200)] = "text"
    messages_field: Annotated[str, Field(min_length=1, max_length=200)] = "messages"
    # A Jinja chat template (its text, or a path to a .jinja file); by default the
    # tokenizer's own (tokenizer_config.json or chat_template.jinja beside tokenizer.json).
    chat_template: Annotated[str, Field(min_length=1, max_length=100_000)] | None = None
    train_on_prompt: bool = False
    overflow: Overflow = Overflow.truncate
    # Records are shuffled (seeded by train.seed) before packing; false keeps file order.
    shuffle: bool = True
    # Whole documents side by side in each window, attention never across them; false:
    # one document per window, padded.
    packing: bool = True
    skip_bad_records: bool = False

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.source != DataSource.synthetic and not self.path:
            raise ValueError(
                f"data.path is required when data.source={self.source.value!r}; "
                "give a file or folder of text, a .bin of token ids, or records "
                "(.jsonl, .jsonl.gz, .parquet or a datasets folder)"
            )
        if self.source == DataSource.tokens and self.tokenizer != "byte":
            raise ValueError(
                "data.tokenizer does not apply to data.source='tokens' (already tokenized); "
                "remove it"
            )
        # Compared with the defaults, not by which fields were given: a stored spec holds
        # every field.
        records_only = self._changed(_RECORD_FIELDS)
        if self.source != DataSource.records and records_only:
            raise ValueError(
                f"data.{records_only[0]} applies to data.source='records' only; set "
                "source: records or remove it"
            )
        if self.format != RecordFormat.chat:
            chat_only = self._changed(_CHAT_FIELDS)
            if chat_only:
                raise ValueError(
                    f"data.{chat_only[0]} applies to data.format='chat' only; set "
                    "format: chat or remove it"
                )
        return self

    def _changed(self, names: set[str]) -> list[str]:
        fields = type(self).model_fields
        return sorted(n for n in names if getattr(self, n) != fields[n].default)


_RECORD_FIELDS = {
    "format",
    "text_field",
    "messages_field",
    "chat_template",
    "train_on_prompt",
    "overflow",
    "shuffle",
    "packing",
    "skip_bad_records",
}
_CHAT_FIELDS = {"messages_field", "chat_template", "train_on_prompt", "overflow"}


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
    # How data-parallel ranks send gradients (workers/contract/grad_compression.py).
    grad_compression: GradCompression = GradCompression()
    # sync: gradients averaged every step; local_sgd: DiLoCo (workers/contract/local_sgd.py).
    dp_mode: DataParallelMode = DataParallelMode.sync
    local_sgd: LocalSgd = LocalSgd()
    # async: a gradient computed on parameters more than this many updates old (of the
    # shard it goes to) is dropped or down-weighted, as `staleness_policy` says.
    max_staleness: Annotated[int, Field(ge=0, le=1_000_000)] = 16
    staleness_policy: StalenessPolicy = StalenessPolicy.drop
    # The service chooses the layout at submit (the fastest the cost model predicts on the
    # ranks the cluster has free), within these bounds; `parallel: auto` is short for it.
    # The stored spec holds the chosen layout, with auto off.
    auto: bool = False
    max_tp: Annotated[int, Field(ge=1, le=MAX_DEGREE)] | None = None
    max_pp: Annotated[int, Field(ge=1, le=MAX_DEGREE)] | None = None

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
        if self.grad_compression.kind == GradCompressionKind.powersgd and (
            self.auto or self.tp > 1 or self.pp > 1 or self.zero_stage > 1
        ):
            raise ValueError(
                "parallel.grad_compression.kind='powersgd' runs as DDP's communication hook, "
                "and only layouts without tp or pp at zero_stage 0 or 1 train under DDP; "
                "choose such a layout (auto: false, tp: 1, pp: 1) or use kind 'bf16'"
            )
        free = {"auto", "max_tp", "max_pp", "fsdp_mixed_precision", "grad_compression"}
        given = sorted(self.model_fields_set - free)
        if self.auto and given:
            raise ValueError(
                f"parallel.auto chooses the layout: drop parallel.{', parallel.'.join(given)}, "
                "or set auto: false"
            )
        if not self.auto and (self.max_tp is not None or self.max_pp is not None):
            raise ValueError(
                "parallel.max_tp and parallel.max_pp bound a layout the service chooses: "
                "set parallel.auto: true, or drop them"
            )
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
    # In-memory snapshots: host memory on the node, outliving the worker process; a
    # worker's death then costs at most this many steps (workers/storage/snapshots.py).
    # "auto" (the default): as often as costs at most 2% of the step time, as measured
    # (workers/engine/checkpoint/cadence.py), where a restart may follow; 0: off.
    memory_every_steps: Annotated[int, Field(ge=0, le=MAX_STEPS)] | Literal["auto"] = "auto"


class ResumeFromSpec(_Strict):
    """Start from a checkpoint of another job (yours), in this job's layout."""

    job_id: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9]+$")]
    step: Annotated[int, Field(ge=1, le=MAX_STEPS)] | None = None  # None: its newest


class ElasticSpec(_Strict):
    """On node loss, go on re-planned on fewer ranks: down to `min_dp` x tp x pp."""

    min_dp: Annotated[int, Field(ge=1, le=MAX_DEGREE)] = 1


class FaultToleranceSpec(_Strict):
    max_failures: Annotated[int, Field(ge=0, le=1000)] = 3
    # Below a few seconds a loaded host's ordinary pauses (a checkpoint, a collective
    # after a slow rank) would read as hangs, and every step would fail.
    hang_timeout_s: Annotated[float, Field(ge=5.0, le=86400.0)] = 600.0
    # A step whose loss is not finite rolls back to the newest snapshot and skips that
    # step's batch, at most this many times in the job's life (0: fail at once).
    max_nonfinite_skips: Annotated[int, Field(ge=0, le=1000)] = 3
    elastic: ElasticSpec | None = None
    # The next attempt's processes started (torch imported) while this one trains, so a
    # restart takes seconds less; they hold host memory, counted when the job is admitted.
    # Only for CPU ranks, and only where the job may restart (max_failures > 0).
    warm_spares: bool = True
    # A rank lost (killed, hung, raised) is replaced alone: the others keep their processes
    # (torch, the engine and the device loaded), join a new world and restore the newest
    # checkpoint. Off: every failure restarts every rank.
    recover_in_place: bool = True


class ResourcesSpec(_Strict):
    gpus_per_worker: Annotated[float, Field(ge=0.0, le=64.0)] = 0.0
    # A rank below a tenth of a CPU would only time out its collectives.
    cpus_per_worker: Annotated[float, Field(ge=0.1, le=1024.0)] = 1.0
