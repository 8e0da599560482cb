"""Batches that depend only on (seed, step), never on the parallel layout.

The global batch of step s is `global_batch_size` windows of `seq_len + 1` tokens whose
offsets are drawn from a generator seeded with (seed, s). A data-parallel rank takes its
contiguous slice of those rows. So every layout sees the same data in the same order, and
resuming at step s needs nothing but s, which is the loader's whole position
(`state_dict()`, saved with every checkpoint as torchdata's StatefulDataLoader's is).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shardline.workers.contract.sections import DataSource
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.data.batch import EVAL_BATCHES, Batch, Loader
from shardline.workers.engine.data.record_loader import record_loader
from shardline.workers.engine.data.sources import load_tokens
from shardline.workers.storage.skipped_batches import batch_index

log = logging.getLogger(__name__)

_VAL_STREAM = 0x7FFF_FFFF


@dataclass
class BatchLoader:
    """Train and validation batches for one data-parallel rank."""

    tokens: np.ndarray
    seq_len: int
    global_batch_size: int
    dp_rank: int
    dp_size: int
    seed: int
    val_fraction: float
    vocab_size: int
    # Batches skipped after a non-finite loss (workers/storage/skipped_batches.py).
    skipped_batches: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        window = self.seq_len + 1
        n_val = int(len(self.tokens) * self.val_fraction)
        self.train_tokens = self.tokens[: len(self.tokens) - n_val]
        self.val_tokens = self.tokens[len(self.tokens) - n_val :]
        if len(self.train_tokens) < window:
            raise ValueError(
                f"data: the training split has {len(self.train_tokens)} tokens, fewer than "
                f"model.seq_len + 1 = {window}; add data or shorten seq_len"
            )
        if n_val and len(self.val_tokens) < window:
            raise ValueError(
                f"data: the held-out split has {n_val} tokens; raise data.val_fraction or add "
                f"data (validation needs at least model.seq_len + 1 = {window})"
            )
        self.rows_per_rank = self.global_batch_size // self.dp_size
        self.step = 0  # the last step whose batch was taken: the loader's position

    @property
    def has_validation(self) -> bool:
        return len(self.val_tokens) > self.seq_len

    def _batch(self, split: np.ndarray, stream: list[int], slot: int | None = None) -> Batch:
        rows = self._rows(split, stream, slot)
        return Batch(rows, self.global_batch_size * self.seq_len)

    def _rows(self, split: np.ndarray, stream: list[int], slot: int | None = None) -> torch.Tensor:
        rng = np.random.default_rng(stream)
        offsets = rng.integers(0, len(split) - self.seq_len, size=self.global_batch_size)
        slot = self.dp_rank if slot is None else slot
        mine = offsets[slot * self.rows_per_rank : (slot + 1) * self.rows_per_rank]
        rows = np.stack([split[o : o + self.seq_len + 1] for o in mine]).astype(np.int64)
        if rows.max(initial=0) >= self.vocab_size:
            # Never the id itself: it is a piece of the file, which may not be the user's.
            raise ValueError(
                f"data: a token id is out of range for model.vocab_size={self.vocab_size}; "
                "the data was tokenized with a larger vocabulary"
            )
        return torch.from_numpy(rows)

    def batch_of(self, step: int) -> int:
        """The batch index step `step` trains (`step` itself unless batches were skipped)."""
        return batch_index(step, self.skipped_batches)

    def train_batch(self, step: int) -> Batch:
        """This rank's rows of the global batch of `step`."""
        self.step = step
        return self._batch(self.train_tokens, [self.seed, self.batch_of(step)])

    def slot_batch(self, step: int, slot: int) -> Batch:
        """Data-parallel rank `slot`'s rows of step `step`'s global batch, whichever rank
        trains them (asynchronous replicas take each slot of each step once)."""
        self.step = max(self.step, step)
        return self._batch(self.train_tokens, [self.seed, self.batch_of(step)], slot)

    def val_batches(self) -> list[Batch]:
        """The fixed held-out batches, this rank's rows of each."""
        return [
            self._batch(self.val_tokens, [self.seed, _VAL_STREAM, i]) for i in range(EVAL_BATCHES)
        ]

    # -- the position a checkpoint holds ------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: the last step whose batch it gave (the next is that + 1)."""
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def build_loader(
    spec: JobSpec, dp_rank: int, dp_size: int, *, skipped_batches: tuple[int, ...] = ()
) -> Loader:
    """The job's loader for data-parallel rank `dp_rank` of `dp_size`; `skipped_batches`:
    the batches it skips after a non-finite loss (workers/storage/skipped_batches.py)."""
    model = spec.model.resolved()
    if spec.data.source == DataSource.records:
        return record_loader(spec, dp_rank, dp_size, skipped_batches)
    return BatchLoader(
        tokens=load_tokens(spec),
        seq_len=model["seq_len"],
        global_batch_size=spec.train.global_batch_size,
        dp_rank=dp_rank,
        dp_size=dp_size,
        seed=spec.train.seed,
        val_fraction=spec.data.val_fraction,
        vocab_size=model["vocab_size"],
        skipped_batches=skipped_batches,
    )
