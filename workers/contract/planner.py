"""Every legal layout of a spec on N ranks, predicted and ranked (no torch).

A layout is dp x tp x pp = N with a ZeRO stage, a pipeline schedule (and virtual stages),
sequence parallelism, a micro-batch size (powers of two, and the spec's own) and
activation checkpointing. Legality is the
spec's own validation (one JobSpec per (dp, tp, pp, schedule, micro-batch); the other
choices cannot make a legal layout illegal). The ones that fit the device memory come
first, each group fastest first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from shardline.workers.contract.cost_model import Prediction, predict
from shardline.workers.contract.grad_compression import GradCompressionKind
from shardline.workers.contract.rates import DEFAULT_RATES, Rates
from shardline.workers.contract.sections import ActivationCheckpointing, PipelineSchedule
from shardline.workers.contract.spec import JobSpec

# Interleaved 1F1B is offered with two virtual stages per rank: more cut the bubble little
# and multiply the sends.
INTERLEAVED_VIRTUAL_STAGES = 2


@dataclass
class PlannedLayout:
    spec: JobSpec
    fits: bool
    predicted: Prediction

    def to_json(self) -> dict[str, Any]:
        par, tr = self.spec.parallel, self.spec.train
        return {
            "parallel": par.model_dump(mode="json"),
            "train": {
                "micro_batch_size": tr.micro_batch_size,
                "activation_checkpointing": tr.activation_checkpointing.value,
            },
            "fits": self.fits,
            "predicted": self.predicted.to_json(),
        }


def divisors(n: int) -> list[int]:
    """Every divisor of n, ascending (in O(sqrt n): n can be a million)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def micro_batch_sizes(per_rank: int, asked: int) -> list[int]:
    """The micro-batch sizes tried: those that divide a rank's share of the batch and are
    powers of two, and the spec's own. Every divisor of a large batch would multiply the
    layouts many times over for steps that differ little."""
    sizes = {d for d in divisors(per_rank) if d & (d - 1) == 0}
    if per_rank % asked == 0:
        sizes.add(asked)
    return sorted(sizes)


def _schedules(pp: int) -> list[tuple[PipelineSchedule, int]]:
    if pp == 1:
        return [(PipelineSchedule.one_f_one_b, 1)]
    return [
        (PipelineSchedule.gpipe, 1),
        (PipelineSchedule.one_f_one_b, 1),
        (PipelineSchedule.interleaved_1f1b, INTERLEAVED_VIRTUAL_STAGES),
    ]


def legal_layouts(spec: JobSpec, ranks: int) -> list[JobSpec]:
    """Every legal layout of `spec` on `ranks` ranks (the spec's other sections kept)."""
    base = spec.model_dump(mode="json")
    out: list[JobSpec] = []
    for tp in divisors(ranks):
        for pp in divisors(ranks // tp):
            dp = ranks // (tp * pp)
            for schedule, virtual in _schedules(pp):
                if spec.train.global_batch_size % dp:
                    continue
                per_rank = spec.train.global_batch_size // dp
                for micro in micro_batch_sizes(per_rank, spec.train.micro_batch_size):
                    data = {
                        **base,
                        "parallel": {
                            **base["parallel"],
                            "dp": dp,
                            "tp": tp,
                            "pp": pp,
                            "zero_stage": 0,
                            "pp_schedule": schedule.value,
                            "pp_virtual_stages": virtual,
                            "sequence_parallel": False,
                            "auto": False,
                            "max_tp": None,
                            "max_pp": None,
                        },
                        "train": {**base["train"], "micro_batch_size": micro},
                    }
                    try:
                        legal = JobSpec.model_validate(data)
                    except ValidationError:
                        continue
                    out.extend(_variants(legal))
    return out


def _variants(legal: JobSpec) -> list[JobSpec]:
    """The choices that keep a legal layout legal: ZeRO stage, sequence parallel, AC."""
    par = legal.parallel
    out = []
    # PowerSGD is DDP's hook: only zero 0 and 1 train under DDP (the spec refuses more).
    most_zero = 1 if par.grad_compression.kind == GradCompressionKind.powersgd else 3
    for zero in range(most_zero + 1) if par.dp > 1 else [0]:
        for sp in (False, True) if par.tp > 1 else (False,):
            for ac in ActivationCheckpointing:
                out.append(
                    legal.model_copy(
                        update={
                            "parallel": par.model_copy(
                                update={"zero_stage": zero, "sequence_parallel": sp}
                            ),
                            "train": legal.train.model_copy(
                                update={"activation_checkpointing": ac}
                            ),
                        }
                    )
                )
    return out


def rates_kind(spec: JobSpec) -> str:
    """The device class a job's ranks run on: the key a cluster's calibrated rates are
    kept by (service/rates.py)."""
    return "gpu" if spec.resources.gpus_per_worker > 0 else "cpu"


def default_rates(spec: JobSpec) -> Rates:
    """Rates by the spec's device: planning uses these until the cluster is calibrated."""
    return DEFAULT_RATES["h100" if rates_kind(spec) == "gpu" else "cpu"]


def plan(
    spec: JobSpec,
    ranks: int,
    rates: Rates,
    *,
    ranks_per_node: int | None = None,
    device_memory: int | None = None,
) -> list[PlannedLayout]:
    """The legal layouts, predicted: those that fit first, each group fastest first."""
    planned = []
    for layout in legal_layouts(spec, ranks):
        predicted = predict(layout, rates, ranks_per_node=ranks_per_node)
        fits = device_memory is None or predicted.peak_bytes_per_rank <= device_memory
        planned.append(PlannedLayout(layout, fits, predicted))
    planned.sort(key=lambda p: (not p.fits, p.predicted.step_s))
    return planned
