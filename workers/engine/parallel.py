"""The parallel layout: degrees validated once, and the one DeviceMesh built from them."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from shardline.workers.contract.sections import ParallelSpec

log = logging.getLogger(__name__)

# Mesh dims from slowest to fastest varying: tp is innermost so a tensor-parallel group is
# made of neighbouring ranks (one node), pp outermost because it talks least.
MESH_DIMS = ("pp", "dp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    pp: int
    dp: int
    tp: int
    zero_stage: int
    world_size: int

    def __post_init__(self) -> None:
        if self.pp * self.dp * self.tp != self.world_size:
            raise ValueError(
                f"parallel: dp*tp*pp = {self.dp}*{self.tp}*{self.pp} = "
                f"{self.dp * self.tp * self.pp} but the world has {self.world_size} ranks; "
                f"make the product {self.world_size}"
            )
        if not 0 <= self.zero_stage <= 3:
            raise ValueError(f"parallel.zero_stage={self.zero_stage} must be 0, 1, 2 or 3")

    @classmethod
    def from_spec(cls, spec: ParallelSpec, world_size: int) -> ParallelDims:
        return cls(spec.pp, spec.dp, spec.tp, spec.zero_stage, world_size)

    @property
    def effective_zero_stage(self) -> int:
        """ZeRO shards across data-parallel ranks; with one there is nothing to shard."""
        return self.zero_stage if self.dp > 1 else 0

    @property
    def syncs_grads_after_backward(self) -> bool:
        from shardline.workers.engine.data_parallel import syncs_grads_after_backward

        return syncs_grads_after_backward(
            dp=self.dp, zero_stage=self.effective_zero_stage, pp=self.pp, tp=self.tp
        )

    @property
    def grads_replicated(self) -> bool:
        """Whether every rank holds the same whole gradients once the step has reduced
        them: data parallelism alone, gradients unsharded (DDP, or ZeRO-1 on top of it).
        Each rank's own norm is then the global one, and clipping needs no collective."""
        return self.pp == 1 and self.tp == 1 and self.effective_zero_stage <= 1

    def describe(self) -> str:
        return f"pp={self.pp},dp={self.dp},tp={self.tp},zero={self.zero_stage}"

    def build_mesh(self, device_type: str) -> DeviceMesh:
        mesh = init_device_mesh(device_type, (self.pp, self.dp, self.tp), mesh_dim_names=MESH_DIMS)
        log.info("built %s device mesh %s", device_type, self.describe())
        return mesh
