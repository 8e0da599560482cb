"""ZeRO-1: parameters and gradients whole on every data-parallel rank, optimizer state not.

Each dp rank updates one slice of every parameter and the slices are all-gathered back
after the step. A slice is cut along one dimension of this rank's (tensor-parallel) local
part, chosen so that it is never the dimension tensor parallelism already shards: then the
optimizer state of a parameter is an ordinary DTensor over (dp, tp) with placements
(Shard(d), <tp placement>), which torch.distributed.checkpoint saves and reshards into any
other layout under the parameter's own name.

Slices follow DTensor's Shard rule (torch.chunk sizes, the last ranks may hold less or
nothing), so the DTensors built from them describe exactly what each rank holds.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from shardline.workers.engine.dtensor import local_part

log = logging.getLogger(__name__)

# all_gather_single replaces all_gather_into_tensor in newer torch; the project takes >= 2.6.
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


def chunk_bounds(size: int, parts: int, index: int) -> tuple[int, int]:
    """(offset, length) of slice `index` of `size` rows cut into `parts`, as DTensor does."""
    full = math.ceil(size / parts)
    start = min(full * index, size)
    return start, min(size, start + full) - start


def slice_dim(param: torch.Tensor) -> int:
    """The dimension ZeRO-1 cuts: the first one tensor parallelism leaves whole."""
    taken = (
        {p.dim for p in param.placements if isinstance(p, Shard)}
        if isinstance(param, DTensor)
        else set()
    )
    free = [d for d in range(param.dim()) if d not in taken]
    return free[0] if free else 0


@dataclass
class _Slice:
    param: nn.Parameter  # the model's parameter (plain, or a tp DTensor)
    shard: nn.Parameter  # this rank's slice of it, which the inner optimizer steps
    dim: int
    offset: int
    length: int
    padded: int  # elements of the largest slice over dp ranks: the all-gather stride

    def local(self) -> torch.Tensor:
        return local_part(self.param.data)

    def rank_view(self, tensor: torch.Tensor, rank: int, dp: int) -> torch.Tensor:
        offset, length = chunk_bounds(tensor.shape[self.dim], dp, rank)
        return tensor.narrow(self.dim, offset, length)


class ZeroOneOptimizer:
    """An optimizer over this rank's slices of `params`; `step()` all-gathers the result."""

    def __init__(
        self,
        param_groups: list[dict[str, Any]],
        *,
        dp_mesh: DeviceMesh,
        state_mesh: DeviceMesh,
        optimizer_class: type[torch.optim.Optimizer],
        **defaults: Any,
    ) -> None:
        self.dp_mesh, self.state_mesh = dp_mesh, state_mesh
        self.dp, self.dp_rank = dp_mesh.size(), dp_mesh.get_local_rank()
        self.slices: list[_Slice] = []
        inner_groups = []
        for group in param_groups:
            shards = [self._cut(p).shard for p in group["params"]]
            inner_groups.append({**group, "params": shards})
        self.inner = optimizer_class(inner_groups, **defaults)
        self._by_shard = {id(s.shard): s for s in self.slices}
        log.info(
            "ZeRO-1: optimizer state of %d parameters sliced over dp=%d", len(self.slices), self.dp
        )

    def _cut(self, param: nn.Parameter) -> _Slice:
        local = local_part(param.data)
        dim = slice_dim(param) if local.dim() else 0
        rows = local.shape[dim] if local.dim() else 1
        offset, length = chunk_bounds(rows, self.dp, self.dp_rank)
        view = local.narrow(dim, offset, length) if local.dim() else local
        per_row = local.numel() // max(rows, 1)
        entry = _Slice(
            param=param,
            shard=nn.Parameter(view.detach().clone()),
            dim=dim,
            offset=offset,
            length=length,
            padded=math.ceil(rows / self.dp) * per_row,
        )
        self.slices.append(entry)
        return entry

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def state(self) -> Any:
        return self.inner.state

    def refresh_from_params(self) -> None:
        """Copy the parameters' values into the slices (after loading a checkpoint)."""
        with torch.no_grad():
            for s in self.slices:
                s.shard.copy_(s.local().narrow(s.dim, s.offset, s.length))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for s in self.slices:
            s.shard.grad = None
            s.param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for s in self.slices:
            grad = s.param.grad
            if grad is None:
                continue
            # e.g. a vocab-parallel embedding's gradient can come back replicated
            if (
                isinstance(grad, DTensor)
                and isinstance(s.param, DTensor)
                and grad.placements != s.param.placements
            ):
                grad = grad.redistribute(s.param.device_mesh, s.param.placements)
            s.shard.grad = local_part(grad).narrow(s.dim, s.offset, s.length).contiguous()
        self.inner.step()
        self._all_gather()

    def _all_gather(self) -> None:
        """Every rank's updated slices into every rank's parameters, in one collective."""
        stride = sum(s.padded for s in self.slices)
        send = torch.zeros(
            stride, dtype=self.slices[0].shard.dtype, device=self.slices[0].shard.device
        )
        at = 0
        for s in self.slices:
            send[at : at + s.shard.numel()].copy_(s.shard.reshape(-1))
            at += s.padded
        received = torch.empty(stride * self.dp, dtype=send.dtype, device=send.device)
        _all_gather(received, send, group=self.dp_mesh.get_group())
        for rank in range(self.dp):
            at = rank * stride
            for s in self.slices:
                target = s.rank_view(s.local(), rank, self.dp)
                target.copy_(received[at : at + target.numel()].view_as(target))
                at += s.padded

    def named_state(self, names: dict[int, str]) -> dict[str, torch.Tensor]:
        """Optimizer state as DTensors of each parameter's full shape, keyed `<name>.<key>`.

        `names` maps id(parameter) to its model name. The tensors share memory with the
        optimizer's own state, so loading a checkpoint into them restores it in place.
        """
        out: dict[str, torch.Tensor] = {}
        for shard, state in self.inner.state.items():
            s = self._by_shard[id(shard)]
            name = names[id(s.param)]
            for key, value in state.items():
                out[f"{name}.{key}"] = self._as_dtensor(s, value) if value.dim() else value
        return out

    def _as_dtensor(self, s: _Slice, value: torch.Tensor) -> DTensor:
        param = s.param
        if isinstance(param, DTensor):
            tp_placements = list(param.placements)
        else:  # a parameter tensor parallelism left whole is replicated over tp
            tp_placements = [Replicate()] * (self.state_mesh.ndim - 1)
        placements = [Shard(s.dim), *tp_placements]
        shape = param.shape
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(
            value, self.state_mesh, placements, run_check=False, shape=shape, stride=stride
        )
