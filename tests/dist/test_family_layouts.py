"""Every model family trains in sharded layouts exactly like one process: Llama 3.x with
rope scaling, a head size of its own and tied embeddings, Qwen2 with q/k/v biases and
tied embeddings, Qwen3 with q/k norms, Mistral with a sliding window shorter than the
sequence. Each layout is chosen where the family's switch meets the parallelism: a tied
head under FSDP, tensor parallelism and split between pipeline stages, biases and q/k
norms split over heads, the window under sequence parallelism and across pipeline
stages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardline.workers.engine.launch import LocalCheckpoints
from tests.dist.runs import run, tiny_spec
from tests.dist.test_checkpoint import (
    SAVED,
    assert_resumes_exactly,
    folder_with_step,
    layout_spec,
    train,
)
from tests.dist.test_layouts import TRAIN, assert_memory_model_holds, assert_same_training
from tests.support.hf_models import SHORT_LLAMA3_ROPE

# The tiny preset's shape (dim 128, 4 heads, 2 kv heads, 4 layers) as each family.
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {
        "family": "llama",
        "head_dim": 48,
        "tie_embeddings": True,
        "rope_scaling": SHORT_LLAMA3_ROPE,
    },
    "qwen2": {"family": "qwen2", "tie_embeddings": True},
    "qwen3": {"family": "qwen3", "head_dim": 48},
    "mistral": {"family": "mistral", "sliding_window": 16},
}
CASES: list[tuple[str, dict[str, Any]]] = [
    ("llama", {"dp": 2, "zero_stage": 3}),
    ("llama", {"dp": 2, "tp": 2, "zero_stage": 1}),
    # The tied head's two copies on the first and last stages.
    ("llama", {"pp": 2, "dp": 2, "tp": 2, "zero_stage": 2}),
    ("qwen2", {"pp": 2, "pp_schedule": "interleaved_1f1b", "pp_virtual_stages": 2}),
    ("qwen2", {"tp": 2, "sequence_parallel": True}),
    ("qwen2", {"dp": 2, "tp": 2, "zero_stage": 3}),
    ("qwen3", {"tp": 2}),
    ("qwen3", {"pp": 2, "dp": 2, "tp": 2, "zero_stage": 2}),
    ("mistral", {"tp": 2, "sequence_parallel": True}),
    ("mistral", {"pp": 2, "pp_schedule": "interleaved_1f1b", "pp_virtual_stages": 2}),
]
_single: dict[str, list[dict[str, Any]]] = {}


def single_process(family: str) -> list[dict[str, Any]]:
    if family not in _single:
        _single[family] = run(tiny_spec(model=FAMILIES[family], train=TRAIN))[0]
    return _single[family]


@pytest.mark.parametrize(
    ("family", "layout"),
    CASES,
    ids=[f"{f}-" + "-".join(f"{k}{v}" for k, v in layout.items()) for f, layout in CASES],
)
def test_family_trains_in_layout_like_one_process(family: str, layout: dict[str, Any]) -> None:
    spec = tiny_spec(model=FAMILIES[family], parallel=layout, train=TRAIN)
    metrics, _ = run(spec)
    assert_same_training(metrics, single_process(family))
    assert_memory_model_holds(spec, metrics[-1]["mem_bytes"])


@pytest.mark.parametrize(
    "layout", [{"dp": 2, "tp": 2, "zero_stage": 3}, {"pp": 2, "dp": 2, "zero_stage": 1}], ids=str
)
def test_tied_embeddings_resume_exactly_and_restore_into_another_layout(
    layout: dict[str, Any], tmp_path: Path
) -> None:
    """A tied head restores into both its uses, whether the checkpoint holds it as one
    tensor (one stage) or as two copies (a pipeline): a run stopped and resumed, and its
    checkpoint continued in one process, train as if never stopped."""
    model = FAMILIES["qwen2"]
    want = assert_resumes_exactly(layout_spec(layout, model=model), tmp_path)
    folder = folder_with_step(tmp_path / "straight", SAVED, tmp_path / "moved")
    elsewhere, _ = train(layout_spec({}, model=model), LocalCheckpoints(folder, resume=True))
    for m in elsewhere:
        assert m["loss"] == pytest.approx(want[m["step"]], rel=1e-4), f"step {m['step']}"
