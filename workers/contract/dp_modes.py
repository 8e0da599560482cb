"""What `parallel.dp_mode` local_sgd and async cannot run, each refused with the fix (the
JobSpec's check calls these). Pure pydantic: no torch."""

from __future__ import annotations

from typing import Protocol

from shardline.workers.contract.local_sgd import DataParallelMode, LocalSgd, StalenessPolicy
from shardline.workers.contract.sections import (
    CheckpointSpec,
    FaultToleranceSpec,
    ParallelSpec,
    Precision,
    TrainSpec,
)


class Sections(Protocol):
    """The parts of a JobSpec these checks read."""

    @property
    def parallel(self) -> ParallelSpec: ...
    @property
    def precision(self) -> Precision: ...
    @property
    def train(self) -> TrainSpec: ...
    @property
    def checkpoint(self) -> CheckpointSpec: ...
    @property
    def fault_tolerance(self) -> FaultToleranceSpec: ...


def local_sgd_problem(spec: Sections) -> str | None:
    """What a local_sgd spec asks for that the mode cannot do, with the fix; None if
    nothing (or the job is not local_sgd)."""
    par = spec.parallel
    if par.dp_mode != DataParallelMode.local_sgd:
        if par.local_sgd != LocalSgd():
            return (
                "parallel.local_sgd applies only to parallel.dp_mode 'local_sgd' (this is "
                f"'{par.dp_mode.value}'); drop it or set dp_mode: local_sgd"
            )
        return None
    if par.auto:
        return "parallel.dp_mode 'local_sgd' needs a layout you choose: set auto: false and dp"
    if par.dp < 2:
        return "parallel.dp_mode 'local_sgd' needs parallel.dp >= 2 replicas to average"
    if par.tp > 1 or par.pp > 1:
        return (
            "parallel.dp_mode 'local_sgd' runs data parallelism only (tensor and pipeline "
            "parallelism inside a replica are not built): set tp: 1 and pp: 1"
        )
    if par.zero_stage > 0:
        return (
            "parallel.dp_mode 'local_sgd' needs parallel.zero_stage 0: each replica holds its "
            "own optimizer state whole"
        )
    if par.grad_compression.kind.value != "none":
        return (
            "parallel.dp_mode 'local_sgd' sends no per-step gradients to compress: drop "
            "parallel.grad_compression (local_sgd.delta_dtype: bf16 halves a sync's bytes)"
        )
    if spec.precision.value == "fp16":
        return (
            "parallel.dp_mode 'local_sgd' cannot take precision 'fp16' (each replica's loss "
            "scaler would skip different steps); use bf16 or fp32"
        )
    if spec.fault_tolerance.elastic is not None:
        return "parallel.dp_mode 'local_sgd' cannot be elastic yet: drop fault_tolerance.elastic"
    every = par.local_sgd.sync_every
    for field, value in (
        ("checkpoint.every_steps", spec.checkpoint.every_steps),
        ("checkpoint.memory_every_steps", spec.checkpoint.memory_every_steps),
    ):
        if value != "auto" and value % every:  # "auto" snapshots only at a sync
            return (
                f"{field}={value} is not a multiple of parallel.local_sgd.sync_every={every}: "
                "replicas hold the same parameters only at a sync, where a checkpoint is "
                f"taken; make it a multiple of {every}"
            )
    return None


def async_problem(spec: Sections) -> str | None:
    """What an async spec asks for that the mode cannot do, with the fix; None if nothing
    (or the job is not async). The replicas meet only every `train.log_every` steps."""
    par = spec.parallel
    if par.dp_mode != DataParallelMode.asynchronous:
        if par.max_staleness != 16 or par.staleness_policy != StalenessPolicy.drop:
            return (
                "parallel.max_staleness and parallel.staleness_policy apply only to "
                f"parallel.dp_mode 'async' (this is '{par.dp_mode.value}'); drop them or "
                "set dp_mode: async"
            )
        return None
    mode = "parallel.dp_mode 'async'"
    if par.auto:
        return f"{mode} needs a layout you choose: set auto: false and dp"
    if par.dp < 2:
        return f"{mode} needs parallel.dp >= 2 replicas"
    if par.tp > 1 or par.pp > 1:
        return (
            f"{mode} runs data parallelism only (tensor and pipeline parallelism inside a "
            "replica are not built): set tp: 1 and pp: 1"
        )
    if par.zero_stage > 0:
        return (
            f"{mode} needs parallel.zero_stage 0: the optimizer state is already sharded, "
            "over the parameter servers"
        )
    if par.grad_compression.kind.value != "none":
        return f"{mode} does not compress its pushes yet: drop parallel.grad_compression"
    if spec.precision.value == "fp16":
        return f"{mode} cannot take precision 'fp16' (no loss scaler is shared); use bf16 or fp32"
    if spec.fault_tolerance.elastic is not None:
        return f"{mode} cannot be elastic yet: drop fault_tolerance.elastic"
    every = spec.train.log_every
    if every < 2:
        return (
            f"{mode} meets the replicas at every logged step, and train.log_every=1 would "
            "make every step a meeting (sync mode, slower): set train.log_every to the "
            "steps between meetings, e.g. 50"
        )
    for field, value in (
        ("checkpoint.every_steps", spec.checkpoint.every_steps),
        ("checkpoint.memory_every_steps", spec.checkpoint.memory_every_steps),
        ("train.eval_every", spec.train.eval_every),
    ):
        if value != "auto" and value % every:
            return (
                f"{field}={value} is not a multiple of train.log_every={every}: under async "
                "the replicas meet (and the parameters are whole on every rank) only at a "
                f"logged step; make it a multiple of {every}"
            )
    return None
