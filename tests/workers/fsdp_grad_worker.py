"""torchrun worker: FSDP2's gradient over 2 ranks x 2 micro-batches equals one process's full-batch gradient.

    torchrun --nproc-per-node 2 tests/workers/fsdp_grad_worker.py MODEL_DIR OUT_JSON

Checks the trainer's reduction setup (models.shard: SUM over ranks, losses divided by global counts).
"""
import copy
import json
import sys

import torch
import torch.distributed as dist

from rlcore import models
from rlcore.algorithms.grpo import grpo_loss
from rlcore.batch import Normaliser
from rlcore.config import ModelConfig
from rlcore.objectives import local_normaliser
from rlcore.parallel import ParallelDims, build_meshes, init_distributed

model_dir, out = sys.argv[1], sys.argv[2]
init_distributed()
rank, world = dist.get_rank(), dist.get_world_size()
fsdp_mesh, _ = build_meshes(ParallelDims(world, 1))
reference = models.load_causal_lm(ModelConfig(path=model_dir))
policy = models.shard(copy.deepcopy(reference), fsdp_mesh, ModelConfig(path=model_dir))

g = torch.Generator().manual_seed(0)  # the same global batch on every rank
ids = torch.randint(3, 20, (8, 10), generator=g)
mask = (torch.rand(8, 9, generator=g) > 0.3).float()  # ragged response lengths
old = -torch.rand(8, 9, generator=g)
adv = torch.randn(8, 9, generator=g)
attn = torch.ones_like(ids)


def loss_of(model, rows, norm):
    logprobs = models.token_logprobs(model, ids[rows], attn[rows], 1.0)
    return grpo_loss(logprobs, old[rows], adv[rows], mask[rows], norm, loss_agg=sys.argv[3])[0]


# One process, whole batch.
full = local_normaliser(mask)
loss_of(reference, slice(0, 8), full).backward()
# Two ranks x two micro-batches of two rows, normalised by counts summed over both.
mine = range(rank * 4, rank * 4 + 4)
local = local_normaliser(mask[list(mine)])
t = torch.tensor([local.tokens, local.sequences], dtype=torch.float64)
dist.all_reduce(t)
norm = Normaliser(*t.tolist())
for start in (0, 2):
    loss_of(policy, slice(mine[start], mine[start] + 2), norm).backward()

worst = 0.0
for (name, p), (_, q) in zip(reference.named_parameters(), policy.named_parameters()):
    worst = max(worst, (p.grad - q.grad.full_tensor()).abs().max().item())
if rank == 0:
    json.dump({"max_abs_grad_diff": worst, "grad_scale": reference.lm_head.weight.grad.abs().max().item()},
              open(out, "w"))
