"""torch.compile per transformer block, applied from outside the model.

Each block is compiled on its own, as torchtitan does: blocks share one shape, so one
compilation serves them all, and FSDP2 (applied after) still sees block boundaries to
gather and free parameters around. `nn.Module.compile` compiles in place, so parameter
names, and with them checkpoints, do not change.
"""

from __future__ import annotations

import logging

from torch import nn

log = logging.getLogger(__name__)


def apply_compile(model: nn.Module) -> None:
    """Compile every block of `model.layers` (a Transformer or a pipeline stage) in place."""
    layers = model.layers
    assert isinstance(layers, nn.ModuleDict)
    for block in layers.values():
        block.compile()
    log.info("compiled %d transformer blocks with torch.compile", len(layers))
