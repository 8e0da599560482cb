"""One step's batch as a data-parallel rank sees it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from shardline.workers.engine.loss import IGNORE_INDEX

# Validation always uses this many global batches from the held-out split.
EVAL_BATCHES = 4


@dataclass(frozen=True)
class Batch:
    """This rank's rows of one step's global batch, and how many of the global batch's
    targets the loss counts, so the loss is a sum over them divided by that count however
    the batch is split into micro-batches, ranks and stages.

    Rows of records also say which targets count (`loss_mask`: not padding, not across
    documents, learned) and which document each input token belongs to (`documents`,
    -1 for padding), so attention stays within a document."""

    tokens: torch.Tensor  # (rows, seq_len + 1) token ids: inputs [:-1], targets [1:]
    global_loss_tokens: int
    loss_mask: torch.Tensor | None = None  # (rows, seq_len) bool
    documents: torch.Tensor | None = None  # (rows, seq_len) int32
    # Real input tokens in the global batch (padding left out).
    global_tokens: int | None = None

    def to(self, device: torch.device) -> Batch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return Batch(
            self.tokens.to(device),
            self.global_loss_tokens,
            move(self.loss_mask),
            move(self.documents),
            self.global_tokens,
        )

    @property
    def inputs(self) -> torch.Tensor:
        return self.tokens[:, :-1]

    @property
    def targets(self) -> torch.Tensor:
        """Next tokens, IGNORE_INDEX where the loss does not count them."""
        targets = self.tokens[:, 1:]
        if self.loss_mask is None:
            return targets
        return targets.masked_fill(~self.loss_mask, IGNORE_INDEX)


class Loader(Protocol):
    """What the trainer asks of a loader: batches by step, the held-out batches, and the
    position a checkpoint holds (the last step whose batch it gave)."""

    step: int

    @property
    def has_validation(self) -> bool: ...

    def batch_of(self, step: int) -> int: ...

    def train_batch(self, step: int) -> Batch: ...

    def slot_batch(self, step: int, slot: int) -> Batch: ...

    def val_batches(self) -> list[Batch]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
