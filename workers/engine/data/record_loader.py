"""Batches of records that depend only on (seed, step), never on the parallel layout.

The records' documents are shuffled once (seeded by train.seed, unless data.shuffle is
false), the last `val_fraction` of them held out whole, and each split packed into rows.
Step s trains rows (s - 1) * G .. s * G - 1 of the training rows (G = the global batch),
taken round and round; with shuffling, each pass after the first in an order drawn from
(seed, pass).
A data-parallel rank takes its contiguous slice. So the step is the loader's whole
position: a resumed, recovered or resharded job continues with the same rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.data.batch import EVAL_BATCHES, Batch
from shardline.workers.engine.data.documents import record_documents
from shardline.workers.engine.data.packing import PackedRows, pack
from shardline.workers.storage.skipped_batches import batch_index

log = logging.getLogger(__name__)

_SHUFFLE_STREAM = 0x5EC0
_PASS_STREAM = 0xE90C


@dataclass
class RecordLoader:
    """Train and validation batches of packed records for one data-parallel rank."""

    train_rows: PackedRows
    val_rows: PackedRows
    global_batch_size: int
    dp_rank: int
    dp_size: int
    seed: int
    vocab_size: int
    shuffle: bool
    skipped_batches: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not len(self.train_rows):
            raise ValueError("data: no training rows; add records or lower data.val_fraction")
        self.rows_per_rank = self.global_batch_size // self.dp_size
        self.step = 0  # the last step whose batch was taken: the loader's position

    @property
    def has_validation(self) -> bool:
        return len(self.val_rows) > 0

    def batch_of(self, step: int) -> int:
        return batch_index(step, self.skipped_batches)

    def _global_rows(self, batch: int) -> np.ndarray:
        """Indices into the training rows of batch `batch`'s global batch (1-based)."""
        n = len(self.train_rows)
        k = np.arange((batch - 1) * self.global_batch_size, batch * self.global_batch_size)
        passes, within = k // n, k % n
        out = within.copy()
        for p in np.unique(passes):
            if p == 0 or not self.shuffle:
                continue  # the first pass is the (shuffled or file) order itself
            order = np.random.default_rng([self.seed, _PASS_STREAM, int(p)]).permutation(n)
            out[passes == p] = order[within[passes == p]]
        return out

    def _batch(self, rows: PackedRows, global_rows: np.ndarray, slot: int) -> Batch:
        mine = global_rows[slot * self.rows_per_rank : (slot + 1) * self.rows_per_rank]
        got = rows.rows(mine)
        if got.tokens.max(initial=0) >= self.vocab_size:
            raise ValueError(
                f"data: a token id is out of range for model.vocab_size={self.vocab_size}; "
                "the data was tokenized with a larger vocabulary"
            )
        return Batch(
            torch.from_numpy(got.tokens),
            int(rows.loss_tokens[global_rows].sum()),
            loss_mask=torch.from_numpy(got.loss_mask()),
            documents=torch.from_numpy(got.documents[:, :-1].copy()),
            global_tokens=int(rows.input_tokens[global_rows].sum()),
        )

    def train_batch(self, step: int) -> Batch:
        self.step = step
        return self._batch(self.train_rows, self._global_rows(self.batch_of(step)), self.dp_rank)

    def slot_batch(self, step: int, slot: int) -> Batch:
        self.step = max(self.step, step)
        return self._batch(self.train_rows, self._global_rows(self.batch_of(step)), slot)

    def val_batches(self) -> list[Batch]:
        """The held-out rows in order, a global batch at a time (at most EVAL_BATCHES);
        rows past the end wrap to the start so every batch is whole."""
        n = len(self.val_rows)
        count = min(EVAL_BATCHES, max(1, n // self.global_batch_size))
        batches = []
        for i in range(count):
            k = np.arange(i * self.global_batch_size, (i + 1) * self.global_batch_size) % n
            batches.append(self._batch(self.val_rows, k, self.dp_rank))
        return batches

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def record_loader(
    spec: JobSpec,
    dp_rank: int,
    dp_size: int,
    skipped_batches: tuple[int, ...] = (),
    access: DataAccess | None = None,
) -> RecordLoader:
    model = spec.model.resolved()
    data = spec.data
    docs = record_documents(data, model["seq_len"], model["vocab_size"], access)
    n = len(docs)
    order = (
        np.random.default_rng([spec.train.seed, _SHUFFLE_STREAM]).permutation(n)
        if data.shuffle
        else np.arange(n)
    )
    n_val = int(n * data.val_fraction)
    window = model["seq_len"] + 1
    train = pack(docs, order[: n - n_val], window, data.packing)
    val = pack(docs, order[n - n_val :], window, data.packing)
    log.info(
        "records: %d documents (%s) in %d training and %d held-out rows",
        n,
        ", ".join(f"{k} {v}" for k, v in docs.counts.items()),
        len(train),
        len(val),
    )
    return RecordLoader(
        train_rows=train,
        val_rows=val,
        global_batch_size=spec.train.global_batch_size,
        dp_rank=dp_rank,
        dp_size=dp_size,
        seed=spec.train.seed,
        vocab_size=model["vocab_size"],
        shuffle=data.shuffle,
        skipped_batches=skipped_batches,
    )
