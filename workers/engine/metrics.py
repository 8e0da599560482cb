"""A step's metrics as the trainer reports them, in torchtitan's MetricsProcessor's place:
which steps log, the figures of a step, every rank's part of a logged step gathered in
one collective, and the run's summary.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.accounting import MEMORY_KINDS, peak_flops
from shardline.workers.engine.parallel import ParallelDims
from shardline.workers.engine.precision import finite_or_none
from shardline.workers.engine.step_clock import PARTS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankReport:
    """One rank's part of a logged step: the bytes it holds of each kind, the seconds of
    each part of its step, and the step's whole time."""

    memory: dict[str, int]
    parts: dict[str, float]
    step_s: float

    def row(self) -> list[float]:
        """Flat, in a fixed order, for one all-gather."""
        return [
            *(float(self.memory[kind]) for kind in MEMORY_KINDS),
            *(self.parts[part] for part in PARTS),
            self.step_s,
        ]

    @classmethod
    def from_row(cls, row: list[float]) -> RankReport:
        n = len(MEMORY_KINDS)
        return cls(
            memory={kind: int(row[i]) for i, kind in enumerate(MEMORY_KINDS)},
            parts={part: row[n + i] for i, part in enumerate(PARTS)},
            step_s=row[-1],
        )

    def breakdown(self, rank: int) -> dict[str, Any]:
        """This rank's row of the page's ranks table."""
        return {
            "rank": rank,
            **{f"{part}_s": seconds for part, seconds in self.parts.items()},
            "step_s": self.step_s,
            "mem_bytes": sum(self.memory.values()),
        }


class MetricsProcessor:
    """Which steps log, and what a step reports."""

    def __init__(
        self,
        spec: JobSpec,
        dims: ParallelDims,
        device: torch.device,
        *,
        flops_per_token: int,
        on_metrics: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        self.spec = spec
        self.dims = dims
        self.device = device
        self.flops_per_token = flops_per_token
        self.on_metrics = on_metrics
        self.tokens_per_step = spec.train.global_batch_size * spec.model.resolved()["seq_len"]
        self.peak_flops = peak_flops(device)
        self.report: RankReport | None = None  # this rank's part of the last logged step

    def should_log(self, step: int) -> bool:
        tr = self.spec.train
        return step % tr.log_every == 0 or step == tr.steps or step == 1

    def mfu(self, tokens_per_s: float) -> float | None:
        if self.peak_flops is None:
            return None
        world_peak = self.peak_flops * self.dims.world_size
        return self.flops_per_token * tokens_per_s / world_peak

    def step_metrics(
        self, step: int, *, loss: float | None, grad_norm: float, lr: float, step_s: float
    ) -> dict[str, Any]:
        """A step's own figures (a save, validation and the ranks' parts come later)."""
        tokens_per_s = self.tokens_per_step / step_s
        return {
            "step": step,
            "loss": loss,
            "grad_norm": finite_or_none(grad_norm),
            "lr": lr,
            "tokens_per_s": tokens_per_s,
            "step_time_s": step_s,
            "mfu": self.mfu(tokens_per_s),
        }

    def log(self, metrics: dict[str, Any]) -> None:
        """Hand a logged step's metrics on, with every rank's part of them where the ranks
        can still gather. Where a peer died after this step's checkpoint committed, the
        metrics go on without the ranks' breakdown before the error does: a restore from
        that checkpoint trains on after this step, and would never record it."""
        try:
            self._gather(metrics)
        except Exception:
            if self.on_metrics is not None:
                self.on_metrics(metrics)
            raise
        if self.on_metrics is not None:
            self.on_metrics(metrics)

    def _gather(self, metrics: dict[str, Any]) -> None:
        """A logged step's memory (the most any rank holds, per kind) and every rank's
        breakdown of its step, in one collective after the step's checkpoint."""
        assert self.report is not None, "a logged step keeps its rank report"
        held = metrics.get("checkpoint_blocking_s", 0.0) + metrics.get("snapshot_blocking_s", 0.0)
        own = RankReport(
            self.report.memory, {**self.report.parts, "checkpoint": held}, self.report.step_s
        )
        local = torch.tensor(own.row(), dtype=torch.float64, device=self.device)
        if dist.is_initialized() and self.dims.world_size > 1:
            rows = [torch.empty_like(local) for _ in range(self.dims.world_size)]
            dist.all_gather(rows, local)
        else:
            rows = [local]
        reports = [RankReport.from_row(row) for row in torch.stack(rows).tolist()]
        metrics["mem_bytes"] = {
            kind: max(report.memory[kind] for report in reports) for kind in MEMORY_KINDS
        }
        metrics["breakdown"] = [report.breakdown(rank) for rank, report in enumerate(reports)]

    def summary(
        self, last: dict[str, Any], step_times: list[float], *, steps: int, layout: str
    ) -> dict[str, Any]:
        """The run's summary: the last logged loss and the steady state's speed."""
        # The first steps pay for allocation and warm-up; report the steady state.
        steady = step_times[min(2, len(step_times) - 1) :] if step_times else []
        step_time = sum(steady) / len(steady) if steady else None
        tokens_per_s = self.tokens_per_step / step_time if step_time else None
        return {
            "final_loss": last.get("loss"),
            "steps": steps,
            "tokens_per_s": tokens_per_s,
            "mfu": self.mfu(tokens_per_s) if tokens_per_s else None,
            "step_time_s": step_time,
            "layout": layout,
            "peak_mem_bytes": self._peak_memory(),
        }

    def _peak_memory(self) -> int:
        """The most memory any rank used: allocated GPU memory, or resident set on CPU."""
        if self.device.type == "cuda":
            own = int(torch.cuda.max_memory_allocated(self.device))
        else:
            own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if not dist.is_initialized() or self.dims.world_size == 1:
            return own
        peak = torch.tensor([own], dtype=torch.int64, device=self.device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        return int(peak.item())
