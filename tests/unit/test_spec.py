"""Every JobSpec rule rejects bad input with a message naming the field and the fix."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from shardline.workers.contract.spec import JobSpec, describe_errors


def spec(**sections: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "t", **sections})


def rejected(**sections: Any) -> str:
    with pytest.raises(ValidationError) as err:
        spec(**sections)
    return "\n".join(describe_errors(err.value))


def test_defaults_are_valid_and_resolve_the_tiny_preset() -> None:
    s = spec()
    assert s.model.resolved() == {
        "dim": 128,
        "n_layers": 4,
        "n_heads": 4,
        "n_kv_heads": 2,
        "vocab_size": 256,
        "seq_len": 128,
        "ffn_dim": 352,
        "head_dim": 32,
        "tie_embeddings": False,
        # What the Llama family fixes: no biases on q/k/v, no norms on q/k.
        "qkv_bias": False,
        "qk_norm": False,
    }
    assert s.parallel.world_size == 1 and s.accumulation_steps == 4


def test_fields_override_the_preset() -> None:
    assert spec(model={"preset": "1b", "seq_len": 512}).model.resolved()["seq_len"] == 512


def test_importing_the_spec_does_not_import_torch_or_ray() -> None:
    code = "import sys, workers.contract.spec; print('torch' in sys.modules, 'ray' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False False"


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"model": {"preset": "huge"}}, "model.preset='huge' is unknown; choose one of tiny"),
        ({"model": {"dim": 130}}, "model.dim=130 is not divisible by model.n_heads=4"),
        ({"model": {"dim": 12, "n_heads": 4}}, "model.dim / model.n_heads = 3 must be even"),
        ({"model": {"n_kv_heads": 3}}, "model.n_kv_heads=3 must divide model.n_heads=4"),
        (
            {"model": {"n_layers": 5}, "parallel": {"pp": 2}, "train": {"global_batch_size": 4}},
            "model.n_layers=5 is not divisible by parallel.pp=2",
        ),
        (
            {
                "parallel": {"pp": 2, "pp_schedule": "interleaved_1f1b", "pp_virtual_stages": 4},
                "model": {"n_layers": 4},
            },
            "model.n_layers=4 is not divisible by parallel.pp x parallel.pp_virtual_stages=8",
        ),
        ({"parallel": {"tp": 8}}, "parallel.tp=8 must divide model.n_heads=4"),
        (
            {"parallel": {"tp": 2}, "model": {"vocab_size": 257}},
            "model.vocab_size=257 is not divisible by parallel.tp=2",
        ),
        (
            {"parallel": {"dp": 3}},
            "train.global_batch_size=8 is not divisible by "
            "train.micro_batch_size x parallel.dp = 2 x 3 = 6; make it a multiple of 6",
        ),
        (
            {"parallel": {"pp": 4}, "train": {"global_batch_size": 4, "micro_batch_size": 2}},
            "with parallel.pp=4 the pipeline needs at least 4 micro-batches",
        ),
        (
            {"parallel": {"pp_schedule": "interleaved_1f1b"}},
            "needs parallel.pp_virtual_stages >= 2",
        ),
        ({"parallel": {"pp_virtual_stages": 2}}, "needs parallel.pp_schedule='interleaved_1f1b'"),
        ({"parallel": {"sequence_parallel": True}}, "parallel.sequence_parallel needs"),
        ({"parallel": {"zero_stage": 4}}, "parallel.zero_stage: Input should be less than"),
        ({"train": {"min_lr": 1.0, "lr": 0.1}}, "train.min_lr=1.0 is above train.lr=0.1"),
        (
            {"train": {"steps": 10, "warmup_steps": 20}},
            "train.warmup_steps=20 exceeds train.steps=10",
        ),
        ({"train": {"steps": -1}}, "train.steps: Input should be greater than or equal to 1"),
        ({"train": {"steps": 10**12}}, "train.steps: Input should be less than or equal"),
        ({"data": {"source": "text"}}, "data.path is required when data.source='text'"),
        (
            {"data": {"source": "tokens", "path": "x.bin", "tokenizer": "t.json"}},
            "data.tokenizer does not apply to data.source='tokens'",
        ),
        (
            {"data": {"source": "text", "path": "x"}, "model": {"vocab_size": 128}},
            "model.vocab_size=128 is too small for data.tokenizer='byte'",
        ),
        ({"data": {"val_fraction": 0.9}}, "data.val_fraction: Input should be less than"),
        ({"precision": "fp8"}, "precision: Input should be 'fp32', 'bf16' or 'fp16'"),
        ({"model": {"layers": 3}}, "model.layers: unknown field; did you mean `model.n_layers`?"),
        ({"resources": {"cpus_per_worker": 0}}, "resources.cpus_per_worker: Input should be"),
        (
            {"train": {"activation_checkpointing": "some"}},
            "train.activation_checkpointing: Input should be 'none', 'full' or 'selective'",
        ),
    ],
)
def test_rule_rejects_with_message(sections: dict[str, Any], message: str) -> None:
    assert message in rejected(**sections)


def test_name_is_required_and_restricted() -> None:
    with pytest.raises(ValidationError, match="name"):
        JobSpec.model_validate({})
    assert "name: use only letters, digits" in rejected(name="../etc")


def test_world_size_must_match_the_layout() -> None:
    with pytest.raises(
        ValueError,
        match=r"parallel: dp\*tp\*pp = 2\*3\*1 = 6 but the job runs "
        r"on 4 processes",
    ):
        spec(
            parallel={"dp": 2, "tp": 3},
            model={"n_heads": 6, "n_kv_heads": 6, "dim": 192, "vocab_size": 258},
        ).check_world_size(4)


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        (
            {
                "parallel": {"pp": 2, "pp_schedule": "interleaved_1f1b", "pp_virtual_stages": 2},
                "train": {"global_batch_size": 6, "micro_batch_size": 2},
            },
            "the micro-batches per step (3) must be a multiple of parallel.pp=2",
        ),
        (
            {"model": {"n_kv_heads": 1}, "parallel": {"tp": 2}},
            "parallel.tp=2 must divide model.n_heads=4 and model.n_kv_heads=1",
        ),
    ],
)
def test_layout_rules_for_tensor_and_pipeline_parallel(
    sections: dict[str, Any], message: str
) -> None:
    assert message in rejected(**sections)


def test_every_zero_stage_composes_with_tensor_and_pipeline_parallel() -> None:
    for zero in range(4):
        assert spec(parallel={"pp": 2, "dp": 2, "tp": 2, "zero_stage": zero}).parallel.tp == 2


def test_resume_from_names_a_job_and_optionally_a_step() -> None:
    assert spec(resume_from={"job_id": "abc123"}).resume_from.step is None  # type: ignore[union-attr]
    assert "resume_from.step" in rejected(resume_from={"job_id": "abc123", "step": 0})
    assert "resume_from.job_id" in rejected(resume_from={"job_id": "../x"})
