"""torchrun worker: does the engine serve exactly the trainer's LoRA policy? (tests/test_lora_sync.py)

    torchrun --nproc-per-node 2 tests/workers/lora_sync_worker.py MODEL_DIR OUT_JSON

One engine (tensor parallel 2, LoRA on) for every scenario, to pay for one engine start:
- adapter sync: three real optimizer steps of the adapters, each followed by a sync that writes a PEFT folder
  and loads it as a new adapter version; the engine's prompt logprobs (and sampled logprobs) against the
  trainer's, and against the base model's;
- merged sync: three more steps, each streamed as full merged weights (W + s B A, rlcore/models/weights.py) with no
  LoRARequest. The production merged engine is built without LoRA; here the same engine takes the merged
  weights through the base reload, which is the path that engine uses.
"""
import contextlib
import json
import sys

import torch
import torch.distributed as dist

from rlcore.config import Config, LoraConfig, ModelConfig, OptimConfig, RolloutConfig
from rlcore.distributed.parallel import ParallelDims, build_meshes, init_distributed
from rlcore.engine import RolloutEngine
from rlcore.models import lora, build as models

model_dir, out = sys.argv[1], sys.argv[2]
init_distributed()
cfg = Config(model=ModelConfig(path=model_dir), rollout=RolloutConfig(tensor_parallel=2, cpu_kv_cache_gb=0.25),
             lora=LoraConfig(enabled=True, rank=8, alpha=16.0), optim=OptimConfig(lr=2e-3))
fsdp_mesh, _ = build_meshes(ParallelDims(dist.get_world_size(), 2))
engine = RolloutEngine(cfg, max_model_len=64)
policy = models.shard(lora.apply(models.load_causal_lm(cfg.model), cfg.lora, seed=0), fsdp_mesh, cfg.model)
optimizer, _ = models.build_optimizer(policy, lora.optim_config(cfg.lora, cfg.optim), total_steps=6)

seqs = torch.randint(3, 20, (3, 16), generator=torch.Generator().manual_seed(7))  # same on every rank
ones = torch.ones_like(seqs)


def trainer_logprobs(ids, off=False):
    with torch.no_grad(), (lora.adapters_off(policy) if off else contextlib.nullcontext()):
        return models.token_logprobs(policy, ids, torch.ones_like(ids), 1.0)


def optimizer_step(seed):
    g = torch.Generator().manual_seed(seed * 10 + dist.get_rank())
    ids = torch.randint(3, 20, (4, 12), generator=g)
    (-models.token_logprobs(policy, ids, torch.ones_like(ids), 1.0).mean()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def max_diff(a, b):
    return (torch.tensor(a) - b).abs().max().item()


base = torch.tensor(engine.prompt_logprobs(seqs.tolist()))  # no adapter loaded yet: the base model
result = {"base_vs_trainer_at_init": max_diff(base, trainer_logprobs(seqs)), "adapter": [], "merged": []}
for mode in ("adapter", "merged"):
    if mode == "merged":  # the same engine, no adapter request: it serves the base weights the sync replaces
        engine.lora, engine.lora_request = None, None
    for version in range(3):
        optimizer_step(version + 3 * (mode == "merged"))
        stale = engine.prompt_logprobs(seqs.tolist())
        stats = engine.sync_weights(policy)
        synced = engine.prompt_logprobs(seqs.tolist())
        trainer = trainer_logprobs(seqs)
        row = {"synced_max_diff": max_diff(synced, trainer), "stale_max_diff": max_diff(stale, trainer),
               "engine_vs_base": max_diff(synced, base),
               "adapters_off_vs_base": max_diff(base, trainer_logprobs(seqs, off=True)),
               "bytes": stats.bytes, "seconds": stats.seconds}
        # Sampling carries the adapter too: the sampled tokens' logprobs are the trainer's.
        samples = engine.generate([seqs[0, :4].tolist()], 2, 8, 1.0, [version])[0]
        row["sampled_max_diff"] = max(
            max_diff(s.logprobs, trainer_logprobs(torch.tensor([seqs[0, :4].tolist() + s.token_ids]))[0, 3:])
            for s in samples)
        result[mode].append(row)
result["model_bytes"] = sum(p.numel() * 4 for n, p in policy.named_parameters() if ".lora_" not in n)
result["adapter_bytes"] = sum(p.numel() * 4 for n, p in policy.named_parameters() if ".lora_" in n)
if dist.get_rank() == 0:
    json.dump(result, open(out, "w"), indent=1)
print(f"rank {dist.get_rank()}: {json.dumps(result)}", flush=True)
