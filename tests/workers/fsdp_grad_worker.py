"""torchrun worker: FSDP2's gradient over R ranks x M micro-batches equals one process's full-batch gradient,
for every loss aggregation mode and M in 1, 2, 4, with logprobs computed at once and in chunks.

    torchrun --nproc-per-node R tests/workers/fsdp_grad_worker.py MODEL_DIR OUT_JSON

Checks the trainer's reduction setup (models.shard: SUM over ranks, losses divided by global counts).
"""
import copy
import json
import sys

import torch
import torch.distributed as dist

from rlcore.algorithms.objectives import AGG_MODES, PolicyLoss, local_normaliser
from rlcore.batch import Batch, Normaliser
from rlcore.config import ModelConfig
from rlcore.distributed.parallel import ParallelDims, build_meshes, init_distributed
from rlcore.models import build as models

model_dir, out = sys.argv[1], sys.argv[2]
init_distributed()
rank, world = dist.get_rank(), dist.get_world_size()
fsdp_mesh, _ = build_meshes(ParallelDims(world, 1))
reference = models.load_causal_lm(ModelConfig(path=model_dir))
policy = models.shard(copy.deepcopy(reference), fsdp_mesh, ModelConfig(path=model_dir))

g = torch.Generator().manual_seed(0)  # the same global batch on every rank
B, L = 8, 10
ids = torch.randint(3, 20, (B, L), generator=g)
mask = (torch.rand(B, L - 1, generator=g) > 0.3).float()  # ragged response lengths
mask[5] = 0  # a row without response tokens
batch = Batch(input_ids=ids, attention_mask=torch.ones_like(ids), loss_mask=mask,
              rollout_logprobs=-torch.rand(B, L - 1, generator=g), rewards=torch.zeros(B), group_size=1,
              old_logprobs=-torch.rand(B, L - 1, generator=g), advantages=torch.randn(B, L - 1, generator=g))


def loss_of(model, rows: Batch, norm, agg, chunk=0):
    logprobs = models.token_logprobs(model, rows.input_ids, rows.attention_mask, 1.0, chunk_tokens=chunk)
    # clip 0.1 and a TIS cap keep clipped and truncated tokens in play
    return PolicyLoss(clip_low=0.1, clip_high=0.1, loss_agg=agg, tis_cap=1.5).loss(rows, logprobs, norm)[0]


result = {}
CHUNKED = 5  # models.token_logprobs chunk size on the sharded policy: 5 does not divide its 2 x 9 tokens
for agg in AGG_MODES:
    reference.zero_grad(set_to_none=True)
    policy.zero_grad(set_to_none=True)
    full = local_normaliser(mask)
    full.max_len = L - 1
    loss_of(reference, batch, full, agg).backward()  # one process, the whole batch
    for micro, chunk in [(m, c) for m in (1, 2, 4) for c in (0, CHUNKED)]:
        policy.zero_grad(set_to_none=True)
        per_rank = B // world
        mine = batch.rows(rank * per_rank, (rank + 1) * per_rank)
        size = per_rank // micro
        local = local_normaliser(mine.loss_mask)  # counts of this rank's micro-batches, summed over ranks
        t = torch.tensor([local.tokens, local.sequences], dtype=torch.float64)
        dist.all_reduce(t)
        norm = Normaliser(*t.tolist(), max_len=L - 1)
        for start in range(0, per_rank, size):
            loss_of(policy, mine.rows(start, start + size), norm, agg, chunk).backward()
        worst = 0.0
        for (name, p), (_, q) in zip(reference.named_parameters(), policy.named_parameters()):
            worst = max(worst, (p.grad - q.grad.full_tensor()).abs().max().item())
        result[f"{agg}/{micro}" + ("/chunked" if chunk else "")] = worst
    result[f"{agg}/grad_scale"] = reference.lm_head.weight.grad.abs().max().item()
    result[f"{agg}/grad_max"] = max(p.grad.abs().max().item() for p in reference.parameters() if p.grad is not None)
if rank == 0:
    json.dump(result, open(out, "w"))
dist.barrier()  # neither rank leaves while the other still talks to it (gloo aborts on a vanished peer)
dist.destroy_process_group()
