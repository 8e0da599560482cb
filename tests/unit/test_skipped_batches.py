"""Skipping a batch after a non-finite loss: which batch each step trains, the record of
skips, and when the policy gives up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from shardline.workers.engine.data.loader import BatchLoader
from shardline.workers.runtime.supervisor.decisions import NonFinitePolicy
from shardline.workers.storage.skipped_batches import SkippedBatches, batch_index


def test_without_skips_step_s_trains_batch_s() -> None:
    assert [batch_index(s, []) for s in range(1, 6)] == [1, 2, 3, 4, 5]


def test_a_skip_shifts_every_later_step_to_the_next_batch_not_skipped() -> None:
    assert [batch_index(s, [3]) for s in range(1, 6)] == [1, 2, 4, 5, 6]
    # Skipping 3, then (at step 3, which then trained batch 4) batch 4 as well:
    assert [batch_index(s, [3, 4]) for s in range(1, 6)] == [1, 2, 5, 6, 7]
    # Order of the record does not matter; duplicates do not count twice.
    assert [batch_index(s, [4, 3, 3]) for s in range(1, 6)] == [1, 2, 5, 6, 7]


def test_the_loader_trains_the_shifted_batch() -> None:
    tokens = np.arange(10_000, dtype=np.int64) % 97

    def loader(skipped: tuple[int, ...]) -> BatchLoader:
        return BatchLoader(tokens, 8, 4, 0, 1, 5, 0.0, 97, skipped_batches=skipped)

    plain, skipping = loader(()), loader((3,))
    assert torch.equal(skipping.train_batch(2).tokens, plain.train_batch(2).tokens)
    assert torch.equal(skipping.train_batch(3).tokens, plain.train_batch(4).tokens)
    assert not torch.equal(skipping.train_batch(3).tokens, plain.train_batch(3).tokens)


def test_the_record_only_grows_and_survives_a_new_reader(tmp_path: Path) -> None:
    record = SkippedBatches(str(tmp_path / "checkpoints"))
    assert record.read() == [] and record.batches() == []
    record.add(7, 7)
    record.add(9, 10)
    again = SkippedBatches(str(tmp_path / "checkpoints"))
    assert again.read() == [{"step": 7, "batch": 7}, {"step": 9, "batch": 10}]
    assert again.batches() == [7, 10]
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


def test_policy_skips_up_to_the_limit_then_fails_naming_it() -> None:
    policy = NonFinitePolicy(2)
    first = policy.decide(5, float("nan"), 5, [])
    assert (
        first.skip and "skipping batch 5" in first.reason and "skip 1 of at most 2" in first.reason
    )
    past = [{"step": 5, "batch": 5}]
    assert policy.decide(8, float("inf"), 9, past).skip
    third = policy.decide(12, float("nan"), 14, [*past, {"step": 8, "batch": 9}])
    assert not third.skip
    assert "step 12" in third.reason and "max_nonfinite_skips=2" in third.reason


def test_a_loss_not_finite_again_at_the_same_step_fails_at_once() -> None:
    again = NonFinitePolicy(10).decide(5, float("nan"), 6, [{"step": 5, "batch": 5}])
    assert not again.skip
    assert "again after rolling back" in again.reason and "not retried" in again.reason


def test_no_skips_allowed_fails_the_first_time() -> None:
    decision = NonFinitePolicy(0).decide(3, float("nan"), 3, [])
    assert not decision.skip and "max_nonfinite_skips=0" in decision.reason
