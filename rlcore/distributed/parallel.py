"""Process group and DeviceMesh: who trains with whom, who generates with whom.

Every rank trains (FSDP2 over the whole world) and every rank generates (one vLLM engine per block
of `k` ranks). vLLM's external launcher forms tensor-parallel groups from contiguous global ranks
[g*k, ..., g*k + k - 1], so the rollout mesh is row-major (W/k, k):

    W=8, k=2:  rollout mesh axes ("dp", "tp")   [[0, 1], [2, 3], [4, 5], [6, 7]]
               fsdp mesh axis ("fsdp",)          [0, 1, 2, 3, 4, 5, 6, 7]

Split (rollout.ranks=R > 0, rlcore/modes/split.py): ranks [0, R) only generate and ranks [R, W) only train. vLLM's
external launcher still takes the whole world and forms its TP blocks over every rank, so every rank builds
an engine; the trainer ranks' engines stay dormant. FSDP2 runs over the trainer ranks' own process group:

    W=3, k=1, R=1:  engines on [0] (and dormant on [1], [2])   fsdp over [1, 2]
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


@dataclass
class ParallelDims:
    world_size: int
    tp: int  # ranks per vLLM engine (rollout tensor parallelism)
    rollout_ranks: int = 0  # split mesh: ranks [0, rollout_ranks) only generate, the rest only train; 0 = colocated

    def validate(self, num_heads: int | None = None, num_kv_heads: int | None = None) -> None:
        """Fail before anything loads. The head counts come from the model's config.json."""
        if self.tp < 1:
            raise ValueError(f"rollout.tensor_parallel must be >= 1 (got {self.tp})")
        if self.world_size % self.tp:
            valid = [k for k in range(1, self.world_size + 1) if self.world_size % k == 0]
            raise ValueError(f"rollout.tensor_parallel={self.tp} does not divide the world size "
                             f"{self.world_size}; valid: {valid}")
        if self.rollout_ranks and (self.rollout_ranks >= self.world_size or self.rollout_ranks % self.tp):
            raise ValueError(f"rollout.ranks={self.rollout_ranks} must be a multiple of rollout.tensor_parallel="
                             f"{self.tp} below the world size {self.world_size} (the rest of the ranks train); "
                             f"valid: {[r for r in range(self.tp, self.world_size, self.tp)] or 'none'} or 0 "
                             f"(colocated)")
        if num_heads is not None and num_heads % self.tp:
            raise ValueError(f"rollout.tensor_parallel={self.tp} does not divide the model's "
                             f"{num_heads} attention heads")
        # vLLM shards KV heads when tp divides them and replicates them when they divide tp.
        if num_kv_heads is not None and num_kv_heads % self.tp and self.tp % num_kv_heads:
            raise ValueError(f"rollout.tensor_parallel={self.tp} is incompatible with the model's "
                             f"{num_kv_heads} key/value heads (one must divide the other)")

    @property
    def split(self) -> bool:
        return self.rollout_ranks > 0

    @property
    def generators(self) -> int:
        """Ranks that generate (all of them when colocated)."""
        return self.rollout_ranks or self.world_size

    @property
    def trainers(self) -> int:
        """Ranks that train (all of them when colocated)."""
        return self.world_size - self.rollout_ranks

    @property
    def rollout_groups(self) -> int:
        """Engines that generate (the trainer ranks' dormant engines are not counted)."""
        return self.generators // self.tp

    def generates(self, rank: int) -> bool:
        return rank < self.generators

    def trains(self, rank: int) -> bool:
        return rank >= self.rollout_ranks


def device_type() -> str:
    """cuda + nccl when GPUs are present, cpu + gloo otherwise: the only device switch."""
    return "cuda" if torch.cuda.is_available() else "cpu"


_timeout: timedelta | None = None  # every process group's (rlcore.distributed.watchdog.group_timeout); None = torch's default


def init_distributed(timeout: timedelta | None = None) -> None:
    """Start the default process group from torchrun's environment (a plain `python` run is world 1). `timeout`
    bounds every collective of it and of the groups `new_group` makes (torch's new_group does not inherit it)."""
    global _timeout
    if dist.is_initialized():
        return
    _timeout = timeout
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    if device_type() == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])), timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)


def new_group(ranks: list[int], backend: str | None = None):
    """dist.new_group with the default group's timeout (collective: every rank calls it, in the same order)."""
    return dist.new_group(ranks, timeout=_timeout, backend=backend)


def build_meshes(dims: ParallelDims) -> tuple[DeviceMesh | None, DeviceMesh]:
    """Returns (fsdp_mesh, rollout_mesh of shape (W/k, k) over every rank with axes ("dp", "tp")). The FSDP
    mesh spans every rank, or in a split mesh the trainer ranks only (None on the rollout ranks)."""
    dev = device_type()
    if not dims.split:
        fsdp = init_device_mesh(dev, (dims.world_size,), mesh_dim_names=("fsdp",))
    else:  # new_group is collective: every rank makes the trainers' group, only they build a mesh on it
        trainers = new_group(list(range(dims.rollout_ranks, dims.world_size)))
        fsdp = DeviceMesh.from_group(trainers, dev, mesh_dim_names=("fsdp",)) \
            if dims.trains(dist.get_rank()) else None
    # The rollout mesh from groups made here (init_device_mesh's own would not carry the timeout).
    layout = torch.arange(dims.world_size).view(dims.world_size // dims.tp, dims.tp)  # [engines, tp]
    dp = tp = None
    for ranks in layout.T.tolist():  # each tp position across the engines
        group = new_group(ranks)
        dp = group if dist.get_rank() in ranks else dp
    for ranks in layout.tolist():  # each engine's ranks
        group = new_group(ranks)
        tp = group if dist.get_rank() in ranks else tp
    rollout = DeviceMesh.from_group([dp, tp], dev, mesh=layout, mesh_dim_names=("dp", "tp"))
    return fsdp, rollout
