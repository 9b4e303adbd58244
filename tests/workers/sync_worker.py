"""torchrun worker: is the in-place weight sync exact? (tests/test_weight_sync.py)

    torchrun --nproc-per-node 2 tests/workers/sync_worker.py MODEL_DIR TP OUT_JSON [policy-first]

Takes one real optimizer step that moves every weight, then scores fixed sequences with the engine
before the sync (stale: must differ), asleep (refused; around the check, NaN on CPU) and after the sync (must
equal the trainer's logprobs). The trainer's
model is built after the engine, as rlcore.trainer does, or before it with `policy-first`.
"""
import json
import sys

import torch
import torch.distributed as dist

from rlcore.config import Config, ModelConfig, OptimConfig, RolloutConfig
from rlcore.distributed.parallel import ParallelDims, build_meshes, init_distributed
from rlcore.engine import RolloutEngine
from rlcore.models import build as models

model_dir, tp, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
policy_first = sys.argv[4:] == ["policy-first"]
init_distributed()
cfg = Config(model=ModelConfig(path=model_dir), rollout=RolloutConfig(tensor_parallel=tp, cpu_kv_cache_gb=0.25),
             optim=OptimConfig(lr=3e-2))
dims = ParallelDims(dist.get_world_size(), tp)
fsdp_mesh, _ = build_meshes(dims)
if policy_first:
    policy = models.shard(models.load_causal_lm(cfg.model), fsdp_mesh, cfg.model)
engine = RolloutEngine(cfg, max_model_len=64)
if not policy_first:
    policy = models.shard(models.load_causal_lm(cfg.model), fsdp_mesh, cfg.model)
optimizer, _ = models.build_optimizer(policy, cfg.optim, total_steps=1)

g = torch.Generator().manual_seed(1 + dist.get_rank())
ids = torch.randint(3, 20, (4, 12), generator=g)
loss = -models.token_logprobs(policy, ids, torch.ones_like(ids), 1.0).mean()
loss.backward()
before = {n: p.full_tensor().clone() for n, p in policy.named_parameters()}
optimizer.step()
unchanged = [n for n, p in policy.named_parameters() if torch.equal(p.full_tensor(), before[n])]

seqs = torch.randint(3, 20, (3, 16), generator=torch.Generator().manual_seed(7))  # same on every rank
with torch.no_grad():
    trainer = models.token_logprobs(policy, seqs, torch.ones_like(seqs), 1.0)  # [3, 15]
stale = torch.tensor(engine.prompt_logprobs(seqs.tolist()))
# The stream with the next unit's all-gather overlapped equals the one-after-the-other stream, bit for bit.
from rlcore.models.weights import checkpoint_weights
streams = [list(checkpoint_weights(policy, dtype=engine.dtype, overlap=o)) for o in (False, True)]
stream_mismatch = [a[0] for a, b in zip(*streams) if a[0] != b[0] or not torch.equal(a[1], b[1])]
stream_mismatch += ["<count>"] if len(streams[0]) != len(streams[1]) else []
del streams
# The colocated lifecycle (rlcore/engine/lifecycle.py): asleep at level 2 the engine refuses to score, and a path
# around that check scores with poisoned (NaN) weights on CPU, as a GPU engine would with discarded ones.
from rlcore.engine.lifecycle import EngineStateError
engine.sleep()
try:
    engine.prompt_logprobs(seqs.tolist())
    refused = ""
except EngineStateError as e:
    refused = str(e)
check, engine.state.require_ready = engine.state.require_ready, lambda action: None
asleep = torch.tensor(engine.prompt_logprobs(seqs.tolist()))
engine.state.require_ready = check
stats = engine.sync_weights(policy)  # overlapped (the default); wakes the engine
synced = torch.tensor(engine.prompt_logprobs(seqs.tolist()))
unit_bytes = [sum(p.numel() * 4 for p in layer.parameters()) for layer in models.decoder_layers(policy)]
result = {
    "unchanged_parameters": unchanged,
    "stale_max_diff": (stale - trainer).abs().max().item(),
    "synced_max_diff": (synced - trainer).abs().max().item(),
    "asleep_refused": refused,
    "asleep_finite": torch.isfinite(asleep).sum().item(),
    "state_after_sync": engine.state.describe(),
    "overlap_stream_mismatch": stream_mismatch,
    "bytes": stats.bytes,
    "peak_bucket_bytes": stats.peak_bucket_bytes,
    "model_bytes": sum(p.numel() * 4 for p in policy.parameters()),
    "layer_bytes": max(unit_bytes),
    "root_bytes": sum(p.numel() * 4 for p in policy.parameters()) - sum(unit_bytes),
}
if dist.get_rank() == 0:
    json.dump(result, open(out, "w"))
print(f"rank {dist.get_rank()}: {result}", flush=True)
