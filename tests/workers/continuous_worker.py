"""torchrun worker: continuous rollouts through one real vLLM engine at TP=2 (tests/test_continuous.py).

    torchrun --nproc-per-node 2 tests/workers/continuous_worker.py MODEL_DIR OUT_JSON

Three scenarios on one engine start, each recording every engine call a rank makes (adds with ids, tokens,
cap and seed; aborts; each step with the requests it finished):
  latency     8 prompts x 2 samples, up to 4 turns, each tool call sleeping a seeded 2-20 ms (log-uniform);
              also the largest |engine - trainer| logprob over every model token
  deadline    the same with one tool stuck 30 s in its second call and rollout.step_deadline_s = 1.5
  calculator  rlcore.tasks.calculator's tool on the random tiny model, lockstep and continuous, same seeds
Rank 0 writes what every rank saw.
"""
import json
import random
import sys
import time

import torch
import torch.distributed as dist

from rlcore.config import Config, DataConfig, ModelConfig, RolloutConfig
from rlcore.distributed.parallel import ParallelDims, build_meshes, init_distributed
from rlcore.engine import RolloutEngine
from rlcore.models import build as models
from rlcore.rollout import continuous
from rlcore.rollout.envs import make_envs
from rlcore.rollout.turns import Trajectory, rollout, to_batch
from rlcore.tasks.calculator import CalculatorEnv


class Recorder:
    """The engine's request-by-request calls, passed through and written down."""

    def __init__(self, engine):
        self.engine, self.log = engine, []

    def submit(self, rid, prompt, max_tokens, temperature, seed, stop_token_ids=None):
        self.log.append(["add", rid, list(prompt), max_tokens, seed])
        self.engine.submit(rid, prompt, max_tokens, temperature, seed, stop_token_ids)

    def step(self):
        out = self.engine.step()
        self.log.append(["step", [rid for rid, _ in out]])
        return out

    def busy(self):
        return self.engine.busy()

    def abort(self, rids):
        if rids:
            self.log.append(["abort", list(rids)])
        self.engine.abort(rids)


class Latency:
    """Answers "+-" after a seeded 2-20 ms; ends after 2, 3 or 4 turns depending on the trajectory."""
    max_turns = 4

    def __init__(self, row):
        self.row, self.turn = row, 0

    def step(self, action, action_ids):
        i, j = self.row["i"], self.row["j"]
        pause = self.pause(i, j)
        time.sleep(pause if pause is not None else 0.002 * 10 ** random.Random(i * 100 + j * 10 + self.turn).random())
        self.turn += 1
        return "+-", 0.25, self.turn == 2 + (i + j) % 3

    def pause(self, i, j):
        return None


class Stuck(Latency):
    def pause(self, i, j):
        return 30.0 if (i, j, self.turn) == (0, 0, 1) else None


model_dir, out = sys.argv[1], sys.argv[2]
init_distributed()
cfg = Config(model=ModelConfig(path=model_dir), data=DataConfig(max_prompt_tokens=8),
             rollout=RolloutConfig(tensor_parallel=2, cpu_kv_cache_gb=0.25, max_new_tokens=3, max_total_tokens=40,
                                   env=Latency, temperature=1.0))
dims = ParallelDims(dist.get_world_size(), 2)
fsdp_mesh, rollout_mesh = build_meshes(dims)
tp_rank, tp_group = rollout_mesh.get_local_rank("tp"), rollout_mesh.get_group("tp")
engine = RolloutEngine(cfg, max_model_len=48)
policy = models.shard(models.load_causal_lm(cfg.model), fsdp_mesh, cfg.model)
from transformers import AutoTokenizer  # noqa: E402

tokenizer = AutoTokenizer.from_pretrained(model_dir)


def trajectories(prompts, G):
    rows = [{"prompt": p, "prompt_ids": tokenizer(p).input_ids, "i": i} for i, p in enumerate(prompts)]
    share = len(rows) // 2
    return [Trajectory(r["prompt_ids"], r | {"j": j}, seed=1000 * i + j, owner=i // share)
            for i, r in enumerate(rows) for j in range(G)]


def checks(trajs, max_total):
    """Per-trajectory structure, and the largest |engine - trainer| logprob over this rank's model tokens."""
    mine = [x for x in trajs if x.owner == tp_rank]
    batch = to_batch(mine, 0, 1, 12)
    with torch.no_grad():
        trainer = models.token_logprobs(policy, batch.input_ids, batch.attention_mask, 1.0)
    return {"diff": ((trainer - batch.rollout_logprobs).abs() * batch.loss_mask).max().item(),
            "ends_on_model": all(x.sampled[-1] == 1 for x in trajs if x.tokens),
            "mask_is_sampled": batch.loss_mask.sum().item() == sum(x.model_tokens for x in mine),
            "within_budget": all(len(x.tokens) <= max_total for x in trajs),
            "tokens": [x.tokens for x in trajs], "sampled": [x.sampled for x in trajs],
            "turns": [len(x.turns) for x in trajs], "truncated": [x.truncated for x in trajs],
            "rewards": [x.env_reward for x in trajs]}


prompts = ["12+", "3", "45=", "6", "7+8", "9", "10=", "2"]
result = {}
for name, env, deadline in (("latency", Latency, 0.0), ("deadline", Stuck, 4.0)):  # 4 s: room on a loaded machine
    cfg.rollout.env = env
    envs = make_envs(cfg, tokenizer, {"i": 0, "j": 0}, vocab_size=32)
    rec, trajs = Recorder(engine), trajectories(prompts, 2)
    t = time.perf_counter()
    stats = continuous.rollout(rec, trajs, envs, 3, 40, 1.0, tp_rank, tp_group, step_deadline_s=deadline)
    result[name] = checks(trajs, 40) | {
        "seconds": time.perf_counter() - t, "calls": rec.log, "ticks": stats.ticks, "idle_frac":
        stats.idle_s / stats.rollout_s, "deadline_truncated": stats.deadline_truncated, "env_calls": stats.env_calls}

# The calculator's tool on the random model: "?" ends a turn and calls it (stop token), EOS answers.
cfg.rollout.env, cfg.rollout.max_new_tokens, cfg.rollout.max_total_tokens = CalculatorEnv, 5, 16
calc = ["12+34=", "5+6=", "47+38=", "9+90="]
envs = make_envs(cfg, tokenizer, {"prompt": calc[0]}, vocab_size=32)
lock = trajectories(calc, 4)
rollout(engine, lock, envs, 5, 16, 4, 1.0, tp_rank, tp_group)
rec, cont = Recorder(engine), trajectories(calc, 4)
continuous.rollout(rec, cont, envs, 5, 16, 1.0, tp_rank, tp_group)
observations = [tokenizer.decode([t for t, s in zip(x.tokens, x.sampled) if not s]) for x in cont]
result["calculator"] = checks(cont, 16) | {"calls": rec.log, "lockstep": checks(lock, 16),
                                           "observations": observations}

everything = [None] * dist.get_world_size()
dist.all_gather_object(everything, result)
if dist.get_rank() == 0:
    json.dump(everything, open(out, "w"))
print(f"rank {dist.get_rank()}: latency {result['latency']['seconds']:.2f}s, deadline "
      f"{result['deadline']['seconds']:.2f}s, diffs {[result[k]['diff'] for k in result]}", flush=True)
