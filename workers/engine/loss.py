"""The training loss: a sum over the targets the loss counts and their count, for whole
logits or logits sharded over the vocabulary (tp).

A sum, not a mean: the trainer divides by the global batch's count, so the average is the
same however the batch is cut into micro-batches, ranks and pipeline stages, and a loss
mask (targets that do not count) changes nothing in how it is averaged.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F
from torch.distributed.tensor.parallel import loss_parallel

# A target the loss does not count (transformers' and torch's convention).
IGNORE_INDEX = -100


def token_loss(
    logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, int | torch.Tensor]:
    """The next-token loss summed in fp32 over the targets that count (where `loss_mask`
    is true; all of them without one), and how many count. Under `loss_context(True)`
    vocab-sharded DTensor logits are handled by a distributed softmax, without gathering
    them."""
    if loss_mask is not None:
        targets = targets.masked_fill(~loss_mask.bool(), IGNORE_INDEX)
    total = F.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten(), reduction="sum", ignore_index=IGNORE_INDEX
    )
    count = targets.numel() if loss_mask is None else (targets != IGNORE_INDEX).sum()
    return total, count


def loss_context(vocab_sharded: bool) -> AbstractContextManager[None]:
    """Wrap forward-with-loss and backward when the output head is tensor parallel."""
    return loss_parallel() if vocab_sharded else nullcontext()
