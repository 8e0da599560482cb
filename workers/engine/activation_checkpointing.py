"""Activation checkpointing: recompute a block's activations in backward instead of
keeping them, applied from outside the model.

`full` wraps every transformer block; `selective` wraps every second one (torchtitan's
layer-level selective option), trading about half the saved memory for half the recompute.
"""

from __future__ import annotations

import logging

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)

from shardline.workers.contract.sections import ActivationCheckpointing

log = logging.getLogger(__name__)


def apply_activation_checkpointing(model: nn.Module, *, mode: ActivationCheckpointing) -> None:
    """Wrap the blocks of `model.layers` in place (a no-op for `none`)."""
    if mode == ActivationCheckpointing.none:
        return
    layers = model.layers
    assert isinstance(layers, nn.ModuleDict)
    every = 1 if mode == ActivationCheckpointing.full else 2
    wrapped = 0
    for i, (name, block) in enumerate(list(layers.items())):
        if i % every == 0:
            layers[name] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
            wrapped += 1
    log.info(
        "applied %s activation checkpointing to %d of %d blocks", mode.value, wrapped, len(layers)
    )
