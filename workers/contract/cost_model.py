"""Predicted step time and memory of a spec's layout, from the spec and a device's rates.

No torch: the control plane plans with it before anything runs. The terms, per rank and
step:
- compute: the model's training FLOPs (6N per token plus attention, as the engine counts
  them for MFU; activation checkpointing recomputes forwards) split evenly over the world,
  at the rate a rank achieves. On a CPU, ranks beyond the host's cores share them.
- comm: the collectives of the layout, each `latency + bytes / bandwidth` on the link it
  crosses (ranks of one node or several): data parallel (gradients all-reduced, or FSDP's
  gathers and reduce-scatters per micro-batch by ZeRO stage), tensor parallel (four
  activation all-reduces per layer and micro-batch), pipeline sends, and the loss and norm
  all-reduces every step. The wrappers' collectives hide behind compute by the device's
  `overlap` fraction; the engine's own never do.
- bubble: a pipeline's idle share, (pp - 1) / (micro-batches x virtual stages) of compute.
- optimizer: AdamW's pass over this rank's parameters, gradients and moments.
Memory per rank: the model state (memory_model.py), the activations its schedule keeps in
flight, the logits of the last stage, and the runtime's own bytes.

`Rates` are what `shardline plan --calibrate` measures; DEFAULT_RATES hold starting points
(the H200 one measured here, see docs/benchmarks.md; the others from datasheets scaled
the same way).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from shardline.workers.contract.memory_model import FP32, model_state_bytes
from shardline.workers.contract.rates import (
    INTER,
    INTRA,
    Rates,
)
from shardline.workers.contract.sections import ActivationCheckpointing, PipelineSchedule, Precision
from shardline.workers.contract.spec import JobSpec

# The vocabulary-parallel loss's collectives per micro-batch (max, sum, target logit),
# forward and backward, and the embedding's output.
TP_LOSS_COLLECTIVES = 4


@dataclass
class Prediction:
    step_s: float
    tokens_per_s: float
    peak_bytes_per_rank: int
    model_state_bytes_per_rank: int
    terms: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def flops_per_token(resolved: dict[str, Any]) -> int:
    """The engine's count (workers/engine/models/llama/model.py): 6 x the parameters of
    every matmul (the output head's too, tied or not), plus 12 x layers x the attention
    width x seq_len for the scores and the weighted sum."""
    dim, layers = resolved["dim"], resolved["n_layers"]
    head_dim = resolved.get("head_dim") or dim // resolved["n_heads"]
    q_dim, kv_dim = resolved["n_heads"] * head_dim, resolved["n_kv_heads"] * head_dim
    per_layer = 2 * dim * q_dim + 2 * dim * kv_dim + 3 * dim * resolved["ffn_dim"] + 2 * dim
    if resolved.get("qkv_bias"):
        per_layer += q_dim + 2 * kv_dim
    if resolved.get("qk_norm"):
        per_layer += 2 * head_dim
    no_embedding = layers * per_layer + dim + resolved["vocab_size"] * dim
    return 6 * no_embedding + 12 * layers * q_dim * resolved["seq_len"]


RECOMPUTE = {  # forward passes run again in backward: a forward is a third of a step
    ActivationCheckpointing.none: 1.0,
    ActivationCheckpointing.selective: 1.0 + 1.0 / 6.0,  # every second block
    ActivationCheckpointing.full: 1.0 + 1.0 / 3.0,
}


def _activation_bytes(spec: JobSpec) -> float:
    """Per token and layer, what backward keeps (the block's inputs under full AC)."""
    r = spec.model.resolved()
    par = spec.parallel
    dim, ffn = r["dim"], r["ffn_dim"]
    q_dim, kv_dim = r["n_heads"] * r["head_dim"], r["n_kv_heads"] * r["head_dim"]
    element = FP32 if spec.precision == Precision.fp32 else 2
    # Norm inputs and outputs and the residuals stay whole over tp unless sequence parallel;
    # attention and MLP insides are cut by tp.
    whole = 4 * dim / (par.tp if par.sequence_parallel else 1)
    cut = (dim + 2 * q_dim + 2 * kv_dim + 4 * ffn) / par.tp
    full = (whole + cut) * element
    kept = dim * element  # a checkpointed block keeps its input only
    ac = spec.train.activation_checkpointing
    if ac == ActivationCheckpointing.full:
        return kept
    if ac == ActivationCheckpointing.selective:
        return (full + kept) / 2
    return full


def micro_batch_activation_bytes(spec: JobSpec) -> float:
    """What one micro-batch's forward keeps for backward on one rank holding the whole
    model (the unit calibration compares a real step's memory with)."""
    r = spec.model.resolved()
    micro_tokens = spec.train.micro_batch_size * r["seq_len"]
    element = FP32 if spec.precision == Precision.fp32 else 2
    logits = micro_tokens * r["vocab_size"] * (2 * FP32 + element)
    return _activation_bytes(spec) * micro_tokens * r["n_layers"] + logits


def _in_flight(spec: JobSpec) -> float:
    """Micro-batches whose activations a rank holds at once."""
    par, m = spec.parallel, spec.accumulation_steps
    if par.pp == 1:
        return 1.0
    if par.pp_schedule == PipelineSchedule.gpipe:
        return float(m)
    if par.pp_schedule == PipelineSchedule.interleaved_1f1b:
        return min(m, par.pp) * (1 + (par.pp - 1) / (par.pp * par.pp_virtual_stages))
    return float(min(m, par.pp))


def _links(spec: JobSpec, ranks_per_node: int) -> dict[str, str]:
    """Which link each parallel dimension's collectives cross (tp fastest in the mesh)."""
    par = spec.parallel
    return {
        "tp": INTRA if par.tp <= ranks_per_node else INTER,
        "dp": INTRA if par.tp * par.dp <= ranks_per_node else INTER,
        "pp": INTRA if par.world_size <= ranks_per_node else INTER,
    }


def _collective(rates: Rates, link: str, bytes_moved: float, count: int) -> float:
    return count * rates.latency_s + bytes_moved / rates.bandwidth[link]


def predict(spec: JobSpec, rates: Rates, *, ranks_per_node: int | None = None) -> Prediction:
    """Step time, throughput and bytes per rank of `spec`'s layout on devices of `rates`."""
    r = spec.model.resolved()
    par, tr = spec.parallel, spec.train
    world = par.world_size
    per_node = ranks_per_node or world
    links = _links(spec, per_node)
    m = spec.accumulation_steps
    tokens = tr.global_batch_size * r["seq_len"]
    micro_tokens = tr.micro_batch_size * r["seq_len"]
    element = FP32 if spec.precision == Precision.fp32 else 2

    rate = rates.flops_per_s
    if rates.cores is not None:  # a CPU's rate is one core's; its ranks share the cores
        rate *= rates.cores / world
    compute = flops_per_token(r) * tokens * RECOMPUTE[tr.activation_checkpointing] / world / rate

    states = model_state_bytes(r, par)
    zero0 = model_state_bytes(r, par.model_copy(update={"zero_stage": 0}))
    stage_params = zero0["params"]  # bytes of this rank's (tp-cut) stage, unsharded
    layers_here = r["n_layers"] // par.pp
    hidden, exposed = 0.0, 0.0
    dp, zero = par.dp, par.zero_stage if par.dp > 1 else 0
    if dp > 1:
        share = (dp - 1) / dp
        if zero <= 1:
            # One bucketed all-reduce on the last micro-batch (DDP), or one flat one after
            # backward (with pp or tp, not overlapped: data_parallel.py).
            all_reduce = _collective(rates, links["dp"], 2 * share * stage_params, 1)
            if par.pp > 1 or par.tp > 1:
                exposed += all_reduce
            else:
                hidden += all_reduce
            if zero == 1:  # the updated slices gathered back, in one collective
                exposed += _collective(rates, links["dp"], share * stage_params, 1)
        else:
            # FSDP: per micro-batch, each unit (a block, and the root) gathers its
            # parameters (twice under zero 3: forward and backward) and reduce-scatters
            # its gradients.
            gather_bytes = stage_params // FP32 * (2 if _fsdp_bf16(spec) else FP32)
            gathers = 1 if zero == 2 else 2
            units = layers_here + 1
            per_micro = gathers * share * gather_bytes + share * stage_params
            hidden += _collective(rates, links["dp"], m * per_micro, m * units * (gathers + 1))
    if par.tp > 1:
        # Two all-reduces (or a reduce-scatter and an all-gather under SP) per block in
        # forward and two in backward, plus the vocabulary-parallel loss's few.
        act = micro_tokens * r["dim"] * element
        count = m * (4 * layers_here + TP_LOSS_COLLECTIVES)
        exposed += _collective(rates, links["tp"], count * 2 * (par.tp - 1) / par.tp * act, count)
    if par.pp > 1:
        sends = 2 * m * par.pp_virtual_stages
        exposed += _collective(rates, links["pp"], sends * micro_tokens * r["dim"] * element, sends)
    # The loss and gradient-norm all-reduces: latency only.
    exposed += 2 * rates.latency_s if world > 1 else 0.0
    comm = exposed + hidden * (1.0 - rates.overlap)

    bubble = 0.0
    if par.pp > 1:
        bubble = compute * (par.pp - 1) / (m * par.pp_virtual_stages)
    # AdamW reads and writes parameters, gradients and both moments once a step.
    optimizer = (
        2 * (states["params"] + states["grads"] + states["optim"]) / rates.memory_bytes_per_s
    )
    step = compute + comm + bubble + optimizer

    activations = _activation_bytes(spec) * micro_tokens * layers_here * _in_flight(spec)
    logits = micro_tokens * r["vocab_size"] / par.tp * (2 * FP32 + element)
    activations *= rates.activation_scale
    logits *= rates.activation_scale
    model_state = sum(states.values())
    peak = rates.runtime_bytes + model_state + activations + logits + _transient(spec, zero0, rates)
    return Prediction(
        step_s=step,
        tokens_per_s=tokens / step,
        peak_bytes_per_rank=int(peak),
        model_state_bytes_per_rank=model_state,
        terms={
            "compute_s": compute,
            "comm_s": comm,
            "bubble_s": bubble,
            "optimizer_s": optimizer,
            "activation_bytes": activations + logits,
        },
    )


def _transient(spec: JobSpec, zero0: dict[str, int], rates: Rates) -> float:
    """Bytes a step holds beyond the model state for its data parallelism: FSDP's gathered
    parameters (zero 2 keeps every unit's from forward to backward, zero 3 about two units
    at a time), one unit's unsharded gradients before they are reduce-scattered and the
    surplus FSDP's ranks are measured to keep resident (`Rates.fsdp_resident_factor`);
    the flat gradient copy of the all-reduce after backward (zero 0/1 with pp or tp)."""
    par = spec.parallel
    if par.dp == 1:
        return 0.0
    stage = float(zero0["params"])
    units = spec.model.resolved()["n_layers"] // par.pp + 1
    if par.zero_stage >= 2:
        gathered = stage / FP32 * (2 if _fsdp_bf16(spec) else FP32)
        held = gathered if par.zero_stage == 2 else 2 * gathered / units
        return held + stage / units + rates.fsdp_resident_factor * stage
    return stage if (par.pp > 1 or par.tp > 1) else 0.0


def _fsdp_bf16(spec: JobSpec) -> bool:
    return spec.precision == Precision.bf16 and spec.parallel.fsdp_mixed_precision
