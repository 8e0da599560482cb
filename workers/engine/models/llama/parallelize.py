"""Tensor parallelism with DTensor, applied to a model (or a pipeline stage) from outside.

Attention q/k/v and MLP gate/up are split column-wise (by heads / hidden units), attention
output and MLP down row-wise, so each block needs one all-reduce (or, with sequence
parallelism, a reduce-scatter and an all-gather) per sub-layer. The token embedding and the
output head are split over the vocabulary; the head's logits stay sharded so the loss is
computed by `loss_parallel` (a distributed softmax that all-reduces the max and the sum)
without ever gathering them.
"""

from __future__ import annotations

import logging

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

log = logging.getLogger(__name__)


def apply_tensor_parallel(
    model: nn.Module, *, tp_mesh: DeviceMesh, sequence_parallel: bool
) -> None:
    """Shard `model` (a Transformer or one of its pipeline stages) over `tp_mesh` in place."""
    # Between blocks activations are either whole (Replicate) or split along the sequence.
    between = Shard(1) if sequence_parallel else Replicate()
    top: dict[str, ParallelStyle] = {}
    if getattr(model, "tok_embeddings", None) is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=between)
    if getattr(model, "norm", None) is not None and sequence_parallel:
        top["norm"] = SequenceParallel()
    if getattr(model, "output", None) is not None:
        top["output"] = ColwiseParallel(
            input_layouts=between, output_layouts=Shard(-1), use_local_output=False
        )
    if top:
        parallelize_module(model, tp_mesh, top)

    layers = model.layers
    assert isinstance(layers, nn.ModuleDict)
    for block in layers.values():
        plan: dict[str, ParallelStyle] = {
            # x, the rotary tables and the document mask (None without packing).
            "attention": PrepareModuleInput(
                input_layouts=(between, None, None, None),
                desired_input_layouts=(Replicate(), None, None, None),
            ),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=between),
            "feed_forward": PrepareModuleInput(
                input_layouts=(between,), desired_input_layouts=(Replicate(),)
            ),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=between),
        }
        if sequence_parallel:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        if getattr(block.attention, "q_norm", None) is not None:
            # One gain shared by every head, and each rank holds some of the heads: the
            # gain is a replicated DTensor whose gradient is summed over the ranks (as
            # sequence parallelism does for a norm, here along the head dimension).
            plan["attention.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
            plan["attention.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        parallelize_module(block, tp_mesh, plan)
    log.info(
        "applied tensor parallel over tp=%d%s",
        tp_mesh.size(),
        " with sequence parallel" if sequence_parallel else "",
    )
