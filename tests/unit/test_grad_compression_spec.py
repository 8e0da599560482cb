"""parallel.grad_compression: what each kind accepts, and what it refuses with a fix."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from shardline.workers.contract.planner import plan
from shardline.workers.contract.rates import DEFAULT_RATES, Rates
from shardline.workers.contract.sections import ParallelSpec
from shardline.workers.contract.spec import JobSpec


def refusal(**parallel: Any) -> str:
    with pytest.raises(ValidationError) as err:
        ParallelSpec.model_validate(parallel)
    return str(err.value)


@pytest.mark.parametrize(
    "layout", [{"dp": 2, "tp": 2}, {"dp": 2, "pp": 2}, {"dp": 2, "zero_stage": 2}, {"auto": True}]
)
def test_powersgd_is_refused_where_ddp_does_not_train(layout: dict[str, Any]) -> None:
    message = refusal(**layout, grad_compression={"kind": "powersgd"})
    assert "runs as DDP's communication hook" in message
    assert "use kind 'bf16'" in message


def test_powersgd_options_with_another_kind_are_refused() -> None:
    message = refusal(dp=2, grad_compression={"kind": "bf16", "rank": 8})
    assert "parallel.grad_compression.rank applies only to kind 'powersgd'" in message
    assert "warmup_steps" in refusal(dp=2, grad_compression={"warmup_steps": 50})


def test_bounds_and_unknown_kinds_name_the_field() -> None:
    assert "'none', 'bf16' or 'powersgd'" in refusal(grad_compression={"kind": "1bit"})
    # PyTorch's PowerSGD with error feedback needs at least 2 plain steps.
    assert "greater than or equal to 2" in refusal(
        dp=2, grad_compression={"kind": "powersgd", "warmup_steps": 1}
    )


def test_every_kind_survives_being_stored_and_read_back() -> None:
    """A stored spec is read back with every field set, defaults included."""
    for compression in ({}, {"kind": "bf16"}, {"kind": "powersgd", "rank": 2}):
        spec = JobSpec.model_validate(
            {"name": "c", "parallel": {"dp": 2, "grad_compression": compression}}
        )
        again = JobSpec.model_validate(spec.model_dump(mode="json"))
        assert again == spec


def test_bf16_is_accepted_on_every_layout_and_with_auto() -> None:
    for layout in ({"dp": 2, "tp": 2, "zero_stage": 3}, {"pp": 2, "dp": 2}, {"auto": True}):
        parsed = ParallelSpec.model_validate({**layout, "grad_compression": {"kind": "bf16"}})
        assert parsed.grad_compression.kind == "bf16"


def test_powersgd_with_fp16_is_refused() -> None:
    with pytest.raises(ValidationError, match="cannot take precision 'fp16'"):
        JobSpec.model_validate(
            {
                "name": "c",
                "precision": "fp16",
                "parallel": {"dp": 2, "grad_compression": {"kind": "powersgd"}},
            }
        )


def test_the_planner_offers_powersgd_jobs_only_layouts_they_can_train_in() -> None:
    """A re-plan must never hand the workers a spec they would refuse (zero 2/3)."""
    spec = JobSpec.model_validate(
        {
            "name": "c",
            "model": {"preset": "tiny", "seq_len": 64},
            "parallel": {"dp": 2, "grad_compression": {"kind": "powersgd"}},
            "train": {"global_batch_size": 8, "micro_batch_size": 2},
        }
    )
    planned = plan(spec, 4, DEFAULT_RATES["h100"])
    assert planned
    for p in planned:
        again = JobSpec.model_validate(p.spec.model_dump(mode="json"))
        assert again.parallel.zero_stage <= 1


def test_rates_written_by_a_newer_version_are_read() -> None:
    data = {**DEFAULT_RATES["cpu"].to_json(), "a_later_field": 1.0}
    assert Rates.from_json(data) == DEFAULT_RATES["cpu"]


def test_rates_written_by_an_older_version_take_the_device_defaults() -> None:
    data = {**DEFAULT_RATES["cpu"].to_json(), "flops_per_s": 1.0e9}
    del data["fsdp_resident_factor"]
    read = Rates.from_json(data)
    assert read.flops_per_s == 1.0e9
    assert read.fsdp_resident_factor == DEFAULT_RATES["cpu"].fsdp_resident_factor > 0
