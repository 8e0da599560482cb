"""Asynchronous data parallelism's pieces that need no world: how parameters are split
into shards, what a shard does with a stale gradient, and what the spec refuses."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from shardline.workers.contract.local_sgd import StalenessPolicy
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.experimental.async_dp import ParameterShard, plan_shards


def test_shards_serve_about_as_many_values_each_and_every_rank_plans_the_same() -> None:
    sizes = [1000, 10, 400, 400, 190, 5, 5]
    owner = plan_shards(sizes, 2)
    load = [sum(s for s, k in zip(sizes, owner, strict=True) if k == shard) for shard in (0, 1)]
    assert load == [1005, 1005]  # the largest, then each next onto the emptier
    assert plan_shards(sizes, 2) == owner
    assert plan_shards([3], 4) == [0]  # more shards than parameters: some serve nothing


def shard(policy: StalenessPolicy, max_staleness: int = 1) -> ParameterShard:
    weight = torch.nn.Parameter(torch.zeros(2, 2))
    return ParameterShard(
        [("w", weight)],
        lr=lambda step: 0.1,
        weight_decay=0.0,
        max_staleness=max_staleness,
        policy=policy,
    )


def test_a_gradient_staler_than_the_bound_is_dropped_and_counted() -> None:
    s = shard(StalenessPolicy.drop)
    ones = torch.ones(4)
    s.apply(ones, pulled=0, step=1)  # fresh
    s.apply(ones, pulled=0, step=1)  # one update old: within the bound
    before = s.masters[0].clone()
    s.apply(ones, pulled=0, step=1)  # two old: dropped
    assert s.version == 2
    assert torch.equal(s.masters[0], before)
    assert s.counts.take() == [2.0, 1.0, 0.0, 3.0, 2.0]  # applied, dropped, weighted, sum, max
    assert s.counts.take() == [0.0] * 5  # taken once


def test_a_gradient_staler_than_the_bound_can_be_down_weighted_instead() -> None:
    weighted = shard(StalenessPolicy.weight, max_staleness=0)
    plain = shard(StalenessPolicy.weight, max_staleness=100)
    for s in (weighted, plain):
        s.apply(torch.ones(4), pulled=0, step=1)
    # AdamW's first step moves by lr whatever the scale; the second shows the weight: a
    # gradient of half the size (staleness 1, bound 0) moves the parameters less.
    for s in (weighted, plain):
        s.apply(torch.ones(4), pulled=0, step=1)
    assert weighted.version == plain.version == 2
    assert weighted.counts.take()[2] == 1.0
    assert (weighted.masters[0] > plain.masters[0]).all()  # moved less (both go down)


def test_a_shard_reads_its_newest_parameters_flat_with_their_version() -> None:
    s = shard(StalenessPolicy.drop)
    out = torch.empty(4)
    assert s.read(out) == 0
    s.apply(torch.ones(4), pulled=0, step=1)
    assert s.read(out) == 1
    assert torch.equal(out, s.masters[0].reshape(-1))
    state = s.state_dict()
    assert sorted(state) == ["w.exp_avg", "w.exp_avg_sq", "w.step"]


ASYNC: dict[str, Any] = {
    "name": "async",
    "model": {"preset": "tiny", "seq_len": 32},
    "parallel": {"dp": 2, "dp_mode": "async"},
    "train": {"steps": 20, "global_batch_size": 4, "micro_batch_size": 2, "log_every": 5},
}


def with_(section: str, **values: Any) -> dict[str, Any]:
    return {**ASYNC, section: {**ASYNC.get(section, {}), **values}}


def test_an_async_spec_is_taken_with_its_staleness_settings() -> None:
    spec = JobSpec.model_validate(with_("parallel", max_staleness=3, staleness_policy="weight"))
    assert spec.parallel.max_staleness == 3


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (with_("train", log_every=1), "train.log_every=1"),
        (with_("parallel", tp=2), "set tp: 1 and pp: 1"),
        (with_("parallel", dp=1), "dp >= 2"),
        (with_("parallel", zero_stage=1), "zero_stage 0"),
        (with_("train", eval_every=7), "train.eval_every=7 is not a multiple of"),
        (with_("checkpoint", every_steps=3), "checkpoint.every_steps=3 is not a multiple"),
        (with_("parallel", grad_compression={"kind": "bf16"}), "drop parallel.grad_compression"),
        ({**ASYNC, "parallel": {"dp": 2, "max_staleness": 3}}, "set dp_mode: async"),
    ],
    ids=["log-every-1", "tp", "one-replica", "zero", "eval", "checkpoint", "compress", "not-async"],
)
def test_what_async_cannot_do_is_refused_with_the_fix(body: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        JobSpec.model_validate(body)
