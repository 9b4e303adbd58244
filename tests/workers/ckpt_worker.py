"""torchrun worker: checkpoint faults and resharding, without engines (tests/test_checkpoint.py).

    torchrun --nproc-per-node 2 tests/workers/ckpt_worker.py save MODEL_DIR RUN_DIR
    torchrun --nproc-per-node 1 tests/workers/ckpt_worker.py load MODEL_DIR RUN_DIR

save (2 ranks): step 1 is saved; at step 2 rank 1's disk is "full" (its file write raises ENOSPC, as
a full disk does); then rank 1 is SIGKILLed in the middle of saving step 2 (after its DCP shard).
load (1 rank): resume=auto must skip the partial step 2, report it, and load step 1 onto one rank:
model and optimizer values equal to what the 2 ranks held when they saved it.
"""
import errno
import json
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from rlcore.config import Config, DataConfig, ModelConfig, OptimConfig
from rlcore.data import PromptStream, load_table, tokenize_prompts
from rlcore.distributed.parallel import ParallelDims, build_meshes, init_distributed
from rlcore.models import build as models
from rlcore.outputs import checkpoint
from rlcore.tasks.tiny import train_file

mode, model_dir, run_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
init_distributed()
rank, world = dist.get_rank(), dist.get_world_size()
cfg = Config(name="ckpt", model=ModelConfig(path=model_dir), optim=OptimConfig(lr=1e-2, warmup_steps=4),
             data=DataConfig(path=str(train_file())), resume="auto")
fsdp_mesh, _ = build_meshes(ParallelDims(world, 1))
policy = models.shard(models.load_causal_lm(cfg.model), fsdp_mesh, cfg.model)
optimizer, scheduler = models.build_optimizer(policy, cfg.optim, total_steps=10)
trained = {"policy": (policy, optimizer, scheduler)}
from transformers import AutoTokenizer  # noqa: E402
tokenizer = AutoTokenizer.from_pretrained(model_dir)
table = tokenize_prompts(load_table(cfg.data.path, "train", "", "data.path"), cfg.data, tokenizer, "data.path")
prompts = PromptStream(table, 4, world, rank, cfg.seed)
meta = checkpoint.describe(cfg, world, world)
root = run_dir / "checkpoints"


def full_state() -> dict:
    model_sd, optim_sd = get_state_dict(policy, optimizer, options=StateDictOptions(full_state_dict=True))
    return {"model": model_sd, "optim": optim_sd["state"]}


def train_step(seed: int) -> None:
    g = torch.Generator().manual_seed(seed + rank)
    ids = torch.randint(3, 20, (4, 12), generator=g)
    (-models.token_logprobs(policy, ids, torch.ones_like(ids), 1.0).mean()).backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    prompts.next_batch()


result = {}
if mode == "save":
    train_step(1)
    checkpoint.save(root, 1, trained, prompts, {"step": 1}, meta, 2, tokenizer)
    expected = full_state()
    if rank == 0:
        torch.save(expected | {"lr": scheduler.get_last_lr()}, run_dir / "expected_step1.pt")
    train_step(2)
    write = checkpoint._write

    def full_disk(obj, path):
        if rank == 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        write(obj, path)
    checkpoint._write = full_disk
    try:
        checkpoint.save(root, 2, trained, prompts, {"step": 2}, meta, 2, tokenizer)
    except checkpoint.SaveError as e:
        result["save_error"] = str(e)
    result["after_full_disk"] = sorted(p.name for p in root.iterdir())
    if rank == 0:
        json.dump(result, open(run_dir / "save.json", "w"))

    def dies(obj, path):
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        write(obj, path)
    checkpoint._write = dies
    dist.barrier()
    checkpoint.save(root, 2, trained, prompts, {"step": 2}, meta, 2, tokenizer)
else:
    path, notes = checkpoint.resolve(cfg, run_dir, meta)
    loop, load_notes = checkpoint.load(path, trained, prompts, 0)
    expected, now = torch.load(run_dir / "expected_step1.pt", weights_only=False), full_state()
    diff = 0.0
    for part in ("model", "optim"):
        flat = lambda d: {f"{k}.{kk}" if isinstance(v, dict) else k: vv for k, v in d.items()  # noqa: E731
                          for kk, vv in (v.items() if isinstance(v, dict) else [(None, v)])}
        a, b = flat(expected[part]), flat(now[part])
        assert a.keys() == b.keys(), (part, set(a) ^ set(b))
        diff = max([diff] + [(torch.as_tensor(a[k]).float() - torch.as_tensor(b[k]).float()).abs().max().item()
                             for k in a])
    result = {"path": str(path), "notes": notes + load_notes, "loop": loop, "max_diff": diff,
              "lr": [scheduler.get_last_lr(), expected["lr"]]}
    json.dump(result, open(run_dir / "load.json", "w"))
print(f"rank {rank}: {result}", flush=True)
