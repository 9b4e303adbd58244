"""Process group and DeviceMesh: who trains with whom, who generates with whom.

Every rank trains (FSDP2 over the whole world) and every rank generates (one vLLM engine per block
of `k` ranks). vLLM's external launcher forms tensor-parallel groups from contiguous global ranks
[g*k, ..., g*k + k - 1], so the rollout mesh is row-major (W/k, k):

    W=8, k=2:  rollout mesh axes ("dp", "tp")   [[0, 1], [2, 3], [4, 5], [6, 7]]
               fsdp mesh axis ("fsdp",)          [0, 1, 2, 3, 4, 5, 6, 7]
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


@dataclass
class ParallelDims:
    world_size: int
    tp: int  # ranks per vLLM engine (rollout tensor parallelism)

    def validate(self, num_heads: int | None = None, num_kv_heads: int | None = None) -> None:
        """Fail before anything loads. The head counts come from the model's config.json."""
        if self.tp < 1:
            raise ValueError(f"rollout.tensor_parallel must be >= 1 (got {self.tp})")
        if self.world_size % self.tp:
            valid = [k for k in range(1, self.world_size + 1) if self.world_size % k == 0]
            raise ValueError(f"rollout.tensor_parallel={self.tp} does not divide the world size "
                             f"{self.world_size}; valid: {valid}")
        if num_heads is not None and num_heads % self.tp:
            raise ValueError(f"rollout.tensor_parallel={self.tp} does not divide the model's "
                             f"{num_heads} attention heads")
        # vLLM shards KV heads when tp divides them and replicates them when they divide tp.
        if num_kv_heads is not None and num_kv_heads % self.tp and self.tp % num_kv_heads:
            raise ValueError(f"rollout.tensor_parallel={self.tp} is incompatible with the model's "
                             f"{num_kv_heads} key/value heads (one must divide the other)")

    @property
    def rollout_groups(self) -> int:
        return self.world_size // self.tp


def device_type() -> str:
    """cuda + nccl when GPUs are present, cpu + gloo otherwise: the only device switch."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def init_distributed() -> None:
    """Start the default process group from torchrun's environment (a plain `python` run is world 1)."""
    if dist.is_initialized():
        return
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    if device_type() == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
    else:
        dist.init_process_group("gloo")


def build_meshes(dims: ParallelDims) -> tuple[DeviceMesh, DeviceMesh]:
    """Returns (fsdp_mesh over all ranks, rollout_mesh of shape (W/k, k) with axes ("dp", "tp"))."""
    dev = device_type()
    fsdp = init_device_mesh(dev, (dims.world_size,), mesh_dim_names=("fsdp",))
    rollout = init_device_mesh(dev, (dims.rollout_groups, dims.tp), mesh_dim_names=("dp", "tp"))
    return fsdp, rollout
