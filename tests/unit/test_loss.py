"""The loss is a sum over the targets that count and their count, so the trainer's
average over a global batch is exact however the batch is cut into micro-batches, ranks
and pipeline stages, with a loss mask too."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardline.workers.engine.loss import IGNORE_INDEX, token_loss


def _batch(rows: int = 8, seq: int = 6, vocab: int = 11) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, seq, vocab, generator=g), torch.randint(
        0, vocab, (rows, seq), generator=g
    )


def test_without_a_mask_the_sum_over_the_count_is_the_mean_bit_for_bit() -> None:
    logits, targets = _batch()
    total, count = token_loss(logits, targets)
    assert count == targets.numel()
    mean = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    assert torch.equal(total / count, mean)


def test_a_mask_counts_only_the_targets_it_keeps() -> None:
    logits, targets = _batch()
    mask = torch.zeros_like(targets, dtype=torch.bool)
    mask[:, 3:] = True  # e.g. the assistant's turn only
    total, count = token_loss(logits, targets, mask)
    assert int(count) == int(mask.sum())
    kept = F.cross_entropy(logits[mask], targets[mask], reduction="sum")
    assert torch.allclose(total, kept)
    # The masked targets themselves are left as they were.
    assert (targets != IGNORE_INDEX).all()


def test_a_masked_batch_averages_the_same_however_it_is_split() -> None:
    """Rows with very different numbers of loss tokens: a mean of per-micro-batch means
    would weigh a token of a short answer more; sums over the global count do not."""
    logits, targets = _batch(rows=8)
    mask = torch.zeros_like(targets, dtype=torch.bool)
    for row, keep in enumerate([1, 6, 2, 5, 3, 6, 1, 4]):
        mask[row, -keep:] = True
    whole_sum, whole_count = token_loss(logits, targets, mask)
    whole = whole_sum / whole_count
    for micro in (1, 2, 4):
        parts = [
            token_loss(logits[i : i + micro], targets[i : i + micro], mask[i : i + micro])
            for i in range(0, 8, micro)
        ]
        split = torch.stack([s for s, _ in parts]).sum() / whole_count
        assert torch.allclose(split, whole, rtol=1e-6)
    means = torch.stack(
        [
            s / c
            for s, c in (
                token_loss(logits[i : i + 2], targets[i : i + 2], mask[i : i + 2])
                for i in range(0, 8, 2)
            )
        ]
    ).mean()
    assert not torch.allclose(means, whole, rtol=1e-3)  # why the sum: the mean of means is off
