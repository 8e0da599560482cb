"""A tied output head under pipeline parallelism: one tensor held twice.

With tied embeddings the model's output head multiplies by the token embedding's weight.
In one stage that is one parameter (the module shares it). A pipeline puts the
embedding on the first stage and the head on the last, so each of those ranks holds a
copy (Megatron-LM's way): both start from the same values (the head's copy is drawn, or
read from a Hugging Face folder, as the embedding), after backward the two gradients are
summed between the pair of ranks of each (dp, tp) coordinate, which is the gradient of
the one tensor, and both copies take the same optimizer step, so they stay equal to the
bit. The global gradient norm counts the tensor once (the head's copy is left out of it
but clipped with the rest). A checkpoint holds both names, as a one-stage model's state
dict does, so it restores into any layout.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from shardline.workers.engine.dtensor import local_part
from shardline.workers.engine.optimizer import model_name

log = logging.getLogger(__name__)


class TiedAcrossStages:
    """The copies of tied parameters this rank holds, and how their gradients meet."""

    def __init__(self, modules: list[nn.Module], ties: dict[str, str], mesh: DeviceMesh) -> None:
        """`ties`: a parameter's name -> the name of the one it is (the family's
        `tied_parameters`); `mesh`: the world's (pp, dp, tp) mesh."""
        names = set(ties) | set(ties.values())
        self.params: list[nn.Parameter] = []
        self.copies: list[nn.Parameter] = []  # the head's side: not counted in the norm
        for module in modules:
            for name, p in module.named_parameters():
                plain = model_name(name)
                if plain in names:
                    self.params.append(p)
                    if plain in ties:
                        self.copies.append(p)
        grid = mesh.mesh  # global ranks, (pp, dp, tp)
        # The first and last stage's ranks of each (dp, tp) coordinate; every rank takes
        # part in making every pair's group, and keeps its own (None in a middle stage).
        pairs = [
            [int(grid[0, dp, tp]), int(grid[-1, dp, tp])]
            for dp in range(grid.shape[1])
            for tp in range(grid.shape[2])
        ]
        self.group: dist.ProcessGroup | None = dist.new_subgroups_by_enumeration(pairs)[0]
        if self.params:
            log.info("%d tied parameter(s) held on this stage", len(self.params))

    def sync_grads(self) -> None:
        """Sum each tied tensor's gradients between its two stages (after the data-parallel
        reduction and tensor-parallel settling, before clipping)."""
        if self.group is None:
            return
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(local_part(p.grad), group=self.group)


def tied_across_stages(
    modules: list[nn.Module], ties: dict[str, str], mesh: DeviceMesh, pp: int
) -> TiedAcrossStages | None:
    """The tied parameters a pipeline holds apart; None where none are (one stage, or a
    model without ties)."""
    if pp == 1 or not ties:
        return None
    return TiedAcrossStages(modules, ties, mesh)
