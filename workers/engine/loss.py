"""The training loss, for whole logits or logits sharded over the vocabulary (tp)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F
from torch.distributed.tensor.parallel import loss_parallel


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss in fp32. Under `loss_context(True)` vocab-sharded DTensor
    logits are handled by a distributed softmax, without gathering them."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def loss_context(vocab_sharded: bool) -> AbstractContextManager[None]:
    """Wrap forward-with-loss and backward when the output head is tensor parallel."""
    return loss_parallel() if vocab_sharded else nullcontext()
