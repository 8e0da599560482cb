"""The planner over a small model: legal layouts only, each one a spec, ranked."""

from __future__ import annotations

import time

import pytest

from shardline.workers.contract.cost_model import predict
from shardline.workers.contract.planner import plan
from shardline.workers.contract.rates import DEFAULT_RATES
from shardline.workers.contract.spec import JobSpec


def tiny(**train: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "plan",
            "model": {"preset": "tiny", "seq_len": 64},
            "train": {"steps": 10, "global_batch_size": 8, "micro_batch_size": 2, **train},
        }
    )


def test_every_planned_layout_drops_into_the_spec_and_validates() -> None:
    spec = tiny()
    planned = plan(spec, 4, DEFAULT_RATES["cpu"])
    assert planned
    worlds = set()
    for item in (p.to_json() for p in planned):
        data = spec.model_dump(mode="json")
        data["parallel"] = item["parallel"]
        data["train"].update(item["train"])
        layout = JobSpec.model_validate(data)  # a legal spec, as the item says
        worlds.add(layout.parallel.world_size)
        assert item["predicted"]["step_s"] > 0
    assert worlds == {4}
    steps = [p.predicted.step_s for p in planned]
    assert steps == sorted(steps)  # fastest first (all fit: no memory given)
    # tiny has 4 layers, 4 heads and 2 kv heads: tp=4 cannot hold whole kv heads.
    assert {p.spec.parallel.tp for p in planned} == {1, 2}


def test_layouts_that_do_not_fit_come_last() -> None:
    spec = tiny()
    roomy = plan(spec, 4, DEFAULT_RATES["cpu"])
    limit = sorted(p.predicted.peak_bytes_per_rank for p in roomy)[len(roomy) // 2]
    planned = plan(spec, 4, DEFAULT_RATES["cpu"], device_memory=limit)
    fits = [p.fits for p in planned]
    assert True in fits and False in fits
    assert fits == sorted(fits, reverse=True)
    assert all((p.predicted.peak_bytes_per_rank <= limit) == p.fits for p in planned)


def test_the_terms_move_the_way_the_choices_say() -> None:
    rates = DEFAULT_RATES["h100"]
    spec = tiny().model_copy(deep=True)
    base = predict(spec, rates)
    full_ac = predict(tiny(activation_checkpointing="full"), rates)
    assert full_ac.terms["compute_s"] > base.terms["compute_s"]
    assert full_ac.terms["activation_bytes"] < base.terms["activation_bytes"]
    one_f_one_b = JobSpec.model_validate({**spec.model_dump(mode="json"), "parallel": {"pp": 2}})
    gpipe = JobSpec.model_validate(
        {**spec.model_dump(mode="json"), "parallel": {"pp": 2, "pp_schedule": "gpipe"}}
    )
    assert predict(gpipe, rates).terms["bubble_s"] > 0
    # GPipe keeps every micro-batch's activations; 1F1B at most pp of them.
    assert (
        predict(gpipe, rates).terms["activation_bytes"]
        > predict(one_f_one_b, rates).terms["activation_bytes"]
    )


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("pp", "micro_batches"), [(2, 2), (2, 8), (4, 4), (4, 16)])
def test_a_pipeline_s_step_lasts_its_schedule_s_slots(
    schedule: str, pp: int, micro_batches: int
) -> None:
    """GPipe and 1F1B run m micro-batches through pp stages in m + pp - 1 slots of one
    stage's micro-batch: the compute a rank does (m slots) plus pp - 1 idle slots. The
    predicted step is that, plus its communication and optimizer pass."""
    spec = JobSpec.model_validate(
        {
            "name": "pipe",
            "model": {"preset": "tiny", "n_layers": 4},
            "parallel": {"pp": pp, "pp_schedule": schedule},
            "train": {"global_batch_size": micro_batches, "micro_batch_size": 1},
        }
    )
    predicted = predict(spec, DEFAULT_RATES["h100"])
    terms = predicted.terms
    slot = terms["compute_s"] / micro_batches
    pipeline = predicted.step_s - terms["comm_s"] - terms["optimizer_s"]
    assert pipeline == pytest.approx((micro_batches + pp - 1) * slot, rel=1e-9)


def test_sixty_four_ranks_of_the_1b_preset_plan_quickly() -> None:
    spec = JobSpec.model_validate(
        {"name": "big", "model": {"preset": "1b"}, "train": {"global_batch_size": 256}}
    )
    start = time.monotonic()
    planned = plan(spec, 64, DEFAULT_RATES["h200"], ranks_per_node=8, device_memory=80 << 30)
    elapsed = time.monotonic() - start
    assert len(planned) > 1000
    assert elapsed < 3.0  # 0.34 s on the development machine; a loaded CI host is slower
    best = planned[0]
    assert best.fits and best.spec.parallel.world_size == 64
    assert pytest.approx(best.predicted.tokens_per_s) == 256 * 2048 / best.predicted.step_s
