"""Batches that depend only on (seed, step), never on the parallel layout.

The global batch of step s is `global_batch_size` windows of `seq_len + 1` tokens whose
offsets are drawn from a generator seeded with (seed, s). A data-parallel rank takes its
contiguous slice of those rows. So every layout sees the same data in the same order, and
resuming at step s needs nothing but s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from workers.contract.data_access import DataAccess
from workers.contract.sections import DataSource
from workers.contract.spec import JobSpec
from workers.engine.corpus import bin_tokens, synthetic_tokens, text_tokens
from workers.engine.tokenizer import load_tokenizer
from workers.storage.skipped_batches import batch_index

log = logging.getLogger(__name__)

# Validation always uses this many global batches from the held-out split.
EVAL_BATCHES = 4
_VAL_STREAM = 0x7FFF_FFFF


def load_corpus(spec: JobSpec, access: DataAccess | None = None) -> np.ndarray:
    """The job's whole token stream (train and held-out) as a 1-D array.

    Files are read under `access`, by default the rules the service put in this process's
    environment (none for `shardline train` on one machine)."""
    access = access or DataAccess.from_env()
    vocab_size = spec.model.resolved()["vocab_size"]
    data = spec.data
    if data.source == DataSource.synthetic:
        return synthetic_tokens(vocab_size, spec.train.seed)
    assert data.path is not None  # the spec requires it for these sources
    if data.source == DataSource.text:
        tokenizer = load_tokenizer(data.tokenizer, access)
        return text_tokens(Path(data.path), tokenizer, vocab_size, access)
    return bin_tokens(Path(data.path), vocab_size, access)


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

    @property
    def has_validation(self) -> bool:
        return len(self.val_tokens) > self.seq_len

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

    def train_batch(self, step: int) -> torch.Tensor:
        """This rank's rows of the global batch of `step`: (rows, seq_len + 1) token ids."""
        return self._rows(self.train_tokens, [self.seed, self.batch_of(step)])

    def slot_batch(self, step: int, slot: int) -> torch.Tensor:
        """Data-parallel rank `slot`'s rows of step `step`'s global batch, whichever rank
        trains them (asynchronous replicas take each slot of each step once)."""
        return self._rows(self.train_tokens, [self.seed, self.batch_of(step)], slot)

    def val_batches(self) -> list[torch.Tensor]:
        """The fixed held-out batches, this rank's rows of each."""
        return [
            self._rows(self.val_tokens, [self.seed, _VAL_STREAM, i]) for i in range(EVAL_BATCHES)
        ]


def build_loader(spec: JobSpec, dp_rank: int, dp_size: int) -> BatchLoader:
    model = spec.model.resolved()
    return BatchLoader(
        tokens=load_corpus(spec),
        seq_len=model["seq_len"],
        global_batch_size=spec.train.global_batch_size,
        dp_rank=dp_rank,
        dp_size=dp_size,
        seed=spec.train.seed,
        val_fraction=spec.data.val_fraction,
        vocab_size=model["vocab_size"],
    )
