"""Training on records: the loss on assistant turns only, packed documents that never
see each other, one loss however the batch is split, every layout like one process, and
a stopped chat job that continues exactly."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.launch import LocalCheckpoints
from tests.dist.runs import run, tiny_spec
from tests.dist.test_checkpoint import (
    CHECKPOINT,
    SAVED,
    STEPS,
    assert_resumes_exactly,
    folder_with_step,
    train,
)
from tests.support.records import PLAIN_CHAT, noise_chats, write_jsonl, write_parquet

ALPHABET = "abcdefghijklmnop"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("records")
    chats = noise_chats(400)
    write_jsonl(chats, folder / "chats.jsonl")
    write_parquet(chats, folder / "chats.parquet")
    rng = random.Random(1)
    pairs, joined = [], []
    for _ in range(400):
        text = "".join(rng.choice(ALPHABET) for _ in range(16))
        pairs += [{"text": text}, {"text": text}]
        joined.append({"text": text + text})
    write_jsonl(pairs, folder / "pairs.jsonl")
    write_jsonl(joined, folder / "joined.jsonl")
    return folder


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDLINE_CACHE_DIR", str(tmp_path / "cache"))


def chat_spec(
    corpus: Path, parallel: dict[str, Any] | None = None, checkpoint: bool = False, **train: Any
) -> JobSpec:
    return tiny_spec(
        checkpoint=CHECKPOINT if checkpoint else {},
        data={
            "source": "records",
            "path": str(corpus / "chats.jsonl"),
            "format": "chat",
            "chat_template": PLAIN_CHAT,
        },
        parallel=parallel or {},
        train={"eval_every": 5, **train},
    )


def test_the_loss_is_on_assistant_turns_only(corpus: Path) -> None:
    """User turns are random letters and the reply is always the same: trained on the
    reply alone the loss goes to zero; trained on the whole conversation it cannot."""
    replies, _ = run(chat_spec(corpus, steps=40, log_every=5, eval_every=0))
    whole = chat_spec(corpus, steps=40, log_every=5, eval_every=0)
    whole = whole.model_copy(
        update={"data": whole.data.model_copy(update={"train_on_prompt": True})}
    )
    everything, _ = run(whole)
    assert replies[-1]["loss"] < 0.05
    assert everything[-1]["loss"] > 1.0
    assert all(m["loss_tokens"] < m["tokens"] / 3 for m in replies)
    assert all(m["loss_tokens"] == pytest.approx(m["tokens"], rel=0.1) for m in everything)


def test_packed_documents_never_see_each_other(corpus: Path) -> None:
    """Each record repeats the one before it, side by side in the same rows: the second
    copy is predictable only by looking across documents, so the loss stays at the floor
    of random letters. The same letters as one document each learn the copy."""
    floor = math.log(len(ALPHABET))

    def tail_loss(name: str) -> float:
        data = {"source": "records", "path": str(corpus / name), "shuffle": False}
        metrics, _ = run(tiny_spec(data=data, train={"steps": 100, "log_every": 5}))
        return sum(m["loss"] for m in metrics[-5:]) / 5

    assert tail_loss("pairs.jsonl") > 0.97 * floor
    assert tail_loss("joined.jsonl") < 0.8 * floor


def test_one_loss_however_the_batch_is_split(corpus: Path) -> None:
    """Rows hold different numbers of assistant tokens; the step's loss is the mean over
    all of them at dp=2 x micro 2 as at dp=1 x micro 8."""
    split, _ = run(chat_spec(corpus, {"dp": 2}, micro_batch_size=2))
    whole, _ = run(chat_spec(corpus, micro_batch_size=8))
    for a, b in zip(split, whole, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6), a["step"]
        assert (a["tokens"], a["loss_tokens"]) == (b["tokens"], b["loss_tokens"])


@pytest.fixture(scope="module")
def one_process(corpus: Path) -> list[dict[str, Any]]:
    return run(chat_spec(corpus))[0]


@pytest.mark.parametrize(
    "layout",
    [
        {"dp": 2, "zero_stage": 3},
        {"tp": 2, "sequence_parallel": True},
        {"pp": 2, "pp_schedule": "interleaved_1f1b", "pp_virtual_stages": 2},
    ],
    ids=str,
)
def test_a_chat_job_trains_in_each_layout_like_one_process(
    corpus: Path, one_process: list[dict[str, Any]], layout: dict[str, Any]
) -> None:
    metrics, _ = run(chat_spec(corpus, layout))
    for got, want in zip(metrics, one_process, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-4), got["step"]
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4), got["step"]
        if "val_loss" in want:
            assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-4), got["step"]


def test_parquet_and_json_lines_train_identically(
    corpus: Path, one_process: list[dict[str, Any]]
) -> None:
    spec = chat_spec(corpus)
    spec = spec.model_copy(
        update={"data": spec.data.model_copy(update={"path": str(corpus / "chats.parquet")})}
    )
    metrics, _ = run(spec)
    assert [m["loss"] for m in metrics] == [m["loss"] for m in one_process]


def test_a_stopped_chat_job_continues_exactly_and_in_another_layout(
    corpus: Path, tmp_path: Path
) -> None:
    want = assert_resumes_exactly(chat_spec(corpus, {"dp": 2}, checkpoint=True, steps=STEPS), tmp_path)
    folder = folder_with_step(tmp_path / "straight", SAVED, tmp_path / "moved")
    alone = chat_spec(corpus, {"tp": 2}, checkpoint=True, steps=STEPS)
    elsewhere, _ = train(alone, LocalCheckpoints(folder, resume=True))
    assert [m["step"] for m in elsewhere] == list(range(SAVED + 1, STEPS + 1))
    for m in elsewhere:
        assert m["loss"] == pytest.approx(want[m["step"]], rel=1e-4), m["step"]
