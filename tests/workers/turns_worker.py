"""torchrun worker: a 4-turn rollout through a real vLLM engine (tests/test_multiturn.py).

    torchrun --nproc-per-node 2 tests/workers/turns_worker.py MODEL_DIR TP OUT_JSON

Every rank runs the turn loop on the same 4 prompts x 2 samples with an environment that answers each
turn with two tokens and ends after the 4th; it records which trajectories it stepped, and when. The result
(rank 0) says whether the ranks of an engine saw identical transcripts, how often each environment was
stepped, and the largest |engine - trainer| logprob over every model token of every turn.
"""
import json
import sys
from collections import Counter

import torch
import torch.distributed as dist

from rlcore.config import Config, DataConfig, ModelConfig, RolloutConfig
from rlcore.distributed.parallel import ParallelDims, build_meshes, init_distributed
from rlcore.engine import RolloutEngine
from rlcore.models import build as models
from rlcore.rollout.envs import make_envs
from rlcore.rollout.turns import Trajectory, rollout, to_batch

STEPS = Counter()  # (prompt, sample, turn) -> times this rank stepped it


class Feedback:
    """Answers every action with "+-" (two tokens); the trajectory ends with the turn limit."""
    max_turns = 4

    def __init__(self, row):
        self.row, self.turn = row, 0

    def step(self, action, action_ids):
        STEPS[(self.row["i"], self.row["j"], self.turn)] += 1
        self.turn += 1
        return "+-", 0.25, False


model_dir, tp, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
init_distributed()
cfg = Config(model=ModelConfig(path=model_dir), data=DataConfig(max_prompt_tokens=8),
             rollout=RolloutConfig(tensor_parallel=tp, cpu_kv_cache_gb=0.25, max_new_tokens=3, max_total_tokens=40,
                                   env=Feedback, temperature=1.0))
dims = ParallelDims(dist.get_world_size(), tp)
fsdp_mesh, rollout_mesh = build_meshes(dims)
tp_rank, tp_group = rollout_mesh.get_local_rank("tp"), rollout_mesh.get_group("tp")
engine = RolloutEngine(cfg, max_model_len=48)
policy = models.shard(models.load_causal_lm(cfg.model), fsdp_mesh, cfg.model)
from transformers import AutoTokenizer  # noqa: E402

tokenizer = AutoTokenizer.from_pretrained(model_dir)
rows = [{"prompt": p, "prompt_ids": tokenizer(p).input_ids, "i": i} for i, p in enumerate(["12+", "3", "45=", "6"])]
envs = make_envs(cfg, tokenizer, rows[0] | {"j": 0}, vocab_size=32)
G, share = 2, len(rows) // tp
trajs = [Trajectory(r["prompt_ids"], r | {"j": j}, seed=1000 * i + j, owner=i // share)
         for i, r in enumerate(rows) for j in range(G)]
stats = rollout(engine, trajs, envs, 3, 40, G, 1.0, tp_rank, tp_group)

mine = [x for x in trajs if x.owner == tp_rank]
batch = to_batch(mine, 0, G, 12)
with torch.no_grad():
    trainer = models.token_logprobs(policy, batch.input_ids, batch.attention_mask, 1.0)
diff = ((trainer - batch.rollout_logprobs).abs() * batch.loss_mask).max().item()

# A stop token ends a turn and stays in the sampled ids, with its logprob.
stop = engine.generate([rows[0]["prompt_ids"]], 8, 6, 1.0, [7], stop_token_ids=[tokenizer.convert_tokens_to_ids("+")])[0]
stopped = [s for s in stop if s.finish_reason == "stop"]

# The tokens each engine step computes (vLLM's scheduler's count, what auto's load lag charges): a 7-token prompt
# prefilled in the first step (under a block: no cached prefix), then one token a step.
engine.submit("count", [5, 9, 11, 13, 17, 19, 23], 3, 1.0, 7)
computed = []
while engine.busy():
    engine.step()
    computed.append(engine.computed)

everything = [None] * dist.get_world_size()
dist.all_gather_object(everything, {"rank": dist.get_rank(), "tp_rank": tp_rank,
                                    "transcripts": [x.tokens for x in trajs], "sampled": [x.sampled for x in trajs],
                                    "turns": [len(x.turns) for x in trajs], "steps": {str(k): n for k, n in STEPS.items()}, "diff": diff,
                                    "active": stats.active, "model_tokens": batch.loss_mask.sum().item(),
                                    "stop_ok": all(s.token_ids[-1] in (2, tokenizer.convert_tokens_to_ids("+"))
                                                   and len(s.logprobs) == len(s.token_ids) for s in stopped),
                                    "stopped": len(stopped), "computed": computed})
if dist.get_rank() == 0:
    steps = Counter()
    for e in everything:
        for key, n in e["steps"].items():
            steps[key] += n
    json.dump({"ranks": everything, "step_counts": sorted(steps.values()), "stepped": len(steps),
               "trajectories": len(trajs)}, open(out, "w"))
print(f"rank {dist.get_rank()}: diff {diff:.2e}, active {stats.active}", flush=True)
