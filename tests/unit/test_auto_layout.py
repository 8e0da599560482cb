"""`parallel: auto`: the spec's short form and bounds, and the choice among layouts."""

from __future__ import annotations

from typing import cast

import pytest
from pydantic import ValidationError

from shardline.service.layout_planning import NoLayout, admissible_ranks, choose_layout, pick_layout
from shardline.service.runtime import ClusterInfo, Runtime
from shardline.workers.contract.events import EventKind
from shardline.workers.contract.rates import DEFAULT_RATES
from shardline.workers.contract.spec import JobSpec


def spec(parallel: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "auto",
            "model": {"preset": "tiny", "seq_len": 64},
            "parallel": parallel,
            "train": {"steps": 4, "global_batch_size": 8, "micro_batch_size": 2},
        }
    )


def test_auto_is_short_for_auto_true_and_bounds_need_it() -> None:
    assert spec("auto").parallel.auto
    assert spec({"auto": True, "max_tp": 1}).parallel.max_tp == 1
    with pytest.raises(ValidationError, match=r"set parallel\.auto: true, or drop them"):
        spec({"max_tp": 2})


def test_the_choice_is_the_fastest_within_the_bounds() -> None:
    rates = DEFAULT_RATES["cpu"]
    chosen, event = pick_layout(spec({"auto": True, "max_tp": 1, "max_pp": 1}), [4], rates)
    par = chosen.parallel
    assert (par.dp, par.tp, par.pp, par.auto) == (4, 1, 1, False)
    assert event.kind == EventKind.PLANNED
    assert event.message.startswith("layout chosen: dp=4 tp=1 pp=1")
    assert "runner-up" in event.message and event.data["ranks"] == 4
    free, _ = pick_layout(spec("auto"), [4], rates)
    assert free.parallel.world_size == 4 and not free.parallel.auto


def test_the_chosen_layout_keeps_the_specs_gradient_compression() -> None:
    wanted = {"auto": True, "grad_compression": {"kind": "bf16"}}
    chosen, _ = pick_layout(spec(wanted), [4], DEFAULT_RATES["cpu"])
    assert chosen.parallel.grad_compression.kind == "bf16"
    assert chosen.parallel.world_size == 4


def test_no_legal_layout_is_said() -> None:
    with pytest.raises(NoLayout, match="no legal layout that fits on up to 3 ranks"):
        pick_layout(spec("auto"), [3], DEFAULT_RATES["cpu"])  # 8 rows do not split in 3


def test_auto_refuses_a_layout_given_beside_it() -> None:
    with pytest.raises(ValidationError, match=r"drop parallel\.dp, parallel\.zero_stage"):
        spec({"auto": True, "dp": 2, "zero_stage": 1})


class EightFreeCpus:
    """A cluster with 8 free CPUs that refuses nothing (the halving's other input)."""

    def cluster(self) -> ClusterInfo:
        return ClusterInfo("fake", True, "", {"CPU": 8.0}, {"CPU": 8.0})

    def refusal(self, spec: JobSpec) -> str | None:
        return None


def test_free_ranks_are_capped_by_the_users_quota() -> None:
    runtime = cast(Runtime, EightFreeCpus())
    assert admissible_ranks(spec("auto"), runtime) == 8
    assert admissible_ranks(spec("auto"), runtime, {"CPU": 3.0}) == 3
    chosen, _ = choose_layout(spec("auto"), runtime, {"CPU": 2.0})
    assert chosen.parallel.world_size <= 2
