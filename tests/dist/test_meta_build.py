"""Building without the whole model: every layout starts from the same weights, and a
rank of a ZeRO-3 job never holds much more than its shards while building."""

from __future__ import annotations

import hashlib
import logging
from functools import partial
from typing import Any

import torch

from tests.dist.ranks import on_ranks
from tests.dist.runs import tiny_spec
from shardline.workers.engine.dtensor import plain
from shardline.workers.engine.models.llama.config import ModelArgs
from shardline.workers.engine.models.llama.model import Transformer
from shardline.workers.engine.optimizer import model_name
from shardline.workers.engine.parallel import ParallelDims
from shardline.workers.engine.parts import build_model_parts
from shardline.workers.engine.models.family import load_family
from shardline.workers.contract.spec import JobSpec

log = logging.getLogger(__name__)

# (parallel, train) overrides; activation checkpointing wraps blocks, which must not
# change the names the weights are drawn by.
LAYOUTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "one-process": ({}, {}),
    "dp4-zero3-selective-ac": (
        {"dp": 4, "zero_stage": 3},
        {"activation_checkpointing": "selective"},
    ),
    "tp2-pp2": ({"tp": 2, "pp": 2}, {}),
    "pp2-interleaved": ({"pp": 2, "pp_schedule": "interleaved_1f1b", "pp_virtual_stages": 2}, {}),
}

LLAMA = load_family("llama")


def digest(value: torch.Tensor) -> str:
    return hashlib.sha256(value.detach().contiguous().numpy().tobytes()).hexdigest()


def initial_weight_hashes(
    layout: tuple[dict[str, Any], dict[str, Any]], rank: int, world_size: int, device: torch.device
) -> dict[str, str]:
    """The hash of the full value of every parameter this rank holds (some of), by name."""
    spec = tiny_spec(parallel=layout[0], train=layout[1])
    dims = ParallelDims.from_spec(spec.parallel, world_size)
    parts = build_model_parts(spec, LLAMA, dims=dims, mesh=dims.build_mesh("cpu"), device=device)
    # full_tensor() gathers a DTensor over its mesh: every rank of it calls it in the
    # same order, which named_parameters gives.
    return {
        model_name(name): digest(plain(p.data))
        for module in parts.modules
        for name, p in module.named_parameters()
    }


def whole_model_hashes(spec: JobSpec) -> dict[str, str]:
    model = Transformer(ModelArgs.from_resolved(spec.model.resolved()))
    model.init_weights(seed=spec.train.seed)
    return {name: digest(p) for name, p in model.named_parameters()}


def test_initial_weights_are_the_same_in_every_layout() -> None:
    reference = whole_model_hashes(tiny_spec())
    for layout, (parallel, train) in LAYOUTS.items():
        world = tiny_spec(parallel=parallel).parallel.world_size
        merged: dict[str, set[str]] = {}
        for held in on_ranks(partial(initial_weight_hashes, (parallel, train)), world_size=world):
            for name, value in held.items():
                merged.setdefault(name, set()).add(value)
        assert set(merged) == set(reference), layout
        differing = sorted(n for n, values in merged.items() if values != {reference[n]})
        assert not differing, f"{layout}: initial weights differ from one process: {differing}"


def test_the_seed_decides_the_weights() -> None:
    one = whole_model_hashes(tiny_spec())
    other = whole_model_hashes(tiny_spec(train={"seed": 8}))
    assert all(one[n] != other[n] for n in one if not n.endswith("norm.weight"))


# About 210M parameters; the largest single parameter (an embedding) is 8% of them.
BIG_MODEL = {
    "preset": "tiny",
    "dim": 1024,
    "n_layers": 14,
    "n_heads": 8,
    "n_kv_heads": 8,
    "vocab_size": 16384,
    "seq_len": 64,
}


def _reset_peak_rss() -> None:
    # Writing 5 to clear_refs resets VmHWM (the peak resident set) to the current RSS.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def build_peak_bytes(whole: bool, rank: int, world_size: int, device: torch.device) -> int:
    """How far this process's resident set rose above where it was while building."""
    spec = tiny_spec(model=BIG_MODEL, parallel={"dp": world_size, "zero_stage": 3})
    dims = ParallelDims.from_spec(spec.parallel, world_size)
    mesh = dims.build_mesh("cpu")
    _reset_peak_rss()
    before = _status_kib("VmRSS")
    if whole:  # one process building the whole fp32 model on its host
        built: Any = Transformer(ModelArgs.from_resolved(spec.model.resolved()))
    else:
        built = build_model_parts(spec, LLAMA, dims=dims, mesh=mesh, device=device)
    peak = _status_kib("VmHWM")
    del built
    return (peak - before) * 1024


def test_building_at_zero3_holds_far_less_than_the_whole_model() -> None:
    params = JobSpec.model_validate({"name": "big", "model": BIG_MODEL}).model.parameter_count()
    assert 150e6 < params < 250e6
    whole = on_ranks(partial(build_peak_bytes, True), world_size=1)[0]
    sharded = max(on_ranks(partial(build_peak_bytes, False), world_size=4))
    report = (
        f"peak RSS rise while building {params / 1e6:.0f}M parameters: one process, whole: "
        f"{whole / 2**20:.0f} MiB; dp=4 zero-3, busiest rank: {sharded / 2**20:.0f} MiB"
    )
    print(report)
    log.info("%s", report)
    # The whole fp32 model is 4 bytes a parameter; a rank's quarter plus the largest
    # parameter is about a third of that.
    assert whole >= 0.9 * 4 * params
    assert sharded < 0.5 * whole, report
