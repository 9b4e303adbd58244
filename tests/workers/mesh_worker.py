"""torchrun worker: each rank writes its coordinates in the meshes (tests/test_parallel.py)."""
import json
import sys
from pathlib import Path

import torch.distributed as dist

from rlcore.distributed.parallel import ParallelDims, build_meshes, init_distributed

tp, out = int(sys.argv[1]), Path(sys.argv[2])
init_distributed()
fsdp, rollout = build_meshes(ParallelDims(dist.get_world_size(), tp))
(out / f"{dist.get_rank()}.json").write_text(json.dumps({
    "group": rollout.get_local_rank("dp"), "tp_rank": rollout.get_local_rank("tp"),
    "rollout_mesh": rollout.mesh.tolist(), "fsdp_mesh": fsdp.mesh.tolist()}))
dist.barrier()  # neither rank leaves while the other still talks to it (gloo aborts on a vanished peer)
dist.destroy_process_group()
