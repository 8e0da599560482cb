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
import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from shardline.workers.contract.cost_model import Prediction, predict
from shardline.workers.contract.grad_compression import GradCompressionKind
from shardline.workers.contract.rates import DEFAULT_RATES, Rates
from shardline.workers.contract.sections import (
    ActivationCheckpointing,
    ParallelSpec,
    PipelineSchedule,
)
from shardline.workers.contract.spec import JobSpec

# Interleaved 1F1B is offered with two virtual stages per rank: more cut the bubble little
# and multiply the sends.
INTERLEAVED_VIRTUAL_STAGES = 2


class PlanTooLarge(ValueError):
    """A plan past its budget (`PlanBudget`): too many layouts, or too much CPU time."""


@dataclass
class PlanBudget:
    """What one plan may cost: the layouts it predicts and the CPU seconds of the thread
    that plans (a spec on thousands of ranks has hundreds of thousands of layouts, and a
    request must not hold a core for a minute). A plan past either raises PlanTooLarge,
    which names the bound and how to stay within it."""

    max_layouts: int
    cpu_s: float
    started: float = 0.0

    def start(self) -> None:
        self.started = time.thread_time()

    def check(self, ranks: int) -> None:
        if time.thread_time() - self.started > self.cpu_s:
            raise PlanTooLarge(
                f"planning {ranks} ranks took more than the {self.cpu_s:g} s of CPU a plan "
                "may take; plan fewer ranks, or bound the search with parallel.max_tp and "
                "parallel.max_pp (with parallel.auto: true)"
            )

    def count(self, layouts: int, ranks: int) -> None:
        if layouts > self.max_layouts:
            raise PlanTooLarge(
                f"this spec has {layouts} legal layouts on {ranks} ranks, more than the "
                f"{self.max_layouts} a plan predicts; plan fewer ranks, or bound the search "
                "with parallel.max_tp and parallel.max_pp (with parallel.auto: true)"
            )


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


def legal_layouts(spec: JobSpec, ranks: int, budget: PlanBudget | None = None) -> list[JobSpec]:
    """Every legal layout of `spec` on `ranks` ranks (the spec's other sections kept),
    within its bounds (`parallel.max_tp`, `parallel.max_pp`) where it has them."""
    return [v for legal in _legal_bases(spec, ranks, budget) for v in _variants(legal)]


def _legal_bases(spec: JobSpec, ranks: int, budget: PlanBudget | None) -> list[JobSpec]:
    """One legal spec per (dp, tp, pp, schedule, micro-batch): `_variants` of each are
    legal too."""
    base = spec.model_dump(mode="json")
    bounds = spec.parallel
    out: list[JobSpec] = []
    for tp in divisors(ranks):
        if bounds.max_tp is not None and tp > bounds.max_tp:
            continue
        for pp in divisors(ranks // tp):
            if bounds.max_pp is not None and pp > bounds.max_pp:
                continue
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
                    if budget is not None:
                        budget.check(ranks)
                    try:
                        out.append(JobSpec.model_validate(data))
                    except ValidationError:
                        continue
    return out


def _zero_stages(par: ParallelSpec) -> range:
    # PowerSGD is DDP's hook: only zero 0 and 1 train under DDP (the spec refuses more).
    most_zero = 1 if par.grad_compression.kind == GradCompressionKind.powersgd else 3
    return range(most_zero + 1) if par.dp > 1 else range(1)


def _sequence_parallel(par: ParallelSpec) -> tuple[bool, ...]:
    return (False, True) if par.tp > 1 else (False,)


def _variant_count(legal: JobSpec) -> int:
    par = legal.parallel
    return len(_zero_stages(par)) * len(_sequence_parallel(par)) * len(ActivationCheckpointing)


def _variants(legal: JobSpec) -> list[JobSpec]:
    """The choices that keep a legal layout legal: ZeRO stage, sequence parallel, AC."""
    par = legal.parallel
    out = []
    for zero in _zero_stages(par):
        for sp in _sequence_parallel(par):
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
    budget: PlanBudget | None = None,
) -> list[PlannedLayout]:
    """The legal layouts, predicted: those that fit first, each group fastest first.
    Within `budget` where one is given: its layouts are counted before any is predicted."""
    if budget is not None:
        budget.start()
    bases = _legal_bases(spec, ranks, budget)
    if budget is not None:
        budget.count(sum(_variant_count(b) for b in bases), ranks)
    planned = []
    for layout in (v for legal in bases for v in _variants(legal)):
        if budget is not None:
            budget.check(ranks)
        predicted = predict(layout, rates, ranks_per_node=ranks_per_node)
        fits = device_memory is None or predicted.peak_bytes_per_rank <= device_memory
        planned.append(PlannedLayout(layout, fits, predicted))
    planned.sort(key=lambda p: (not p.fits, p.predicted.step_s))
    return planned
